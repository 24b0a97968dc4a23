"""Start-up of `predict`/`embed`: loading a model imports neither torch._dynamo nor a `transformers` modeling module,
`predict` on a bertforge model directory does not import `transformers` at all (yet a later import of it is quieted
as the CLI asks), and reading a Hugging Face directory without its `transformers` class gives the weights `from_pretrained` gives.

Checked by what a fresh interpreter has imported (`sys.modules`), not by time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from helpers.models import minilm_sized_config
from safetensors.torch import load_file, save_file

from bertforge.models import (
    BertforgeForSequenceClassification,
    attention,
    disentangled_attention,
    save_bertforge_model,
)
from bertforge.models.compile_boundaries import apply_compile_boundaries
from bertforge.models.hf import from_hf, load_hf_checkpoint

TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=40, num_labels=3)
CASES = [("Bert", transformers.BertConfig, {}),
         ("Roberta", transformers.RobertaConfig, {"pad_token_id": 1, "type_vocab_size": 1}),
         ("DistilBert", transformers.DistilBertConfig, {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48}),
         ("Electra", transformers.ElectraConfig, {"embedding_size": 16})]
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]


def saved_hf_model(directory: Path, prefix: str, config_class: type, settings: dict[str, object],
                   head: str) -> Path:
    torch.manual_seed(0)
    getattr(transformers, prefix + head)(config_class(**TINY | settings)).save_pretrained(str(directory))
    return directory


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()}


def test_loading_minilm_for_inference_imports_no_dynamo_and_no_modeling_module(minilm_dir: Path) -> None:
    # a family's modeling module (transformers.models.bert.modeling_bert), not auto's name tables
    probe = (
        "import json, sys\n"
        "from bertforge.inference import load_model\n"
        f"load_model({str(minilm_dir)!r})\n"
        "print(json.dumps(sorted(name for name in sys.modules if name.startswith('torch._dynamo')"
        " or ('.modeling_' in name and name.startswith('transformers.models.') and '.auto.' not in name))))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_predict_on_a_bertforge_model_imports_no_transformers_and_quiets_it_once_imported(tmp_path: Path,
                                                                                         minilm_dir: Path) -> None:
    torch.manual_seed(0)
    model = BertforgeForSequenceClassification(minilm_sized_config(), 2, "classification", ["no", "yes"])
    directory = save_bertforge_model(model.eval(), tmp_path / "model", minilm_dir)
    texts = tmp_path / "texts.txt"
    texts.write_text("a first text\nand a second one\n", encoding="utf-8")
    probe = (
        "import json, sys\n"
        "from bertforge.cli import main\n"
        f"code = main(['predict', {str(directory)!r}, '--input', {str(texts)!r}, '--out', "
        f"{str(tmp_path / 'out.jsonl')!r}, '-q'])\n"
        "imported = sorted(name for name in sys.modules if name == 'transformers' or name.startswith('torch._dynamo'))\n"
        "from transformers.utils import logging\n"
        "print(json.dumps([code, imported, logging.get_verbosity(), logging.is_progress_bar_enabled()]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    code, imported, verbosity, progress_bars = json.loads(result.stdout.strip().splitlines()[-1])
    assert (code, imported) == (0, [])
    assert (verbosity, progress_bars) == (transformers.logging.ERROR, False)  # quiet_transformers, applied late
    assert len((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()) == 2


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize(("prefix", "config_class", "settings"), CASES, ids=[case[0] for case in CASES])
def test_a_directory_read_without_its_class_gives_the_weights_from_pretrained_gives(
        tmp_path: Path, prefix: str, config_class: type, settings: dict[str, object], head: str) -> None:
    directory = saved_hf_model(tmp_path / "hf", prefix, config_class, settings, head)
    torch.manual_seed(1)
    direct = load_hf_checkpoint(directory)
    after_direct = torch.rand(4)
    torch.manual_seed(1)
    hf_model = getattr(transformers, prefix + head).from_pretrained(str(directory))
    through_class = from_hf(hf_model)
    after_class = torch.rand(4)
    assert type(direct) is type(through_class)
    expected = state_of(through_class)
    assert direct.state_dict().keys() == expected.keys()
    for key, value in direct.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert torch.equal(after_direct, after_class)  # the same draws follow: training seeds before it loads


def test_a_checkpoint_lacking_a_head_weight_is_loaded_by_from_pretrained_with_the_same_draws(tmp_path: Path) -> None:
    directory = saved_hf_model(tmp_path / "hf", "Bert", transformers.BertConfig, {}, "ForSequenceClassification")
    weights = directory / "model.safetensors"
    save_file({key: value for key, value in load_file(str(weights)).items() if not key.startswith("classifier.")},
              str(weights), metadata={"format": "pt"})
    torch.manual_seed(2)
    loaded = load_hf_checkpoint(directory)
    torch.manual_seed(2)
    expected = from_hf(transformers.BertForSequenceClassification.from_pretrained(str(directory)))
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, expected.state_dict()[key]), key


def test_compile_boundaries_wrap_the_bookkeeping_in_torch_compiler_disable() -> None:
    apply_compile_boundaries()
    assert getattr(attention.place_in_rows, "_torchdynamo_disable", False)
    assert getattr(disentangled_attention.RelativeLayout.build, "_torchdynamo_disable", False)
