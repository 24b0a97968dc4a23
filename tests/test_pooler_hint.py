"""Fine-tuning a classic BERT from a masked-LM-only checkpoint starts its classifier from a fresh pooler on a [CLS]
state no pre-training loss read; `bertforge finetune` says so and names `model.pooling=mean` (issue 40)."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from helpers.finetuning import run_config

from bertforge.tasks import classify
from bertforge.tasks.classify import ClassificationTask

LABELS = ["a", "b", "c"]
SIZES = {"vocab_size": 120, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "max_position_embeddings": 64}


def saved(directory: Path, model_class: type, config: transformers.PretrainedConfig) -> Path:
    transformers.set_seed(0)
    model_class(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    bert, roberta = transformers.BertConfig(**SIZES), transformers.RobertaConfig(**SIZES, pad_token_id=1)
    return {"mlm-only": saved(root / "mlm", transformers.BertForMaskedLM, bert),  # run_mlm.py's, bertforge's export
            "with-nsp": saved(root / "nsp", transformers.BertForPreTraining, bert),  # the Hub's BERTs: pooler trained
            "roberta": saved(root / "roberta", transformers.RobertaForMaskedLM, roberta)}


def warnings_starting_from(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           *overrides: str) -> list[str]:
    messages: list[str] = []
    monkeypatch.setattr(classify.log, "warning", messages.append)
    task = ClassificationTask(run_config(tmp_path / "run", f"model.init_from={checkpoint}", *overrides))
    task._model_from(str(checkpoint), "classification", len(LABELS), LABELS)
    return [message for message in messages if "no trained pooler" in message]


def test_a_masked_lm_only_bert_checkpoint_gets_the_hint_naming_mean_pooling_and_its_price(
        checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (message,) = warnings_starting_from(checkpoints["mlm-only"], tmp_path, monkeypatch)
    assert str(checkpoints["mlm-only"]) in message and "model.pooling=mean" in message
    assert "BertForSequenceClassification" in message and "«»" not in message


@pytest.mark.parametrize("case", ["with-nsp", "roberta", "pooler-asked-for", "mean-asked-for"])
def test_no_hint_where_the_pooler_was_trained_the_family_has_its_own_head_or_the_user_chose(
        case: str, checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = checkpoints["mlm-only" if case.endswith("asked-for") else case]
    chosen = {"pooler-asked-for": ("model.pooling=pooler",), "mean-asked-for": ("model.pooling=mean",)}.get(case, ())
    assert warnings_starting_from(checkpoint, tmp_path, monkeypatch, *chosen) == []
