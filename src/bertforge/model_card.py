"""The model card, `README.md`, of every `final/` and every export: a model directory that explains itself.

It follows the Hugging Face Hub's model-card conventions, so the directory can be uploaded as is: YAML
front matter (`library_name`, `base_model`, `datasets`, `pipeline_tag`, `language`, `tags`, and a
`model-index` with the metrics), then prose: what the model is and was trained from, on which data, the
metrics with the split and the checkpoint they came from (`<split>_results.json`), the command that
produced it, and a snippet that loads it with the library its format is for.

Everything is read from what the run or the export left on disk (`config.yaml`, the results files, the
model directory's own config), so a card can be written again from a run directory at any time.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bertforge.config import Config
from bertforge.locate import HUB_NAME, PACKAGED_MODELS, model_format
from bertforge.run_directory import RunDirectory, evaluation_file_names

CARD_NAME = "README.md"
# packaged models are copies of these Hub models
PACKAGED_HUB_NAMES = {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}
BUNDLED_DATA_DESCRIPTION = "WordNet noun and verb supersenses (bundled with bertforge)"

# transformers architecture suffix -> (Hub pipeline tag, task name in words)
PIPELINES = (("ForSequenceClassification", "text-classification", "text classification"),
             ("ForTokenClassification", "token-classification", "token classification"),
             ("ForMaskedLM", "fill-mask", "masked language modelling"),
             ("ForPreTraining", "fill-mask", "masked language modelling (pre-training)"))
SENTENCE_SIMILARITY = ("sentence-similarity", "sentence embeddings")
FEATURE_EXTRACTION = ("feature-extraction", "an encoder's hidden states")

_command: list[str] | None = None  # `bertforge ...` as the user typed it (`remember_command`)


def remember_command(arguments: list[str] | None) -> None:
    """Keep the command line being run for the cards it writes (`bertforge.cli.main`; None when it returns)."""
    global _command
    _command = None if arguments is None else ["bertforge", *arguments]


def command_line() -> str | None:
    """The `bertforge ...` command this process runs, or None when bertforge is used as a library."""
    return shlex.join(_command) if _command is not None else None


@dataclass
class CardFacts:
    """What a card says, gathered from disk."""

    name: str
    library: str  # transformers | sentence-transformers | bertforge | onnx
    pipeline_tag: str
    task: str  # the task in words
    base_model: str | None = None  # a Hub name, for the front matter
    base_description: str = "trained from scratch"
    datasets: list[str] = field(default_factory=list)  # Hub dataset names, for the front matter
    data_lines: list[str] = field(default_factory=list)
    language: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)  # <split>_results.json documents
    last_validation: dict[str, Any] | None = None  # without results files: the last validation record
    command: str | None = None
    exported_from: str | None = None


def write_model_card(model_dir: Path, *, run_dir: Path | None, config: Config | None = None,
                     command: str | None = None, exported_from: str | None = None) -> Path:
    """Write `model_dir/README.md` describing the model directory `model_dir` (and the run it came from)."""
    facts = gather_facts(model_dir, run_dir=run_dir, config=config, command=command, exported_from=exported_from)
    path = model_dir / CARD_NAME
    staging = path.with_name(f".{CARD_NAME}.partial")
    staging.write_text(card_text(facts, model_dir), encoding="utf-8")
    staging.replace(path)
    return path


def gather_facts(model_dir: Path, *, run_dir: Path | None, config: Config | None, command: str | None,
                 exported_from: str | None) -> CardFacts:
    run = RunDirectory(run_dir) if run_dir is not None else None
    if config is None and run is not None and run.is_run():
        config = run.load_config()
    library, pipeline_tag, task = model_kind(model_dir)
    facts = CardFacts(name=run_dir.name if run_dir is not None else model_dir.name, library=library,
                      pipeline_tag=pipeline_tag, task=task, command=command, exported_from=exported_from)
    if config is not None:
        _describe_base(facts, config.model.init_from, config.model.preset)
        _describe_data(facts, config)
    elif exported_from is not None:  # a model no bertforge run made (a Hub or packaged model): it is the base
        _describe_base(facts, exported_from, None)
    if run is not None:
        facts.results = [json.loads(path.read_text(encoding="utf-8")) for path in run.results_files()]
        if not facts.results:
            facts.last_validation = _last_validation(run)
    return facts


def model_kind(model_dir: Path) -> tuple[str, str, str]:
    """(library, pipeline tag, task in words) of a model directory, from its own files."""
    if (model_dir / "modules.json").is_file():
        return ("sentence-transformers", *SENTENCE_SIMILARITY)
    if (model_dir / "model.onnx").is_file():
        library = "onnx"
    elif model_format(model_dir) == "bertforge":
        description = json.loads((model_dir / "bertforge_model.json").read_text(encoding="utf-8"))
        architectures = [str(description.get("model_class", ""))]
        return ("bertforge", *_pipeline_of(architectures))
    else:
        library = "transformers"
    architectures = []
    if (model_dir / "config.json").is_file():
        architectures = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    return (library, *_pipeline_of(architectures))


def _pipeline_of(architectures: list[str]) -> tuple[str, str]:
    for suffix, tag, words in PIPELINES:
        if any(name.endswith(suffix) for name in architectures):
            return tag, words
    if any(name.endswith("Embedding") or name.endswith("ForEmbedding") for name in architectures):
        return SENTENCE_SIMILARITY
    return FEATURE_EXTRACTION


def _describe_base(facts: CardFacts, reference: str | None, preset: str | None) -> None:
    if not reference:
        facts.base_description = f"trained from scratch (architecture preset `{preset}`)"
        return
    if reference in PACKAGED_MODELS and not Path(reference).exists():
        facts.base_model = PACKAGED_HUB_NAMES.get(reference)
    elif HUB_NAME.match(reference) and not Path(reference).exists():
        facts.base_model = reference
    if facts.base_model is not None:
        how = "fine-tuned from" if preset is not None else "converted from"
        facts.base_description = f"{how} [{facts.base_model}](https://huggingface.co/{facts.base_model})"
        facts.language = _language_of_hub_model(reference)
        return
    facts.base_description = (f"trained from `{reference}` (model.init_from)" if preset is not None else
                              f"converted from `{reference}`")
    base_card = _card_of_local_model(Path(reference).expanduser())
    if base_card is not None:  # a model bertforge trained: its own card names its base and language
        facts.base_model = base_card.get("base_model")
        facts.language = list(base_card.get("language") or [])


def _language_of_hub_model(reference: str) -> list[str]:
    from bertforge.errors import BertforgeError
    from bertforge.locate import resolve_model_path

    try:
        front = _front_matter(resolve_model_path(reference) / CARD_NAME)
    except BertforgeError:  # no longer in the cache: the card says less, the model is no worse
        return []
    language = front.get("language") if front else None
    return [language] if isinstance(language, str) else list(language or [])


def _card_of_local_model(path: Path) -> dict[str, Any] | None:
    for candidate in (path / CARD_NAME, RunDirectory(path).final / CARD_NAME):
        front = _front_matter(candidate)
        if front is not None:
            return front
    return None


def _front_matter(path: Path) -> dict[str, Any] | None:
    """The YAML front matter of a model card, if it has one that parses."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    try:
        front = yaml.safe_load(text.split("---", 2)[1])
    except (yaml.YAMLError, IndexError):
        return None
    return front if isinstance(front, dict) else None


def _describe_data(facts: CardFacts, config: Config) -> None:
    section = config.finetune
    files = (("train", section.train_file), ("validation", section.validation_file), ("test", section.test_file))
    if not section.train_file and config.data.path:
        files = (("pre-training data (prepared shards)", config.data.path),)
    for split, reference in files:
        if not reference:
            continue
        if reference.startswith("hf:"):
            name = reference[3:].split(":", 1)[0].split("@", 1)[0]
            if name not in facts.datasets:
                facts.datasets.append(name)
            facts.data_lines.append(f"- {split}: [{name}](https://huggingface.co/datasets/{name}) (`{reference}`)")
        elif reference.startswith("bundled:") or _is_bundled_file(reference):
            facts.data_lines.append(f"- {split}: {BUNDLED_DATA_DESCRIPTION} (`{reference}`)")
            if "en" not in facts.language:
                facts.language.append("en")
        else:
            facts.data_lines.append(f"- {split}: `{reference}`")


def _is_bundled_file(reference: str) -> bool:
    from bertforge.data.bundled import supersense_path

    try:
        return Path(reference).resolve().parent == supersense_path("train").resolve().parent
    except (OSError, ValueError):
        return False


def _last_validation(run: RunDirectory) -> dict[str, Any] | None:
    metrics = run.metrics_file
    if not metrics.is_file():
        return None
    last = None
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("split") == "validation":
            last = record
    return last


# ---------------------------------------------------------------------------------------------
# the text


def card_text(facts: CardFacts, model_dir: Path) -> str:
    return "---\n" + yaml.safe_dump(front_matter(facts), sort_keys=False, allow_unicode=True) + "---\n\n" + body(
        facts, model_dir)


def front_matter(facts: CardFacts) -> dict[str, Any]:
    front: dict[str, Any] = {"library_name": facts.library}
    if facts.base_model:
        front["base_model"] = facts.base_model
    if facts.datasets:
        front["datasets"] = facts.datasets
    if facts.language:
        front["language"] = facts.language
    front["pipeline_tag"] = facts.pipeline_tag
    front["tags"] = ["bertforge", facts.pipeline_tag] + (["sentence-transformers"] if facts.library ==
                                                          "sentence-transformers" else [])
    results = [_model_index_result(facts, report) for report in facts.results]
    if results:
        front["model-index"] = [{"name": facts.name, "results": results}]
    return front


def _model_index_result(facts: CardFacts, report: dict[str, Any]) -> dict[str, Any]:
    source = str(report.get("source", ""))
    dataset_name = source[3:] if source.startswith("hf:") else Path(source).name or source
    return {"task": {"type": facts.pipeline_tag, "name": facts.task},
            "dataset": {"name": dataset_name, "type": dataset_name, "split": report["split"]},
            "metrics": [{"type": name, "value": round(float(value), 6), "name": f"{report['split']} {name}"}
                        for name, value in report["metrics"].items() if name != "examples"]}


def body(facts: CardFacts, model_dir: Path) -> str:
    lines = [f"# {facts.name}", "",
             f"A BERT-family encoder for {facts.task}, {facts.base_description}, with "
             "bertforge and saved in the format "
             f"{_library_words(facts.library)} loads.", ""]
    if facts.exported_from:
        lines += [f"Exported from `{facts.exported_from}`.", ""]
    if facts.data_lines:
        lines += ["## Data", "", *facts.data_lines, ""]
    lines += ["## Metrics", ""] + metrics_lines(facts) + [""]
    lines += ["## How it was made", ""]
    lines += (["```bash", facts.command, "```", ""] if facts.command else
              ["Trained through bertforge's Python API (no command line was recorded).", ""])
    lines += ["The run's resolved configuration is `config.yaml` in its run directory.", ""] if not facts.exported_from \
        else []
    lines += ["## How to load it", "", "```python", *loading_snippet(facts, model_dir), "```", ""]
    return "\n".join(lines)


def _library_words(library: str) -> str:
    return {"transformers": "🤗 transformers", "sentence-transformers": "sentence-transformers",
            "bertforge": "bertforge", "onnx": "ONNX Runtime"}[library]


def metrics_lines(facts: CardFacts) -> list[str]:
    if not facts.results and facts.last_validation is None:
        return ["No evaluation was recorded for this model."]
    if not facts.results:
        record = facts.last_validation
        assert record is not None
        shown = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k not in ("step", "split", "time")
                          and isinstance(v, int | float))
        return [f"Last validation, at step {record['step']:,} (the weights saved): {shown}."]
    names = list(dict.fromkeys(name for report in facts.results for name in report["metrics"] if name != "examples"))
    lines = ["| split | examples | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for report in facts.results:
        split = report["split"] + (" (the rows that chose the checkpoint)" if report.get("subset") else "")
        values = [f"{report['metrics'][name]:.4f}" if name in report["metrics"] else "—" for name in names]
        examples = report["metrics"].get("examples")
        lines.append(f"| {split} | {'—' if examples is None else f'{int(examples):,}'} | " + " | ".join(values) + " |")
    checkpoints = {checkpoint_words(report.get("checkpoint")) for report in facts.results}
    lines += ["", f"Scored with the weights `final/` holds: {'; '.join(sorted(checkpoints))}."]
    sources = sorted({f"`{evaluation_file_names(report['split'])[0]}`" for report in facts.results})
    lines += ["", f"From {', '.join(sources)} in the run directory, each on its split's file (`source` there)."]
    return lines


def checkpoint_words(checkpoint: dict[str, Any] | None) -> str:
    if checkpoint is None:
        return "not recorded"
    which = checkpoint.get("which")
    if which == "best":
        return f"the best checkpoint by validation {checkpoint.get('best_metric')}, step {checkpoint['step']:,}"
    if which == "average_of_checkpoints":
        return f"the mean weights of {', '.join(checkpoint.get('checkpoints', []))}"
    if which == "ema":
        return f"the moving average of the weights at step {checkpoint['step']:,}"
    return f"the last weights, step {checkpoint['step']:,}"


def mask_token(model_dir: Path) -> str:
    """The model's own mask token (RoBERTa's `<mask>`, BERT's `[MASK]`), as its tokenizer names it."""
    if not (model_dir / "tokenizer.json").is_file():
        return "[MASK]"
    from tokenizers import Tokenizer

    from bertforge.special_tokens import special_tokens_of

    return special_tokens_of(model_dir, Tokenizer.from_file(str(model_dir / "tokenizer.json"))).get("mask", "[MASK]")


def loading_snippet(facts: CardFacts, model_dir: Path) -> list[str]:
    where = f'model_id = "{model_dir}"  # or its Hub name once uploaded'
    if facts.library == "sentence-transformers":
        return ["from sentence_transformers import SentenceTransformer", "", where,
                "model = SentenceTransformer(model_id)",
                'vectors = model.encode(["the quality of being good", "a place where people live"])']
    if facts.library == "onnx":
        return ["import onnxruntime", "from transformers import AutoTokenizer", "", where,
                "tokenizer = AutoTokenizer.from_pretrained(model_id)",
                'session = onnxruntime.InferenceSession(f"{model_id}/model.onnx")',
                'inputs = tokenizer(["the quality of being good"], return_tensors="np")',
                "outputs = session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})"]
    if facts.library == "bertforge":
        return ["from bertforge.inference import load_model", "", where,
                "model = load_model(model_id)  # or on the command line: bertforge predict MODEL --text '...'"]
    if facts.pipeline_tag == "feature-extraction":
        return ["from transformers import AutoModel, AutoTokenizer", "", where,
                "tokenizer = AutoTokenizer.from_pretrained(model_id)", "model = AutoModel.from_pretrained(model_id)",
                'hidden = model(**tokenizer(["the quality of being good"], return_tensors="pt")).last_hidden_state']
    example = (f"the {mask_token(model_dir)} of being good" if facts.pipeline_tag == "fill-mask"
               else "the quality of being good")
    extra = ', aggregation_strategy="simple"' if facts.pipeline_tag == "token-classification" else ""
    return ["from transformers import pipeline", "", where,
            f'pipe = pipeline("{facts.pipeline_tag}", model=model_id{extra})', f'print(pipe("{example}"))']
