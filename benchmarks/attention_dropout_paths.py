"""Which attention kernel path a BERT layer with attention dropout should take on a GPU: one timed comparison.

BERT-family checkpoints train with attention dropout (0.1). torch's `varlen_attn` has no dropout, so without the
flash-attn package `auto` sends those layers to SDPA over rows with block-diagonal masks, which rules out SDPA's
flash kernel; the first GPU check measured bertforge's bert-base step at 0.44x HF's there, before the masked calls
were kept to the memory-efficient kernel, and 0.98-1.08x after (docs/scaling.md). This
times forward + backward of one attention call on packed sequences of unequal lengths, per path:

- `rows+mask`: today's `sdpa` backend (`PackedAttention._sdpa`, with dropout);
- `nested`: SDPA on a jagged nested tensor (`torch.nested.nested_tensor_from_jagged`), with dropout: no mask, so
  SDPA may take its flash kernel, which has dropout;
- `varlen`: `varlen_attn` without dropout, the ceiling (CUDA only);
- `padded+mask`: one sequence per row and a key-padding mask, as HF's SDPA path does, with dropout.

With dropout 0 each path's output is compared with eager attention (max abs error), so a fast path is also a right
one. On a CPU it runs with tiny shapes (the code paths only):

    python3 benchmarks/attention_dropout_paths.py --out runs/attention_dropout_paths.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from bertforge.models.attention import PackedAttention, eager_attention  # noqa: E402

DROPOUT = 0.1


def lengths_for(max_len: int, sequences: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(max(4, max_len // 8), max_len + 1, (sequences,), generator=generator).tolist()


def nested_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     dropout_p: float) -> torch.Tensor:
    offsets = cu_seqlens.long()
    rows = [torch.nested.nested_tensor_from_jagged(x, offsets=offsets).transpose(1, 2) for x in (query, key, value)]
    return F.scaled_dot_product_attention(*rows, dropout_p=dropout_p).transpose(1, 2).values()


def padded_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     dropout_p: float) -> torch.Tensor:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    width = max(lengths)
    slots = torch.cat([torch.arange(length, device=query.device) + row * width for row, length in enumerate(lengths)])
    heads, head_dim = query.shape[1:]

    def to_rows(x: torch.Tensor) -> torch.Tensor:
        rows = x.new_zeros(len(lengths) * width, heads, head_dim).index_copy(0, slots, x)
        return rows.view(len(lengths), width, heads, head_dim).transpose(1, 2)

    keep = torch.zeros(len(lengths) * width, dtype=torch.bool, device=query.device)
    keep[slots] = True
    mask = keep.view(len(lengths), 1, 1, width)
    output = F.scaled_dot_product_attention(to_rows(query), to_rows(key), to_rows(value), attn_mask=mask,
                                            dropout_p=dropout_p)
    return output.transpose(1, 2).reshape(len(lengths) * width, heads, head_dim).index_select(0, slots)


def paths(device: torch.device) -> dict[str, Callable[..., torch.Tensor]]:
    chosen: dict[str, Callable[..., torch.Tensor]] = {
        "rows+mask": lambda q, k, v, cu, m, p: PackedAttention(cu, m, "sdpa").attend(q, k, v, dropout_p=p),
        "nested": lambda q, k, v, cu, m, p: nested_attention(q, k, v, cu, p),
        "padded+mask": lambda q, k, v, cu, m, p: padded_attention(q, k, v, cu, p),
    }
    if device.type == "cuda":
        chosen["varlen (no dropout)"] = lambda q, k, v, cu, m, p: PackedAttention(cu, m, "varlen").attend(q, k, v)
    return chosen


def time_path(run: Callable[[], torch.Tensor], grad: torch.Tensor, leaves: list[torch.Tensor], device: torch.device,
              repeats: int) -> float:
    def step() -> None:
        for leaf in leaves:
            leaf.grad = None
        run().backward(grad)

    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def measure(device: torch.device, dtype: torch.dtype, max_len: int, sequences: int, heads: int, head_dim: int,
            repeats: int) -> dict[str, object]:
    lengths = lengths_for(max_len, sequences)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    tokens = sum(lengths)
    generator = torch.Generator().manual_seed(1)
    base = [torch.randn(tokens, heads, head_dim, generator=generator).to(device, dtype) for _ in range(3)]
    grad = torch.randn(tokens, heads, head_dim, generator=generator).to(device, dtype)
    reference = eager_attention(*(x.float() for x in base), cu_seqlens)
    results: dict[str, object] = {"max_len": max_len, "sequences": sequences, "tokens": tokens, "heads": heads,
                                  "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."), "paths": {}}
    for name, path in paths(device).items():
        leaves = [x.clone().requires_grad_() for x in base]
        try:
            with torch.no_grad():
                error = (path(*base, cu_seqlens, max_len, 0.0).float() - reference).abs().max().item()
            seconds = time_path(lambda p=path, ls=leaves: p(*ls, cu_seqlens, max_len, DROPOUT), grad, leaves, device,
                                repeats)
            entry: dict[str, object] = {"ms": round(seconds * 1e3, 3), "tokens_per_s": round(tokens / seconds),
                                        "max_abs_error_no_dropout": error}
        except Exception as failure:  # noqa: BLE001 - a path this torch lacks is a finding, not the end
            entry = {"error": f"{type(failure).__name__}: {str(failure).splitlines()[0][:300]}"}
        results["paths"][name] = entry  # type: ignore[index]
        print(f"seq {max_len:>4} {name:>20}: {entry}", flush=True)
    return results


def sdpa_backends_on_changing_shapes(device: torch.device, dtype: torch.dtype, batches: int, sequences: int,
                                     max_len: int, heads: int, head_dim: int) -> dict[str, object]:
    """SDPA over rows with block-diagonal masks and dropout, as `PackedAttention._sdpa` calls it, restricted to each
    of SDPA's backends in turn, on batches whose lengths (so shapes) change every call, as a fine-tune's do; and
    the same batch repeated. "default" is SDPA's own choice, timed first (after one warm-up call)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator().manual_seed(2)
    inputs = []
    for _ in range(batches):
        lengths = torch.randint(5, max_len + 1, (sequences,), generator=generator).tolist()
        cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        attention = PackedAttention(cu_seqlens, max(lengths), "sdpa")
        rows = [torch.randn(attention.placement.num_rows, heads, attention.placement.row_length, head_dim,
                            generator=generator).to(device, dtype) for _ in range(3)]
        inputs.append((rows, attention._boolean_mask(None)))  # noqa: SLF001 - the mask the backend builds
    choices: dict[str, list[SDPBackend] | None] = {"default": None, "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                                                   "math": [SDPBackend.MATH]}
    if device.type == "cuda":
        choices["cudnn"] = [SDPBackend.CUDNN_ATTENTION]
    results: dict[str, object] = {"batches": batches, "sequences": sequences, "max_len": max_len, "heads": heads,
                                  "head_dim": head_dim}
    for name, backends in choices.items():
        def call(rows: list[torch.Tensor], mask: torch.Tensor | None, backends: list[SDPBackend] | None = backends
                 ) -> None:
            leaves = [x.clone().requires_grad_() for x in rows]
            if backends is None:
                output = F.scaled_dot_product_attention(*leaves, attn_mask=mask, dropout_p=DROPOUT)
            else:
                with sdpa_kernel(backends):
                    output = F.scaled_dot_product_attention(*leaves, attn_mask=mask, dropout_p=DROPOUT)
            output.sum().backward()

        try:
            timings = {}
            for label, sequence in (("changing", inputs), ("repeated", [inputs[0]] * len(inputs))):
                call(*inputs[-1])  # one warm-up on a shape the timed calls do not use
                if device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                for rows, mask in sequence:
                    call(rows, mask)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                timings[f"{label}_ms_per_call"] = round((time.perf_counter() - started) / len(sequence) * 1e3, 3)
            entry: dict[str, object] = timings
        except Exception as failure:  # noqa: BLE001 - a backend that refuses these inputs is a finding
            entry = {"error": f"{type(failure).__name__}: {str(failure).splitlines()[0][:300]}"}
        results[name] = entry
        print(f"changing shapes, {name:>9}: {entry}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON report")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    # bert-base's heads; on a CPU tiny shapes, to run the code paths only
    shapes = [(128, 256, 12, 64, 30), (512, 64, 12, 64, 30)] if cuda else [(32, 4, 2, 16, 2)]
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "dropout": DROPOUT,
              # a bert-mini fine-tune's batches (supersense glosses: 128 sequences of 5-60 tokens, 4 heads of 64)
              "changing_shapes": sdpa_backends_on_changing_shapes(device, dtype, *((20, 128, 60, 4, 64) if cuda
                                                                                   else (3, 4, 12, 2, 16))),
              "runs": [measure(device, dtype, *shape) for shape in shapes]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
