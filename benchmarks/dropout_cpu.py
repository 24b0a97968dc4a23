"""Dropout on CPU: `torch.nn.functional.dropout` vs `bertforge.models.dropout`, forward + backward.

The shapes are those of one bert-base training step in `benchmarks/model_step.py` (1,818 tokens):
a hidden state [1818, 768] (two per layer, after attention and after the MLP) and the attention
probabilities of 15 rows of 128 slots, 12 heads [15, 12, 128, 128] (one per layer). Each variant
is timed alternately, best of `--repeats`, on the threads given; the table goes to stdout.

    .venv/bin/python benchmarks/dropout_cpu.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bertforge.models.dropout import dropout

SHAPES = {"hidden state [1818, 768]": (1818, 768), "attention probabilities [15, 12, 128, 128]": (15, 12, 128, 128)}


def forward_backward(function: Callable[[torch.Tensor, float], torch.Tensor], x: torch.Tensor,
                     upstream: torch.Tensor, p: float) -> Callable[[], None]:
    def step() -> None:
        x.grad = None
        function(x, p).backward(upstream)

    return step


def best_ms(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    best = dict.fromkeys(steps, float("inf"))
    for step in steps.values():
        step()  # warm-up
    for _ in range(repeats):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: seconds * 1e3 for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    torch.manual_seed(0)
    print(f"## Dropout p={arguments.p}, forward + backward, fp32, CPU, {arguments.threads} threads, "
          f"best of {arguments.repeats}\n")
    print("| tensor | F.dropout (ms) | bertforge (ms) | speed-up |")
    print("|---|---:|---:|---:|")
    for name, shape in SHAPES.items():
        x = torch.randn(shape, requires_grad=True)
        upstream = torch.randn(shape)
        times = best_ms({"torch": forward_backward(lambda t, p: F.dropout(t, p), x, upstream, arguments.p),
                         "ours": forward_backward(dropout, x, upstream, arguments.p)}, arguments.repeats)
        print(f"| {name} | {times['torch']:.2f} | {times['ours']:.2f} | {times['torch'] / times['ours']:.2f}× |")


if __name__ == "__main__":
    main()
