"""A fine-tune whose tokenizer gives ids past the model's embedding table is refused in one line before training.

Without the check the run ended in "internal error: IndexError: index out of range" in the first step, e.g.
`finetune model.init_from=<a run pre-trained on a 2,048-token vocabulary> model.tokenizer=<MiniLM's>`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import error_line
from helpers.finetuning import QUIET_RUN, TINY_MODEL, minilm_dir, supersense_files


@pytest.fixture(scope="module")
def small_vocabulary_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Hugging Face BERT with 128 token embeddings, saved as a user's checkpoint would be."""
    import transformers

    directory = tmp_path_factory.mktemp("small-vocabulary-bert")
    config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(directory)
    return directory


def run_arguments(tmp_path: Path, *overrides: str) -> list[str]:
    recipe = tmp_path / "run.yaml"
    recipe.write_text("finetune:\n  task_type: classification\n", encoding="utf-8")
    return ["finetune", str(recipe), f"run.output_dir={tmp_path}", "run.name=vocabulary", "finetune.max_length=32", *QUIET_RUN,
            *supersense_files(tmp_path / "data", 16, 8, 8), *overrides]


def test_a_checkpoint_with_fewer_embeddings_than_the_given_tokenizer_is_refused_naming_both(
        tmp_path: Path, small_vocabulary_bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, *run_arguments(tmp_path, f"model.init_from={small_vocabulary_bert}",
                                             f"model.tokenizer={minilm_dir()}"))
    assert f"model.init_from ({small_vocabulary_bert}) has 128 token embeddings" in line
    assert "30522 tokens" in line and "model.tokenizer" in line
    assert not (tmp_path / "vocabulary" / "final").exists()


def test_a_from_scratch_vocab_size_below_the_tokenizers_is_refused_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, *run_arguments(tmp_path, *TINY_MODEL, "model.vocab_size=64",
                                             f"model.tokenizer={minilm_dir()}"))
    assert "model.vocab_size is 64" in line and "at least 30522" in line
