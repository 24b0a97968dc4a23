"""The reference preparation pipeline (Union/Flyte BERT example style): `datasets.map` + `MDSWriter`.

Run by `benchmarks/data_prep.py` in a separate interpreter, because `mosaicml-streaming` cannot be
imported next to the project's CPU torch (see scripts/make_mds_fixtures.py for the throwaway
environment). With `--writer bertforge` it uses bertforge's own MDS writer instead (same format),
for machines without that environment; the report says which one ran.

Steps: `load_dataset("text")` (one row per line), drop empty lines, `Dataset.map` with the fast
tokenizer (batched, `num_proc` workers, truncation + padding to `seq_len`, as the example feeds
fixed-shape batches), then every row written to MDS as int32 arrays.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--writer", choices=("streaming", "bertforge"), default="streaming")
    args = parser.parse_args()
    started = time.perf_counter()

    from datasets import disable_caching, load_dataset
    from transformers import AutoTokenizer

    if args.writer == "streaming":
        from streaming import MDSWriter
    else:
        from bertforge.data.mds import MDSWriter  # type: ignore[assignment]

    disable_caching()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    dataset = load_dataset("text", data_files=args.input, split="train", cache_dir=args.cache_dir)
    dataset = dataset.filter(lambda batch: [bool(text.strip()) for text in batch["text"]], batched=True,
                             num_proc=args.num_proc)

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return tokenizer(batch["text"], truncation=True, max_length=args.seq_len, padding="max_length")

    dataset = dataset.map(tokenize, batched=True, num_proc=args.num_proc, remove_columns=["text"])
    columns = {"input_ids": "ndarray:int32", "token_type_ids": "ndarray:int32", "attention_mask": "ndarray:int32"}
    shutil.rmtree(args.out, ignore_errors=True)
    rows = 0
    with MDSWriter(out=args.out, columns=columns) as writer:
        for batch in dataset.with_format("numpy").iter(batch_size=1000):
            arrays = {name: np.asarray(batch[name], dtype=np.int32) for name in columns}
            for i in range(len(arrays["input_ids"])):
                writer.write({name: arrays[name][i] for name in columns})
                rows += 1
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started, "writer": args.writer}))


if __name__ == "__main__":
    main()
