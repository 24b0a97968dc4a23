"""The inference engine against the loop it replaced, and its token budget: texts/s of `embed` on real glosses.

all-MiniLM-L6-v2 embeds 1,500 supersense glosses (bundled, real WordNet text) on 2 threads:
- `previous`: the loop `embed_texts` ran before the engine (every text tokenized up front, then 64 texts
  per unpadded batch in input order), rebuilt here from the same library parts;
- the engine at each `--budgets` token budget, with `--batch-size` 64 (the default) and with no count cap.
Each configuration is timed once per run, tokenization included; run it twice on a shared machine and report
both. The largest difference of the engine's vectors from the previous loop's is printed too.

    .venv/bin/python benchmarks/engine_budget.py
    .venv/bin/python benchmarks/engine_budget.py --budgets 2048 8192 --texts 3000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from bertforge.batch import model_inputs
from bertforge.data.pairs import TokenizedTexts, texts_batch
from bertforge.embed import Embedder, embed_run, load_embedder
from bertforge.engine import EngineSettings
from bertforge.inference import read_inputs

NO_CAP = 10**9


@torch.inference_mode()
def previous_loop(embedder: Embedder, texts: list[str], batch_size: int = 64) -> np.ndarray:
    tokenized = TokenizedTexts(texts, embedder.tokenizer, embedder.max_length)
    vectors = np.zeros((len(texts), embedder.model.config.hidden_size), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        end = min(start + batch_size, len(texts))
        batch = texts_batch([tokenized[i] for i in range(start, end)])
        vectors[start:end] = embedder.model(**model_inputs(batch)).float().numpy()
    return vectors


def timed(run: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = run()
    return time.perf_counter() - started, vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--texts", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = read_inputs("bundled:supersense/train").texts[:args.texts]
    embedder = load_embedder("all-MiniLM-L6-v2")
    lengths = np.diff(TokenizedTexts(texts, embedder.tokenizer, embedder.max_length).offsets)
    print(f"{len(texts):,} glosses, {lengths.mean():.1f} tokens on average, {lengths.max()} at most; "
          f"{args.threads} threads")
    seconds, reference = timed(lambda: previous_loop(embedder, texts))
    print(f"previous loop (64 texts per batch, input order): {len(texts) / seconds:7.0f} texts/s")
    for budget in args.budgets:
        for cap in (64, NO_CAP):
            settings = EngineSettings(max_batch_tokens=budget, batch_size=cap)
            seconds, vectors = timed(lambda settings=settings: embed_run(embedder, texts, settings).vectors)
            print(f"engine, --max-batch-tokens {budget:5d}, {'--batch-size 64' if cap == 64 else 'no count cap  '}: "
                  f"{len(texts) / seconds:7.0f} texts/s, max |vector difference| {np.abs(vectors - reference).max():.1e}")


if __name__ == "__main__":
    main()
