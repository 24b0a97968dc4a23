"""Ship a trained model: a Hugging Face directory, or an ONNX graph checked with onnxruntime.

`hf` writes what `transformers` loads with no custom code (`models.hf.export_hf`: the stock
`Bert*` / `ModernBert*` class, label names in config.json, the tokenizer files).

`onnx` exports the *equivalent stock `transformers` model* with padded inputs
(`input_ids`, `attention_mask`[, `token_type_ids`] of shape [batch, length]) rather than our
unpadded encoder: ONNX graphs need static control flow, and the packed layout's row placement
depends on the values of `cu_seqlens` (a tracer would bake in one batch's boundaries). ONNX
runtimes and servers expect padded inputs anyway. `torch.onnx.export(dynamo=True)` writes the
graph with dynamic batch and length; the result is then run with onnxruntime on a batch of other
shapes and compared with our PyTorch model's outputs on the real tokens — the export is kept only
if they agree within `atol`. A classifier whose head has no stock class (a BERT with `model.pooling`
`cls`, `mean` or `last`) is exported as the stock encoder with our head on its padded states, in one
graph: the logits come out of `model.onnx` as from any other classifier's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.console import log
from bertforge.errors import BertforgeError
from bertforge.inference import LoadedModel, load_model
from bertforge.locate import resolve_model_path
from bertforge.models.heads import pool_padded
from bertforge.models.serialization import CONFIG_NAME, TOKENIZER_FILES
from bertforge.output_guard import LEDGER_NAME, claim_directory, process_is_gone, record_outputs
from bertforge.storage import cache_root, filesystem, is_remote, with_retries

FORMATS = ("hf", "onnx")
ONNX_FILE = "model.onnx"
ONNX_OPSET = 18
ONNX_SINGLE_FILE_LIMIT = 1_800_000_000  # bytes; protobuf cannot hold a graph over 2 GB
CHECK_TEXTS = ("the quality of being good",
               "a written message addressed to a person or organization, often long and formal",
               "run")
CHECK_PAIRS = ("act of moving", "a place where people live", "the act of running quickly")

# what `export --format hf|onnx` wrote before exports kept a ledger (`output_guard`), in transformers' layout or
# bertforge's own: an earlier export is recognised by these names
EXPORT_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                          CONFIG_NAME, "model.onnx", "model.onnx.data", "onnx_inputs.json", *TOKENIZER_FILES,
                          "README.md"})  # README.md: the model card (`bertforge.model_card`)
EXPORT_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # save_pretrained's shards of a large model
# at least one of them is in every export; uploaded last, so a prefix without one holds an interrupted export
EXPORT_ANCHORS = ("config.json", CONFIG_NAME, "model.onnx")


def is_earlier_export(names: list[str], directories: set[str]) -> bool:
    """Only files an export writes, an anchor among them (or, in a bucket, an upload cut short before it)."""
    return all(name not in directories and (name in EXPORT_FILES or EXPORT_SHARD.fullmatch(name)) for name in names)


def claim_export_destination(out: str | Path, sources: list[Path], overwrite: bool) -> None:
    """`out` may be replaced by the export: new, empty or an earlier export (with `overwrite`), never the model
    being exported nor a directory that holds it (exporting a run into its own parent would delete the run)."""
    claim_directory(out, command="export", flag="--out", what="export", overwrite=overwrite,
                    sources=[(source, "the model being exported") for source in sources], recognise=is_earlier_export)


@dataclass(frozen=True)
class ExportSummary:
    directory: Path | str  # a local directory, or the URL of an export to object storage
    format: str  # transformers | bertforge | onnx
    message: str
    max_abs_difference: float | None = None  # onnx: largest |onnxruntime - PyTorch| on the check batch


def export_model(reference: str | Path, out_dir: str | Path, format: str = "hf", atol: float = 1e-4,
                 overwrite: bool = False) -> ExportSummary:
    """Export the model at `reference` (any shape `bertforge.locate` knows) to `out_dir`.

    `out_dir` is replaced atomically, so it must be new, empty or an earlier export (`overwrite`);
    `claim_export_destination` refuses anything else before a file is written. A URL (`s3://...`)
    is exported into a local staging directory and uploaded, anchors last.
    """
    if format not in FORMATS:
        raise BertforgeError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    if is_remote(out_dir):
        return _export_to_object_store(reference, str(out_dir).rstrip("/"), format, atol, overwrite)
    loaded = load_model(reference)
    sources = [resolve_model_path(reference), loaded.location.path, loaded.location.run_dir, loaded.tokenizer_dir]
    claim_export_destination(out_dir, [path for path in sources if path is not None], overwrite)
    summary = _export_local(loaded, out_dir, format, atol)
    from bertforge.model_card import command_line, write_model_card

    write_model_card(Path(summary.directory), run_dir=loaded.location.run_dir, command=command_line(),
                     exported_from=str(reference))
    # the directory was replaced whole: its ledger names exactly the new export's files
    record_outputs(summary.directory, [path.name for path in Path(summary.directory).iterdir()], "export")
    return summary


def _export_local(loaded: LoadedModel, out_dir: str | Path, format: str, atol: float) -> ExportSummary:
    from bertforge.tasks.kinds import KINDS

    # a fine-tuned model exports as its kind's record says; a bare encoder or a pre-training model as itself
    kind = next((kind for kind in KINDS if kind.model_of(loaded) is not None), None)
    model = kind.model_of(loaded) if kind is not None else loaded.model
    if format == "hf":
        if kind is not None:
            result = kind.export(model, loaded.tokenizer_dir, Path(out_dir), loaded.max_length)  # type: ignore[arg-type]
        else:
            from bertforge.models.hf import export_hf

            result = export_hf(model, loaded.tokenizer_dir, out_dir)  # type: ignore[arg-type]
        return ExportSummary(result.directory, result.format, result.message)
    if kind is not None:
        traced, note = kind.for_onnx(model)  # type: ignore[arg-type]
        if note:
            log.info(note)
        loaded = dataclasses.replace(loaded, model=traced)
    return export_onnx(loaded, out_dir, atol)


def _export_to_object_store(reference: str | Path, out: str, format: str, atol: float,
                            overwrite: bool) -> ExportSummary:
    claimed = claim_directory(out, command="export", flag="--out", what="export", overwrite=overwrite,
                              recognise=is_earlier_export)  # before minutes of export work
    staging = Path(tempfile.mkdtemp(prefix=f"export-{os.getpid()}-", dir=_staging_root()))
    try:
        local = export_model(reference, staging / "model", format, atol)
        files = [str(path.relative_to(local.directory)) for path in sorted(Path(local.directory).rglob("*"))
                 if path.is_file() and path.name != LEDGER_NAME]
        claimed.record(*{name.split("/", 1)[0] for name in files})  # before the upload: a kill leaves no stranger
        fs, root = filesystem(out)
        root = root.rstrip("/")
        # anchors last: until they are there, the prefix is not a complete export for any reader
        for name in sorted(files, key=lambda name: name in EXPORT_ANCHORS):
            source = Path(local.directory) / name
            with_retries(f"{out}/{name}", "upload", lambda source=source, name=name: fs.put_file(str(source),
                                                                                               f"{root}/{name}"))
        claimed.remove_earlier(keep={name.split("/", 1)[0] for name in files})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    message = local.message.replace(str(local.directory), out)
    log.info(f"uploaded to {out}: {', '.join(files)}")
    return ExportSummary(out, local.format, message, local.max_abs_difference)


def _staging_root() -> Path:
    """Where uploads are staged; what a killed export left there (`export-PID-...`) is removed first."""
    root = cache_root() / "exports"
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob("export-*-*"):
        pid = leftover.name.split("-")[1]
        if pid.isdigit() and process_is_gone(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)
    return root


# ---------------------------------------------------------------------------------------------
# onnx


def _require_onnx() -> None:
    missing = [name for name in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise BertforgeError(f"--format onnx needs {', '.join(missing)}; install the extra: "
                             "pip install 'bertforge[onnx]'")


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter narrates each stage and warns about torchvision ops; users need only our one line."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.onnx._internal.exporter._registration")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


class _PaddedOutput(nn.Module):
    """The stock transformers model with a plain tensor output (logits, or hidden states for an encoder)."""

    def __init__(self, hf_model: nn.Module, output: str) -> None:
        super().__init__()
        self.hf_model, self.output = hf_model, output

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return getattr(self.hf_model(input_ids=input_ids, attention_mask=attention_mask, **extra), self.output)


class _StockEncoderWithOurHead(nn.Module):
    """A classifier whose pooling no stock `*ForSequenceClassification` has: the stock encoder, then our head
    (`SequenceHead.from_pooled`) on its states pooled over the real tokens (`pool_padded`)."""

    def __init__(self, hf_encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.hf_encoder, self.head = hf_encoder, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.hf_encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return self.head.from_pooled(pool_padded(hidden, attention_mask, self.head.pooling))


def _padded_graph(model: nn.Module, special_tokens: dict[str, int]) -> tuple[nn.Module, Any, str]:
    """What `model.onnx` computes on padded inputs, the Hugging Face config written beside it, and what the graph
    is, in words: the equivalent stock model, or for a classifier without one the stock encoder with our head."""
    from bertforge.models.classification import BertforgeForSequenceClassification
    from bertforge.models.hf import hf_class_name, to_hf_model

    if (type(model) is BertforgeForSequenceClassification and hf_class_name(model)[0] is None
            and hf_class_name(model.encoder)[0] is not None):
        hf_encoder = to_hf_model(model.encoder, special_tokens).eval()
        hf_encoder.config.update(model.hf_config_extras())  # the label names, as a stock classifier's config has them
        return (_StockEncoderWithOurHead(hf_encoder, model.head).eval(), hf_encoder.config,
                f"{type(hf_encoder).__name__} with bertforge's {model.config.pooling}-pooling head")
    hf_model = to_hf_model(model, special_tokens).eval()  # raises where no stock class holds the model
    return _PaddedOutput(hf_model, _output_name(model)).eval(), hf_model.config, type(hf_model).__name__


def _output_name(model: nn.Module) -> str:
    """The stock model's output field that holds what ours returns (each model class names it)."""
    return model.output_name  # type: ignore[return-value]


def _padded_batch(loaded: LoadedModel, texts: tuple[str, ...], pairs: tuple[str, ...] | None) -> dict[str, torch.Tensor]:
    """Real tokenized text when the model has a tokenizer, else token ids drawn from the vocabulary."""
    from bertforge.data.labeled import LabeledDataset, collate_padded
    from bertforge.data.labels import LabeledSplit

    if loaded.tokenizer_dir is None:
        generator = torch.Generator().manual_seed(0)
        lengths = [5 + 3 * i for i in range(len(texts))]
        ids = torch.randint(5, loaded.model.config.vocab_size, (len(texts), max(lengths)), generator=generator)
        mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()
        return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    split = LabeledSplit.unlabeled("export check", texts, pairs or None)
    dataset = LabeledDataset(split, loaded.tokenizer_dir, loaded.max_length)
    batch = collate_padded([dataset[i] for i in range(len(dataset))], pad_token_id=dataset.pad_token_id)
    return {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}


def _our_outputs(model: nn.Module, batch: dict[str, torch.Tensor], output: str, per_token: bool) -> np.ndarray:
    """Our model on the padded batch, in the same layout as the ONNX output: our per-token outputs (hidden states,
    MLM or tagging logits) come unpadded, one row per real token, and are padded like the graph's."""
    from bertforge.models import pad_tokens

    with torch.no_grad():
        result = model(**batch)
    if output == "last_hidden_state":
        values = result
    else:
        values = result.mlm_logits if hasattr(result, "mlm_logits") else result.logits
    return (pad_tokens(values, batch["attention_mask"]) if per_token else values).numpy()


def export_onnx(loaded: LoadedModel, out_dir: str | Path, atol: float = 1e-4) -> ExportSummary:
    """`model.onnx` + config.json + tokenizer files in `out_dir`, verified against PyTorch with onnxruntime."""
    _require_onnx()
    import onnxruntime

    from bertforge.models.serialization import copy_tokenizer_files, write_directory_atomically
    from bertforge.special_tokens import special_token_ids

    model = loaded.model.eval()
    wrapper, hf_config, graph_name = _padded_graph(model, special_token_ids(loaded.tokenizer_dir))
    output = _output_name(model)
    uses_token_types = model.config.type_vocab_size > 0
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if uses_token_types else [])
    trace_batch = _padded_batch(loaded, CHECK_TEXTS[:2], None)
    check_batch = _padded_batch(loaded, CHECK_TEXTS, CHECK_PAIRS)
    batch_dim, length_dim = torch.export.Dim("batch"), torch.export.Dim("length")
    dynamic = {name: {0: batch_dim, 1: length_dim} for name in inputs}
    # graphs over 2 GB must keep their weights in a side file; smaller ones ship as one file
    external = sum(p.numel() * p.element_size() for p in wrapper.parameters()) > ONNX_SINGLE_FILE_LIMIT
    summary: dict[str, float] = {}

    def write(staging: Path) -> None:
        with _quiet_exporter():
            torch.onnx.export(wrapper, tuple(trace_batch[name] for name in inputs), str(staging / ONNX_FILE),
                              input_names=inputs, output_names=[output], dynamic_shapes=dynamic, dynamo=True,
                              opset_version=ONNX_OPSET, external_data=external, verbose=False)
        session = onnxruntime.InferenceSession(str(staging / ONNX_FILE), providers=["CPUExecutionProvider"])
        onnx_out = session.run(None, {name: check_batch[name].numpy() for name in inputs})[0]
        ours = _our_outputs(model, {name: check_batch[name] for name in inputs}, output, per_token=onnx_out.ndim == 3)
        real = check_batch["attention_mask"].numpy().astype(bool)
        if onnx_out.ndim == 3:  # token-level outputs: compare the real tokens only
            onnx_out, ours = onnx_out[real], ours[real]
        difference = float(np.abs(onnx_out - ours).max())
        if not difference <= atol:
            raise RuntimeError(f"the ONNX graph disagrees with the PyTorch model by {difference:.2e} (> {atol}); "
                               "please report this with the model's config")
        summary["difference"] = difference
        hf_config.save_pretrained(str(staging))
        if loaded.tokenizer_dir is not None:
            copy_tokenizer_files(loaded.tokenizer_dir, staging)
        (staging / "onnx_inputs.json").write_text(json.dumps({"inputs": inputs, "output": output,
                                                              "opset": ONNX_OPSET}, indent=2) + "\n", encoding="utf-8")

    directory = write_directory_atomically(Path(out_dir), write)
    message = (f"exported {graph_name} to {directory / ONNX_FILE} (inputs {', '.join(inputs)} "
               f"[batch, length]; output {output}); onnxruntime matches PyTorch within {summary['difference']:.1e}")
    log.info(message)
    return ExportSummary(directory, "onnx", message, summary["difference"])
