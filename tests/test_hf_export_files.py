"""The export writes what `save_pretrained` of the stock `transformers` model writes, without building that model.

For every family and every class it exports as (tied and untied MLM decoders, a bare BERT with and without its
pooler), a tiny random model made by `transformers` is imported, then written twice: by `write_hf_model` and by
`to_hf_model(...).save_pretrained` (the stock model holding the same weights). The two directories must hold the
same files, the same tensor names with bitwise-equal tensors and the same safetensors metadata, equal config.json
objects; ours must load in the stock class with nothing missing and give the stock model's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

import bertforge.tasks.kinds  # noqa: F401  (registers the heads a task kind's own module defines: multiple choice)
from bertforge.models import hf
from bertforge.models.families import FAMILIES
from bertforge.models.hf import from_hf, hf_class_name, to_hf_model, write_hf_model

SHARED = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              num_labels=3, max_position_embeddings=66)
# family -> (config class, the settings beyond the shared ones its tiny model needs)
CONFIGS: dict[str, tuple[type, dict[str, object]]] = {
    "bert": (transformers.BertConfig, {}),
    "deberta-v2": (transformers.DebertaV2Config, dict(relative_attention=True, legacy=False, position_buckets=256,
                                                      max_relative_positions=-1, share_att_key=True,
                                                      norm_rel_ebd="layer_norm", position_biased_input=False,
                                                      pos_att_type=["p2c", "c2p"], type_vocab_size=0)),
    "modernbert": (transformers.ModernBertConfig, dict(num_hidden_layers=4, pad_token_id=0, bos_token_id=1,
                                                       eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                                       local_attention=8, global_attn_every_n_layers=2)),
    "roberta": (transformers.RobertaConfig, dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)),
    "xlm-roberta": (transformers.XLMRobertaConfig, dict(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                                        type_vocab_size=1)),
    "camembert": (transformers.CamembertConfig, dict(pad_token_id=1, bos_token_id=5, eos_token_id=6)),
    "distilbert": (transformers.DistilBertConfig, dict(dim=32, n_layers=2, n_heads=4, hidden_dim=48)),
    "electra": (transformers.ElectraConfig, dict(embedding_size=24)),
    "mpnet": (transformers.MPNetConfig, dict(pad_token_id=1)),
}
# every class each family exports as (a class that imports as another head, ELECTRA's discriminator, exports as that)
CASES = [(family.name, hf_class, tied) for family in FAMILIES.values() for hf_class in family.head_keys
         if family.head_suffix(hf_class) == hf_class.removeprefix(family.hf_prefix)
         for tied in ((True, False) if hf_class.endswith("ForMaskedLM") else (True,))]
CASES.append(("bert", "BertModel-no-pooler", True))
SPECIAL_TOKENS = {"pad": 0, "cls": 1, "sep": 2, "mask": 3}


def tiny_model(family: str, hf_class: str, tied: bool) -> torch.nn.Module:
    config_class, settings = CONFIGS[family]
    pooler = not hf_class.endswith("-no-pooler")
    hf_class = hf_class.removesuffix("-no-pooler")
    torch.manual_seed(0)
    config = config_class(**(SHARED | settings | {"tie_word_embeddings": tied}))
    cls = getattr(transformers, hf_class)
    hf_model = cls(config) if pooler else cls(config, add_pooling_layer=False)
    with torch.no_grad():  # no weight left at its initial zero or one, so a swapped or dropped tensor shows
        for parameter in hf_model.parameters():
            parameter.normal_(0.0, 0.2)
    return from_hf(hf_model.eval()).eval()


def tensors_of(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    with safe_open(str(path), framework="pt") as weights:
        return {key: weights.get_tensor(key) for key in weights.keys()}, weights.metadata()  # noqa: SIM118


@pytest.mark.parametrize(("family", "hf_class", "tied"), CASES,
                         ids=[f"{hf_class}{'' if tied else '-untied'}" for _, hf_class, tied in CASES])
def test_the_export_writes_what_save_pretrained_of_the_stock_model_writes(tmp_path: Path, family: str,
                                                                         hf_class: str, tied: bool) -> None:
    ours = tiny_model(family, hf_class, tied)
    exported_as = hf_class.removesuffix("-no-pooler")
    assert hf_class_name(ours) == (exported_as, "")
    written, reference = tmp_path / "written", tmp_path / "reference"
    written.mkdir()
    assert write_hf_model(ours, SPECIAL_TOKENS, written) == exported_as
    stock_model = to_hf_model(ours, SPECIAL_TOKENS).eval()
    stock_model.save_pretrained(str(reference))

    assert sorted(path.name for path in written.iterdir()) == sorted(path.name for path in reference.iterdir())
    ours_tensors, ours_metadata = tensors_of(written / "model.safetensors")
    their_tensors, their_metadata = tensors_of(reference / "model.safetensors")
    assert ours_metadata == their_metadata == {"format": "pt"}
    assert sorted(ours_tensors) == sorted(their_tensors)
    for key, tensor in their_tensors.items():
        assert ours_tensors[key].dtype == tensor.dtype and torch.equal(ours_tensors[key], tensor), key
    assert (json.loads((written / "config.json").read_text(encoding="utf-8"))
            == json.loads((reference / "config.json").read_text(encoding="utf-8")))

    stock = getattr(transformers, exported_as)
    arguments = {"add_pooling_layer": False} if hf_class.endswith("-no-pooler") else {}
    reloaded, loading = stock.from_pretrained(str(written), output_loading_info=True, **arguments)
    assert not loading["missing_keys"] and not loading["unexpected_keys"] and not loading["mismatched_keys"]
    choices = exported_as.endswith("ForMultipleChoice")
    ids = torch.randint(4, 96, (2, 3, 9) if choices else (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # the files are bitwise equal (above); the scores may differ in the last bit, because a CPU's matrix
        # kernels can round by where a tensor sits in memory (1 ulp, 3e-8, on an AMD EPYC for the
        # multiple-choice classes' one-output classifier)
        torch.testing.assert_close(reloaded.eval()(input_ids=ids)[0], stock_model(input_ids=ids)[0], rtol=0, atol=1e-6)


def test_a_model_over_the_single_file_limit_is_left_to_save_pretrained(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """save_pretrained shards a model over 50 GB; the export hands such a model to it rather than write one file."""
    monkeypatch.setattr(hf, "SINGLE_FILE_LIMIT_BYTES", 1)
    ours = tiny_model("bert", "BertForMaskedLM", True)
    assert write_hf_model(ours, SPECIAL_TOKENS, tmp_path) == "BertForMaskedLM"
    reloaded, loading = transformers.BertForMaskedLM.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    ids = torch.randint(4, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(input_ids=ids).logits, to_hf_model(ours).eval()(input_ids=ids).logits,
                                   rtol=0, atol=1e-6)  # as above: the last bit may follow memory placement
