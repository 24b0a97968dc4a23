"""Which attention kernel runs where, and the arguments of the GPU kernels: all checked on a CPU.

The choice is a pure function of (requested backend, device type, dtype, dropout, ALiBi, window,
head size, what is installed, GPU capability); every combination is enumerated here. The kernels'
argument contracts are checked by binding to `inspect.signature(varlen_attn)` and to flash-attn's
documented signature.
"""

from __future__ import annotations

import inspect
import itertools
import logging

import pytest
import torch
from helpers.models import packed_batch, tiny_config

from bertforge.errors import BertforgeError, ConfigError
from bertforge.models import BertforgeModel, EncoderConfig
from bertforge.models.attention import log_fallback_once
from bertforge.models.attention_backends import (
    FLASH_ATTN_VARLEN_SIGNATURE,
    AvailableKernels,
    BackendChoice,
    LayerNeeds,
    available_kernels,
    choose_backend,
    flash_attn_arguments,
    varlen_attn_arguments,
)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CAPABILITIES = {"cpu": (None,), "cuda": ((9, 0), (8, 0), (7, 5))}


def every_combination() -> list[tuple[LayerNeeds, AvailableKernels]]:
    combinations = []
    for device_type in ("cpu", "cuda"):
        for dtype, dropout_p, alibi, window, head_dim, torch_varlen, flash_attn, capability in itertools.product(
                DTYPES, (0.0, 0.1), (False, True), (None, 64), (64, 36), (True, False), (True, False),
                CAPABILITIES[device_type]):
            combinations.append((LayerNeeds(device_type, dtype, dropout_p, alibi, window, head_dim),
                                 AvailableKernels(torch_varlen, flash_attn, capability)))
    return combinations


def flash_kernels_can_run(needs: LayerNeeds, kernels: AvailableKernels) -> bool:
    return (needs.device_type == "cuda" and kernels.gpu_capability is not None and kernels.gpu_capability >= (8, 0)
            and needs.dtype in (torch.bfloat16, torch.float16) and needs.head_dim % 8 == 0)


def varlen_can_express(needs: LayerNeeds, kernels: AvailableKernels) -> bool:
    return (kernels.torch_varlen and not needs.alibi and needs.dropout_p == 0
            and flash_kernels_can_run(needs, kernels))


def flash_attn_can_run(needs: LayerNeeds, kernels: AvailableKernels) -> bool:
    return kernels.flash_attn and flash_kernels_can_run(needs, kernels)


def test_auto_picks_varlen_on_a_gpu_whenever_it_can_express_the_layer_then_flash_attn_then_sdpa() -> None:
    combinations = every_combination()
    assert len(combinations) == 3 * 2 * 2 * 2 * 2 * 2 * 2 * (1 + 3)  # dtypes × switches × (CPU + 3 GPUs)
    for needs, kernels in combinations:
        choice = choose_backend("auto", needs, kernels)
        if needs.device_type == "cpu":
            expected = "sdpa"
        elif varlen_can_express(needs, kernels):
            expected = "varlen"
        elif flash_attn_can_run(needs, kernels):
            expected = "flash"
        else:
            expected = "sdpa"
        assert choice.backend == expected, (needs, kernels, choice)
        # a GPU layer that does not get PyTorch's kernel is a fallback, logged with its reason
        assert choice.fallback == (needs.device_type == "cuda" and expected != "varlen"), (needs, kernels)
        assert choice.reason and "\n" not in choice.reason


@pytest.mark.parametrize("requested, can_run", [("varlen", varlen_can_express), ("flash", flash_attn_can_run)])
def test_a_requested_gpu_kernel_runs_where_it_can_and_is_refused_in_one_line_naming_the_key_elsewhere(
        requested: str, can_run: object) -> None:
    for needs, kernels in every_combination():
        if can_run(needs, kernels):  # type: ignore[operator]
            assert choose_backend(requested, needs, kernels).backend == requested
            continue
        with pytest.raises(BertforgeError) as error:
            choose_backend(requested, needs, kernels)
        message = str(error.value)
        assert message.startswith(f"model.attention_backend={requested} cannot run here: ")
        assert "\n" not in message and message.endswith("set model.attention_backend=auto")


@pytest.mark.parametrize("requested", ["sdpa", "eager"])
def test_sdpa_and_eager_run_everywhere(requested: str) -> None:
    for needs, kernels in every_combination():
        assert choose_backend(requested, needs, kernels) == BackendChoice(
            requested, f"requested (model.attention_backend={requested})")


GPU = AvailableKernels(torch_varlen=True, flash_attn=False, gpu_capability=(9, 0))


@pytest.mark.parametrize("needs, kernels, backend, reason", [
    (LayerNeeds("cuda", torch.bfloat16, 0.0, False, 64, 64), GPU, "varlen",
     "PyTorch's varlen_attn on the packed tokens"),
    (LayerNeeds("cuda", torch.bfloat16, 0.0, True, None, 64), GPU, "sdpa",
     "SDPA with masks, because varlen_attn has no ALiBi bias, and the flash-attn package is not installed "
     "(pip install 'bertforge[flash]')"),
    (LayerNeeds("cuda", torch.bfloat16, 0.1, False, None, 64), AvailableKernels(True, True, (8, 0)), "flash",
     "flash-attn, because varlen_attn has no attention dropout (model.attention_dropout > 0 while training; "
     "set model.attention_dropout=0 to use it)"),
    (LayerNeeds("cuda", torch.bfloat16, 0.1, False, None, 64), GPU, "sdpa",
     "SDPA with masks, because varlen_attn has no attention dropout (model.attention_dropout > 0 while "
     "training; set model.attention_dropout=0 to use it), and the flash-attn package is not installed "
     "(pip install 'bertforge[flash]')"),
    (LayerNeeds("cuda", torch.float32, 0.0, False, None, 64), GPU, "sdpa",
     "SDPA with masks, because FlashAttention runs in bf16/fp16 only, the attention inputs are float32 (set "
     "train.precision=bf16), and the flash-attn package is not installed (pip install 'bertforge[flash]')"),
    (LayerNeeds("cuda", torch.float16, 0.0, False, None, 64), AvailableKernels(True, True, (7, 0)), "sdpa",
     "SDPA with masks, because FlashAttention needs compute capability 8.0+ (Ampere or newer); this GPU has 7.0"),
    (LayerNeeds("cuda", torch.bfloat16, 0.0, False, None, 64), AvailableKernels(False, True, (8, 0)), "flash",
     f"flash-attn, because this torch ({torch.__version__}) has no torch.nn.attention.varlen (2.10+ has it)"),
    (LayerNeeds("cpu", torch.float32, 0.1, True, 3, 64), AvailableKernels(True, True, None), "sdpa",
     "cpu: SDPA over rows with block-diagonal masks (the FlashAttention kernels are CUDA-only)"),
])
def test_each_choice_says_why(needs: LayerNeeds, kernels: AvailableKernels, backend: str, reason: str) -> None:
    choice = choose_backend("auto", needs, kernels)
    assert (choice.backend, choice.reason) == (backend, reason)


def test_this_machine_offers_torch_varlen_but_no_gpu_kernel() -> None:
    kernels = available_kernels(torch.device("cpu"))
    assert kernels.torch_varlen and kernels.gpu_capability is None
    assert choose_backend("auto", LayerNeeds("cpu", torch.float32, 0.0, False, None, 64), kernels).backend == "sdpa"


def test_a_fallback_is_logged_once_and_the_cpu_default_not_at_all(caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("bertforge")
    monkeypatch.setattr(logger, "propagate", False)  # as under the CLI; the records reach caplog once
    logger.addHandler(caplog.handler)
    try:
        fallback = BackendChoice("sdpa", "SDPA with masks, because of a reason unique to this test", fallback=True)
        for _ in range(3):
            log_fallback_once(fallback)
            log_fallback_once(BackendChoice("sdpa", "cpu: SDPA over rows"))
    finally:
        logger.removeHandler(caplog.handler)
    assert [record.getMessage() for record in caplog.records] == [
        "attention: sdpa instead of varlen_attn: SDPA with masks, because of a reason unique to this test"]


def packed_qkv(lengths: list[int], heads: int = 4, head_dim: int = 16) -> tuple[torch.Tensor, ...]:
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])  # int64: the kernel wants int32
    return (*(torch.randn(sum(lengths), heads, head_dim) for _ in range(3)), cu_seqlens)


@pytest.mark.parametrize("window, expected_window", [(None, (-1, -1)), (5, (5, 5))])
def test_varlen_attn_arguments_bind_to_its_signature_with_int32_boundaries_and_the_head_scale(
        window: int | None, expected_window: tuple[int, int]) -> None:
    from torch.nn.attention.varlen import varlen_attn

    query, key, value, cu_seqlens = packed_qkv([7, 3, 9])
    args, kwargs = varlen_attn_arguments(query, key, value, cu_seqlens, torch.tensor(9), window)
    bound = inspect.signature(varlen_attn).bind(*args, **kwargs).arguments
    assert bound["query"] is query and bound["key"] is key and bound["value"] is value  # [tokens, heads, dim]
    for name in ("cu_seq_q", "cu_seq_k"):
        assert bound[name].dtype == torch.int32 and bound[name].tolist() == [0, 7, 10, 19]
    assert bound["max_q"] == bound["max_k"] == 9 and type(bound["max_q"]) is int
    assert bound["scale"] == pytest.approx(16 ** -0.5)
    assert bound["window_size"] == expected_window and isinstance(bound["window_size"], tuple)


@pytest.mark.parametrize("alibi", [False, True])
def test_flash_attn_arguments_bind_to_its_documented_signature(alibi: bool) -> None:
    query, key, value, cu_seqlens = packed_qkv([4, 6])
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.bfloat16) if alibi else None
    args, kwargs = flash_attn_arguments(query, key, value, cu_seqlens, 6, 2, slopes, 0.1)
    bound = FLASH_ATTN_VARLEN_SIGNATURE.bind(*args, **kwargs).arguments
    assert bound["cu_seqlens_q"].dtype == bound["cu_seqlens_k"].dtype == torch.int32
    assert bound["max_seqlen_q"] == bound["max_seqlen_k"] == 6
    assert bound["softmax_scale"] == pytest.approx(0.25) and bound["causal"] is False
    assert bound["window_size"] == (2, 2) and bound["dropout_p"] == 0.1
    if alibi:
        assert bound["alibi_slopes"].dtype == torch.float32 and bound["alibi_slopes"].shape == (4,)
    else:
        assert bound["alibi_slopes"] is None


def test_the_documented_flash_attn_signature_matches_the_installed_package() -> None:
    flash_attn = pytest.importorskip("flash_attn", reason="flash-attn is optional (CUDA machines)")
    installed = inspect.signature(flash_attn.flash_attn_varlen_func).parameters
    assert list(installed)[:len(FLASH_ATTN_VARLEN_SIGNATURE.parameters)] == list(FLASH_ATTN_VARLEN_SIGNATURE.parameters)


def test_the_gpu_backends_are_refused_on_a_cpu_in_one_line_at_the_first_forward() -> None:
    for backend in ("varlen", "flash"):
        model = BertforgeModel(tiny_config(attention_backend=backend)).eval()
        with pytest.raises(BertforgeError, match=f"^model.attention_backend={backend} cannot run here: "):
            model(**packed_batch([5, 3]))


def test_varlen_with_alibi_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="`attention_backend` is 'varlen', which has no ALiBi bias"):
        EncoderConfig(attention_backend="varlen", position="alibi")


def test_every_backend_is_a_valid_run_config_choice() -> None:
    """The run config and the model config accept the same backends (varlen was refused by the former)."""
    from bertforge.config import load_config
    from bertforge.models.config import ATTENTION_BACKENDS

    for backend in ATTENTION_BACKENDS:
        assert load_config(None, [f"model.attention_backend={backend}"]).model.attention_backend == backend
