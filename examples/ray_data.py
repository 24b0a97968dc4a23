"""Embed (or predict on) a corpus with Ray Data: one bertforge model per actor, as many actors as you ask for.

    pip install 'bertforge[ray]'
    python examples/ray_data.py all-MiniLM-L6-v2 docs.parquet vectors/ --actors 7   # 8 CPUs: one reads and writes
    python examples/ray_data.py runs/supersense-minilm texts.jsonl predictions/ --predict --actors 8

On a laptop this starts a local Ray cluster; with RAY_ADDRESS set (or `ray start` run on the machines)
it uses that cluster, and the input and output may be s3:// URLs (Ray reads them with pyarrow). The input
is a Parquet file or directory, JSON lines (.jsonl) or text (.txt, one text per line); the output is a
directory of Parquet files with the input's columns plus `vector` (or plus predict's columns).
"""

from __future__ import annotations

import argparse

import ray

from bertforge.ray import BertforgeEmbedder, BertforgePredictor


def read(source: str) -> ray.data.Dataset:
    if source.endswith(".txt"):
        return ray.data.read_text(source)  # one row per line, in a column named text
    if source.endswith((".jsonl", ".json")):
        return ray.data.read_json(source, lines=True)
    return ray.data.read_parquet(source)


def run(model: str, source: str, out: str, *, actors: int = 2, cpus_per_actor: float = 1.0, predict: bool = False,
        text_column: str = "text", batch_size: int = 1024) -> None:
    """Each row of `source` through `model` on `actors` Ray actors, written to the Parquet directory `out`.

    The actors hold `actors * cpus_per_actor` of the cluster's CPUs for as long as the dataset runs; the tasks
    that read and write need CPUs beside them (on a cluster with no CPU left over, the reading waits forever)."""
    callable_class = BertforgePredictor if predict else BertforgeEmbedder
    column = "text" if source.endswith(".txt") else text_column
    read(source).map_batches(
        callable_class, fn_constructor_kwargs={"model": model, "text_column": column},
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus_per_actor,  # the model loads once per actor
        batch_size=batch_size,  # the engine sorts each batch by length: large batches keep its forward passes full
        batch_format="pyarrow", udf_modifying_row_count=False,
    ).write_parquet(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="any bertforge MODEL reference (run, final/, checkpoint, all-MiniLM-L6-v2, ...)")
    parser.add_argument("input", help=".parquet (file or directory), .jsonl or .txt; a local path or s3:// URL")
    parser.add_argument("out", help="output directory of Parquet files (local or s3://)")
    parser.add_argument("--predict", action="store_true", help="predict (labels, scores, entities) instead of embed")
    parser.add_argument("--actors", type=int, default=2, help="actors (worker processes), each with the model; "
                                                              "leave CPUs for reading and writing")
    parser.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs each actor holds (its torch threads)")
    parser.add_argument("--text-column", default="text", help="the column of texts (a .txt input: its lines)")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per batch handed to an actor")
    args = parser.parse_args()
    ray.init()  # joins the cluster RAY_ADDRESS names, else starts a local one
    run(args.model, args.input, args.out, actors=args.actors, cpus_per_actor=args.cpus_per_actor, predict=args.predict,
        text_column=args.text_column, batch_size=args.batch_size)


if __name__ == "__main__":
    main()
