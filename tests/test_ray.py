"""Ray Data (`bertforge.ray`): `map_batches` over a real local Ray cluster with an actor pool of 2 worker
processes gives what the one-process `embed` and `predict` give, row for row."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import HANG_TIMEOUT
from helpers.finetuning import minilm_dir

from bertforge.embed import embed_run, load_embedder
from bertforge.engine import EngineSettings
from bertforge.errors import BertforgeError
from bertforge.inference import kind_of_loaded, load_model, read_inputs
from bertforge.models import EncoderConfig, save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.embedding import BertforgeForEmbedding

ray = pytest.importorskip("ray")

from bertforge.ray import BertforgeEmbedder, column_of  # noqa: E402  (after the skip)

ROOT = Path(__file__).resolve().parents[1]
ACTORS = 2
pytestmark = pytest.mark.timeout(HANG_TIMEOUT)  # a Ray scheduling deadlock must fail the suite, not hang it


class EmbedderShowingItsProcess(BertforgeEmbedder):
    """The embedder, noting its worker process in `started` (a file per actor) and beside each row it ran."""

    def __init__(self, model: str, started: str) -> None:
        super().__init__(model)
        (Path(started) / str(os.getpid())).touch()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().__call__(batch)
        return {**out, "pid": np.full(len(out["text"]), os.getpid())}


def tiny_config(**changes: object) -> EncoderConfig:
    return EncoderConfig(vocab_size=30528, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                         max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0,
                         initializer_range=0.2, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("ray-models")
    built = {"embedding": BertforgeForEmbedding(tiny_config(pooling="mean")),
             "classification": BertforgeForSequenceClassification(tiny_config(), 3, "classification",
                                                                  ["noun.act", "noun.animal", "verb.motion"])}
    return {name: save_bertforge_model(model.eval(), root / name, minilm_dir()) for name, model in built.items()}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return read_inputs("bundled:supersense/test").texts[:32]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs: an actor pool of 2 is 2 worker processes."""
    ray.init(num_cpus=ACTORS, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    # the pool starts work only once both actors are up: by default it starts with the first, and on a busy machine
    # that one can consume every block and the pool cancels the other before its constructor runs (seen under load)
    context.wait_for_min_actors_s = 600
    try:
        yield
    finally:
        ray.shutdown()


def test_embedding_on_two_ray_actors_equals_the_one_process_embed(cluster: None, models: dict[str, Path],
                                                                  texts: list[str], tmp_path: Path) -> None:
    dataset = ray.data.from_items([{"id": i, "text": text} for i, text in enumerate(texts)])
    started = {"model": str(models["embedding"]), "started": str(tmp_path)}
    out = dataset.map_batches(EmbedderShowingItsProcess, fn_constructor_kwargs=started,
                              compute=ray.data.ActorPoolStrategy(size=ACTORS), batch_size=4, batch_format="numpy",
                              udf_modifying_row_count=False).to_pandas().sort_values("id")
    assert out["text"].tolist() == texts
    expected = embed_run(load_embedder(models["embedding"]), texts).vectors
    assert np.abs(np.stack(out["vector"].tolist()) - expected).max() <= 1e-5
    actors = {int(path.name) for path in tmp_path.iterdir()}
    assert len(actors) == ACTORS and os.getpid() not in actors  # two worker processes, each with the model loaded
    assert set(out["pid"]) <= actors  # (which of them ran the batches is Ray's choice: the first up may run all)


def test_the_example_predicts_on_two_ray_actors_what_the_one_process_predict_does(
        cluster: None, models: dict[str, Path], texts: list[str], tmp_path: Path) -> None:
    """examples/ray_data.py --predict, run on the module's cluster: JSON lines in, a Parquet directory out."""
    import pandas as pd

    from bertforge.data.labels import LabeledSplit

    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(texts)))
    spec = importlib.util.spec_from_file_location("ray_data_example", ROOT / "examples" / "ray_data.py")
    example = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(example)  # type: ignore[union-attr]
    # half a CPU each: the cluster's other CPU reads and writes (actors holding every CPU would starve them)
    example.run(str(models["classification"]), str(source), str(tmp_path / "predictions"), actors=ACTORS,
                cpus_per_actor=0.5, predict=True, batch_size=4)
    out = pd.read_parquet(tmp_path / "predictions").sort_values("id")
    assert out["text"].tolist() == texts
    loaded = load_model(models["classification"])
    expected = kind_of_loaded(loaded).predict(loaded, LabeledSplit.unlabeled("texts", texts), EngineSettings()).rows
    assert out["label"].tolist() == [row["label"] for row in expected]
    assert out["score"].tolist() == pytest.approx([row["score"] for row in expected], abs=1e-5)
    assert [row["noun.animal"] for row in out["probabilities"]] == pytest.approx(
        [row["probabilities"]["noun.animal"] for row in expected], abs=1e-5)


def test_a_batch_without_the_text_column_or_with_an_empty_text_is_one_line() -> None:
    import pyarrow as pa

    with pytest.raises(BertforgeError, match=r"the batch has no column 'text' \(it has id, body\); pass text_column"):
        column_of(pa.table({"id": [1], "body": ["a dog"]}), "text")
    with pytest.raises(BertforgeError, match="row 1 of a batch: column 'text' holds ''"):
        column_of({"text": np.array(["a dog", ""])}, "text")
