"""Process groups and parallelism wrappers, applied to a model from the outside (torchtitan's lesson).

The model code knows nothing of DDP, ZeRO or FSDP: `parallelize` wraps a built model according to
`dist.*`. `torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK; without them we run one process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from bertforge.config import DistSection
from bertforge.console import log
from bertforge.errors import ConfigError, first_line


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device_request: str) -> tuple[DistEnv, torch.device]:
    """Join the torchrun process group (NCCL on GPUs, gloo on CPU) and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_request == "auto":
        device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    elif device_request == "cuda":
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device(device_request)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"`run.device` is {device_request!r} but no CUDA GPU is visible; use run.device=cpu")
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if restart is None:
            dist.init_process_group(backend=backend)
        else:
            # After `torchrun --max-restarts` restarts the workers, the rendezvous store still holds
            # the previous attempt's gloo addresses under the same keys and rank 0 would dial a dead
            # worker; a prefix per attempt keeps the attempts apart.
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                  is_master=False, use_libuv=True)
            dist.init_process_group(backend=backend, store=dist.PrefixStore(f"bertforge/attempt-{restart}", store),
                                    rank=rank, world_size=world_size)
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank), device


SHUTDOWN_WAIT = timedelta(minutes=5)


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        # FSDP2 on gloo: without this barrier a rank can abort while its peer still talks to it
        dist.barrier()
        _wait_until_every_rank_left_the_barrier()
        dist.destroy_process_group()


def _wait_until_every_rank_left_the_barrier() -> None:
    """A fast rank can return from the barrier while its peer still waits for the barrier's last message;
    if the fast rank then closes its gloo connections, the peer's gloo thread meets a closed connection in the
    middle of a collective and the process aborts (SIGABRT after a finished run, seen about once in three
    full test runs on loaded cores). The rendezvous store answers each request before the next, so once every
    rank has checked in there, no collective is in flight and any rank may close its connections."""
    store = dist.distributed_c10d._get_default_store()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    store.set(f"bertforge/left-barrier/{rank}", "1")
    try:
        store.wait([f"bertforge/left-barrier/{other}" for other in range(world_size)], SHUTDOWN_WAIT)
    except (RuntimeError, dist.DistError) as error:  # a peer died after the barrier: nothing left to protect
        log.debug(f"shutdown: not every rank checked in ({first_line(error)}); closing anyway")


def all_reduce_sum(values: list[float], env: DistEnv, device: torch.device) -> list[float]:
    if not env.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


class _GatherRows(torch.autograd.Function):
    """all_gather along dim 0 (ranks may hold different row counts) whose backward returns this rank's
    rows of the incoming gradient only: right when every rank computes the same loss from the gathered
    rows, since rank r's rows then get dL/d(rows_r) on rank r with no further communication."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:  # type: ignore[override]
        sizes = [torch.zeros(1, dtype=torch.int64, device=local.device) for _ in range(world_size)]
        dist.all_gather(sizes, torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device))
        counts = [int(size.item()) for size in sizes]
        padded = local.new_zeros((max(counts), *local.shape[1:]))
        padded[:local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(world_size)]
        dist.all_gather(parts, padded.contiguous())
        ctx.start, ctx.count = sum(counts[:rank]), counts[rank]
        return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return grad[ctx.start:ctx.start + ctx.count], None, None


def all_gather_rows(local: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Every rank's rows of `local`, concatenated in rank order; the gradient flows back to this rank's rows."""
    if not env.distributed:
        return local
    return _GatherRows.apply(local, env.world_size, env.rank)  # type: ignore[no-any-return]


def any_rank(flag: bool, env: DistEnv, device: torch.device) -> bool:
    """True on every rank if it is true on any rank: keeps NaN and stop decisions agreed."""
    if not env.distributed:
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


# Gloo reports a dead or unreachable peer as a plain RuntimeError raised in its TCP transport;
# NCCL and the rendezvous store raise torch.distributed.DistError subclasses.
GLOO_TRANSPORT_MARK = "gloo/transport"


def describe_peer_failure(error: BaseException) -> str | None:
    """One line for a collective that failed because another process of the job went away, else None.

    Not a bug in bertforge nor a mistake in the input: the other rank's own output says why it
    stopped, and the run resumes from its last complete checkpoint.
    """
    if not (isinstance(error, dist.DistError) or GLOO_TRANSPORT_MARK in str(error)):
        return None
    rank = os.environ.get("RANK", "?")
    cause = first_line(error).split(". ")[0]  # gloo goes on with advice and emoji after its first sentence
    return (f"rank {rank} lost its connection to another process of this job ({cause}): a peer "
            "died or the network failed; its own output says why. Run the same command again to resume from "
            "the last checkpoint (run.resume=auto), or launch with torchrun --max-restarts=N to recover "
            "automatically")


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def apply_activation_checkpointing(layers: Sequence[nn.Module]) -> None:
    """Recompute each layer's activations in backward: memory O(layers) -> O(1) layer's activations."""
    from torch.utils.checkpoint import checkpoint

    for layer in layers:
        original_forward = layer.forward

        def checkpointed(*args: object, _forward=original_forward, **kwargs: object) -> object:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        layer.forward = checkpointed  # type: ignore[method-assign]


def parallelize(model: nn.Module, layers: Sequence[nn.Module], section: DistSection, env: DistEnv,
                device: torch.device, param_dtype: torch.dtype | None) -> nn.Module:
    """Wrap the model for the chosen strategy; returns the module to call in the training loop."""
    if section.activation_checkpointing:
        if not layers:
            log.warning("dist.activation_checkpointing is on but the model has no `layers` blocks; ignored")
        apply_activation_checkpointing(layers)
    if section.compile:
        from bertforge.models.compile_boundaries import apply_compile_boundaries

        apply_compile_boundaries()
        model = torch.compile(model, backend=section.compile_backend)  # type: ignore[assignment]
    if not env.distributed or section.strategy == "none":
        return model
    if section.strategy in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if section.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (env.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
            MixedPrecisionPolicy()
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    raise AssertionError(f"unhandled strategy {section.strategy}")


def no_sync(model: nn.Module, last_micro_batch: bool) -> AbstractContextManager[object]:
    """Skip the gradient all-reduce on all but the last micro-batch of a step (DDP / ZeRO-1)."""
    if last_micro_batch:
        return nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()  # type: ignore[no-any-return]
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        return _ResumeGradientSync(model)
    return nullcontext()


class _ResumeGradientSync:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)  # type: ignore[operator]


def is_fsdp(model: nn.Module) -> bool:
    """Whether FSDP2 sharded the model: its state must then go through DCP / full-state gathers."""
    return any(type(module).__name__.startswith("FSDP") for module in model.modules())


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / torch.compile wrappers."""
    inner = getattr(model, "module", model)
    return getattr(inner, "_orig_mod", inner)
