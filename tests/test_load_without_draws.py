"""Loading a model to run it draws nothing: its layers are not initialised before every weight is read into them.
Starting a fine-tune from a saved model still draws its fresh head exactly as before (the same RNG stream)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.finetuning import minilm_dir
from helpers.models import minilm_sized_config

from bertforge.errors import BertforgeError
from bertforge.inference import load_model
from bertforge.models import BertforgeForPreTraining, save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.hf import export_hf
from bertforge.models.loading import load_for_task
from bertforge.models.serialization import load_bertforge_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A tiny random classifier over MiniLM's vocabulary, in bertforge's format and exported as a stock BERT, and a
    pre-training model to start a fine-tune from."""
    root = tmp_path_factory.mktemp("load-without-draws")
    torch.manual_seed(0)
    classifier = BertforgeForSequenceClassification(minilm_sized_config(), 3, "classification", ["a", "b", "c"]).eval()
    pretrained = BertforgeForPreTraining(minilm_sized_config())
    return {"classifier": classifier, "pretrained": pretrained,
            "bertforge": save_bertforge_model(classifier, root / "bertforge", minilm_dir()),
            "hf": export_hf(classifier, minilm_dir(), root / "hf").directory,
            "pretrained_dir": save_bertforge_model(pretrained, root / "pretrained", minilm_dir())}


@pytest.mark.parametrize("layout", ["bertforge", "hf"])
def test_loading_a_model_to_run_it_draws_nothing_and_reads_every_weight(saved: dict, layout: str) -> None:
    rng = torch.get_rng_state()
    loaded = load_model(saved[layout]).model
    assert torch.equal(torch.get_rng_state(), rng)
    expected = saved["classifier"].state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    assert all(torch.equal(tensor, expected[key]) for key, tensor in loaded.state_dict().items())


def test_a_fresh_head_on_a_saved_encoder_is_drawn_after_the_same_draws_as_before(saved: dict) -> None:
    """`load_for_task` builds the saved model (every draw of its constructor) and then the new one: the head's draw
    follows both, as it did before loading learned to skip draws; a fine-tune from the same seed starts the same."""
    pretrained_dir: Path = saved["pretrained_dir"]  # type: ignore[assignment]
    torch.manual_seed(7)
    model = load_for_task(pretrained_dir, "classification", num_labels=3)
    torch.manual_seed(7)
    BertforgeForPreTraining(minilm_sized_config())  # the saved model, drawn when built
    expected = BertforgeForSequenceClassification(minilm_sized_config(), 3)
    head, expected_head = model.head.state_dict(), expected.head.state_dict()
    pooler = {key for key in head if key.startswith("pooler.")}  # BERT's pooler comes from the saved model
    assert pooler and all(torch.equal(head[key], expected_head[key]) for key in head.keys() - pooler)


def test_a_weight_stored_once_for_two_names_that_the_model_no_longer_ties_is_refused(saved: dict,
                                                                                     tmp_path: Path) -> None:
    """The MLM decoder is stored once, as the word embeddings; a description edited to untie them would leave the
    decoder unread (the memory it was built with, now that loading draws nothing): one line, not a model."""
    edited = tmp_path / "edited"
    edited.mkdir()
    for path in Path(saved["pretrained_dir"]).iterdir():  # type: ignore[arg-type]
        (edited / path.name).write_bytes(path.read_bytes())
    description = json.loads((edited / "bertforge_model.json").read_text(encoding="utf-8"))
    assert "mlm_head.decoder.weight" in description["tied_weights"]
    description["encoder_config"]["tie_word_embeddings"] = False
    (edited / "bertforge_model.json").write_text(json.dumps(description), encoding="utf-8")
    with pytest.raises(BertforgeError, match="missing \\['mlm_head.decoder.weight'\\].*modified or is corrupt"):
        load_bertforge_model(edited)
