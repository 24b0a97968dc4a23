"""One served model: loaded once, the routes its task kind's record names, and what runs a route's inputs.

A route's handler never runs a model itself: it hands its inputs to the model's batcher under a `Work` key,
and the batcher, on the model's worker thread, calls `ServedModel.run(work, inputs)` on the inputs of every
request it gathered with the same key. Each work is one call of the function the matching command uses
(`bertforge embed`'s engine workload, the kind's `predict`, `fill_masks`), so a served result is the
command's result for the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.engine import EngineSettings
from bertforge.errors import BertforgeError

EMBEDDINGS = "/v1/embeddings"
PREDICT = "/predict"
RERANK = "/rerank"
TAG = "/tag"
FILL_MASK = "/fill-mask"
MODEL_ROUTES = (EMBEDDINGS, PREDICT, RERANK, TAG, FILL_MASK)  # the routes that run a model
FILL_MASK_ROUTES = (FILL_MASK,)  # a pre-training model (no task kind): its masked-language-model head

# what a batcher runs, and what may share a forward pass: ("vectors",), ("rows", pairs?), ("masks", top_k)
Work = tuple[Any, ...]


@dataclass
class ServedModel:
    name: str  # the id clients give as `model`
    reference: str  # the MODEL argument
    kind: str  # its task kind's name, or fill-mask
    routes: tuple[str, ...]
    hidden_size: int
    runners: dict[str, Callable[..., list[Any]]] = field(default_factory=dict)  # Work[0] -> its function
    # routes its kind serves but this model does not, and why (a single-text classifier's /rerank): a 404 says it
    withheld: dict[str, str] = field(default_factory=dict)

    def run(self, work: Work, inputs: list[Any]) -> list[Any]:
        """One result per input, in order (on the model's worker thread)."""
        return self.runners[work[0]](inputs, *work[1:])


def served_name(reference: str) -> tuple[str, str]:
    """`NAME=MODEL` or `MODEL` -> (name, reference): a run's final/ or a checkpoint is named after its run."""
    name, equals, path = reference.partition("=")
    if equals and name and "/" not in name:
        return name, path
    parts = [part for part in Path(reference.rstrip("/")).parts if part not in (".", "")]
    while len(parts) > 1 and (parts[-1] == "final" or parts[-1].startswith("step-") or parts[-1] == "checkpoints"):
        parts.pop()
    return (parts[-1] if parts else reference), reference


def load_served(reference: str, settings: EngineSettings) -> ServedModel:
    """Load MODEL (any reference `bertforge.locate` understands) and build the runners of its routes."""
    from bertforge.inference import load_model
    from bertforge.models import BertforgeForPreTraining
    from bertforge.tasks.kinds import KINDS

    name, path = served_name(reference)
    loaded = load_model(path)
    kind = next((kind for kind in KINDS if kind.model_of(loaded) is not None), None)
    withheld: dict[str, str] = {}
    if kind is not None:
        kind_name, routes = kind.name, kind.serve_routes
        if kind.pair_routes:
            why = _single_text_reason(name, loaded)
            if why is None:
                routes += kind.pair_routes
            else:
                withheld = dict.fromkeys(kind.pair_routes, why)
    elif isinstance(loaded.model, BertforgeForPreTraining):
        kind_name, routes = "fill-mask", FILL_MASK_ROUTES
    else:
        raise BertforgeError(f"{path} is a {type(loaded.model).__name__} without a task head; serve a fine-tuned run "
                             "(classification, token classification, embedding) or a pre-trained one (fill-mask)")
    if not routes:  # its inputs (a multiple-choice question and its candidates) fit none of the routes
        served_kinds = "; ".join(f"{', '.join(k.serve_routes)} for {k.name}" + (
            f" (and {', '.join(k.pair_routes)} when fine-tuned on text pairs)" if k.pair_routes else "")
            for k in KINDS if k.serve_routes)
        raise BertforgeError(f"{name} ({path}) is a {kind_name} model, which bertforge serve has no route for (it "
                             f"serves {served_kinds}; {', '.join(FILL_MASK_ROUTES)} for a pre-trained model); run it "
                             f"with `bertforge predict {path} --input FILE`")
    served = ServedModel(name, reference, kind_name, routes, loaded.model.config.hidden_size, withheld=withheld)
    if EMBEDDINGS in routes:
        served.runners["vectors"] = _vectors_runner(loaded, settings)
    if {PREDICT, RERANK, TAG} & set(routes):
        assert kind is not None
        served.runners["rows"] = _rows_runner(loaded, kind.predict, name, settings)
        if settings.backend != "torch":  # the ONNX export (tens of seconds, then cached) before the first request
            served.run(("rows", False), ["a"])
    if FILL_MASK in routes:
        if settings.backend != "torch":  # fill_masks runs the pre-training head in PyTorch only
            raise BertforgeError(f"--backend {settings.backend} cannot run {name} ({path}), a pre-trained model "
                                 "for /fill-mask (no ONNX graph for its head); serve it with --backend torch")
        served.runners["masks"] = _masks_runner(loaded, settings)
    return served


def _single_text_reason(name: str, loaded: Any) -> str | None:
    """Why the model's pair routes (/rerank) are not served, or None when it was fine-tuned on text pairs: its run's
    finetune.text_pair_column is what says so (a model directory outside a run carries no such record)."""
    if loaded.run_settings is None:
        return (f"model {name!r} is not in a bertforge run directory, so nothing says it was fine-tuned on text "
                "pairs; /rerank scores (query, text) pairs with a model whose run set finetune.text_pair_column: "
                "serve its run directory (or use /predict)")
    if loaded.run_settings.text_pair_column is None:
        return (f"model {name!r} was fine-tuned on single texts (its run sets no finetune.text_pair_column); "
                "/rerank scores (query, text) pairs with a model fine-tuned on text pairs: use /predict")
    return None


def _vectors_runner(loaded: Any, settings: EngineSettings) -> Callable[[list[str]], list[tuple[np.ndarray, int]]]:
    """Texts -> (vector, tokens) each: `bertforge embed`'s engine run, token counts kept for OpenAI's usage."""
    from bertforge import engine
    from bertforge.backends import backend_for
    from bertforge.embed import embedder_of

    embedder = embedder_of(loaded)  # its pooling, Normalize and max_seq_length, as `bertforge embed` reads them

    def with_tokens(outputs: Any, examples: list[dict[str, Any]]) -> list[tuple[np.ndarray, int]]:
        return [(row.numpy(), engine.tokens_of(example))
                for row, example in zip(engine.rows_of(outputs, examples), examples, strict=True)]

    workload = engine.text_workload(embedder.tokenizer, embedder.max_length, with_tokens)
    backend = backend_for(settings.backend, embedder.model, embedder.tokenizer, embedder.max_length)  # as `embed`
    return lambda texts: engine.run(texts, workload, backend, settings).results


def _rows_runner(loaded: Any, predict: Callable[..., Any], name: str, settings: EngineSettings,
                 ) -> Callable[[list[Any], bool], list[dict[str, Any]]]:
    """Texts (or (text, pair) tuples) -> the kind's `predict` rows, as `bertforge predict` writes them."""
    from bertforge.data.labels import LabeledSplit

    def rows(inputs: list[Any], pairs: bool) -> list[dict[str, Any]]:
        texts = [item[0] for item in inputs] if pairs else inputs
        split = LabeledSplit.unlabeled(name, texts, [item[1] for item in inputs] if pairs else None)
        return predict(loaded, split, settings).rows

    return rows


def _masks_runner(loaded: Any, settings: EngineSettings) -> Callable[[list[str], int], list[Any]]:
    from bertforge.inference import fill_masks

    return lambda texts, top_k: fill_masks(loaded, texts, top_k, settings)


def load_all(references: Sequence[str], settings: EngineSettings) -> list[ServedModel]:
    """Every MODEL, their names distinct."""
    served: list[ServedModel] = []
    for reference in references:
        model = load_served(reference, settings)
        if any(other.name == model.name for other in served):
            raise BertforgeError(f"two models are named {model.name!r}; name one NAME=MODEL, e.g. "
                                 f"{model.name}-2={reference}")
        served.append(model)
    return served
