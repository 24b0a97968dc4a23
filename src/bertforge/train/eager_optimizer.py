"""Optimizers that do their bookkeeping without importing `torch._dynamo`, for runs that compile nothing.

torch wraps `Optimizer.add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` in `torch._disable_dynamo`
and every built-in `step` in `_use_grad_for_differentiable`. Both import `torch._dynamo` on their first call (building
the optimizer is the first), only so that a `torch.compile`d function calling them graph-breaks there. That import
costs about 1.4 s of CPU on these cores, paid by every `finetune`/`pretrain` process and every torchrun rank, though
bertforge compiles only with `dist.compile=true` and never calls the optimizer inside a compiled region. (Ranks
under DDP still pay it: torch 2.13's `DistributedDataParallel.__init__` reads a `torch._dynamo` setting.)

`eager_optimizer_class(AdamW)` is a subclass of the same name whose methods call the functions torch wraps directly,
`step` under the grad mode `_use_grad_for_differentiable` sets (`defaults["differentiable"]`, False for ours). Eager
calls run exactly the same code; only a caller under `torch.compile` would see a difference, which is why the
trainer uses it only when the run does not compile. A method the torch in use does not wrap that way is left as it
is (tests/test_process_floors.py then fails: the run imports `torch._dynamo` again).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import Optimizer, _use_grad_for_differentiable

BOOKKEEPING_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _wrapper_code(decorator: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
    """The code object every wrapper `decorator` makes shares: how a wrapped function is recognised."""
    return decorator(lambda *args: None).__code__


_DISABLE_DYNAMO = _wrapper_code(torch._disable_dynamo)
_USE_GRAD = _wrapper_code(_use_grad_for_differentiable)
_PROFILE_HOOK = _wrapper_code(Optimizer.profile_hook_step)  # torch's own layer over `step` (profiler, step hooks)


def _unwrapped(method: Callable[..., Any], wrapper_code: Any) -> Callable[..., Any] | None:
    """The function inside `method`'s wrapper with `wrapper_code` (looking through the profiler's step hook),
    or None when `method` has no such wrapper."""
    function: Any = method
    while True:
        if function.__code__ is wrapper_code:
            return function.__wrapped__
        if function.__code__ is not _PROFILE_HOOK:
            return None
        function = function.__wrapped__


@functools.cache
def eager_optimizer_class(optimizer_class: type[Optimizer]) -> type[Optimizer]:
    """`optimizer_class` with its bookkeeping methods and `step` unwrapped from torch's dynamo guards."""
    methods: dict[str, Any] = {"__module__": optimizer_class.__module__, "__qualname__": optimizer_class.__qualname__,
                               "__doc__": optimizer_class.__doc__}
    for name in BOOKKEEPING_METHODS:
        function = _unwrapped(getattr(optimizer_class, name), _DISABLE_DYNAMO)
        if function is not None:
            methods[name] = function
    step = _unwrapped(optimizer_class.step, _USE_GRAD)
    if step is not None:
        methods["step"] = _step_in_grad_mode(step)
    return type(optimizer_class.__name__, (optimizer_class,), methods)


def _step_in_grad_mode(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def eager_step(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, *args, **kwargs)

    return eager_step
