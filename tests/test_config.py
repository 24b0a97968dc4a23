"""The typed config tree: YAML + `extends` + dotted overrides, validation, round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.config import Config, config_to_yaml, load_config
from bertforge.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_yaml_extends_and_overrides_merge_in_order(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", "optim:\n  lr: 1.0e-3\n  weight_decay: 0.1\ndata:\n  seq_len: 256\n")
    recipe = write(tmp_path / "recipe.yaml", "extends: base.yaml\noptim:\n  lr: 3.0e-4\n")
    config = load_config(recipe, ["data.seq_len=64", "train.max_steps=7"])
    assert config.optim.lr == pytest.approx(3e-4)  # the file beats its parent
    assert config.optim.weight_decay == pytest.approx(0.1)  # inherited from the parent
    assert config.data.seq_len == 64  # the override beats both
    assert config.train.max_steps == 7
    assert config.run.seed == Config().run.seed  # untouched keys keep their defaults


def test_unknown_key_suggests_the_closest_valid_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key `optim.lrr`.*did you mean `optim.lr`"):
        load_config(None, ["optim.lrr=1e-4"])
    recipe = write(tmp_path / "typo.yaml", "train:\n  micro_batch_sise: 8\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.*did you mean `train.micro_batch_size`"):
        load_config(recipe)


def test_misspelled_section_suggests_the_full_key() -> None:
    with pytest.raises(ConfigError, match=r"did you mean `optim.lr`"):
        load_config(None, ["optimm.lr=1e-4"])


def test_a_glue_key_of_the_old_finetune_section_fails_naming_where_it_moved(tmp_path: Path) -> None:
    old = write(tmp_path / "old.yaml", "finetune:\n  max_length: 64\n  glue_seeds: 1\n")
    with pytest.raises(ConfigError, match=r"`finetune.glue_seeds` in .*old.yaml has moved to `glue.seeds`") as error:
        load_config(old)
    assert "\n" not in str(error.value)
    for override, new_key in [("finetune.glue_tasks=[rte]", "glue.tasks"),
                              ("finetune.glue_from_mnli=true", "glue.from_mnli"),
                              ("finetune.glue_overrides={rte: [optim.lr=2e-5]}", "glue.overrides.rte")]:
        with pytest.raises(ConfigError, match=rf"has moved to `{new_key}`"):
            load_config(None, [override])
    moved = load_config(None, ["glue.tasks=[rte]", "glue.seeds=1", "glue.from_mnli=true",
                               "glue.overrides={rte: [optim.lr=2e-5]}"]).glue
    assert (moved.tasks, moved.seeds, moved.from_mnli, moved.overrides) == (["rte"], 1, True, {"rte": ["optim.lr=2e-5"]})


def test_wrong_type_names_the_key_and_expected_type() -> None:
    with pytest.raises(ConfigError, match=r"`optim.lr`.*Float"):
        load_config(None, ["optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"`train.max_steps`.*Integer"):
        load_config(None, ["train.max_steps=many"])


def test_values_out_of_range_or_not_a_choice_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"`data.mask_prob` is 1.5"):
        load_config(None, ["data.mask_prob=1.5"])
    with pytest.raises(ConfigError, match=r"`optim.name` is 'adam'.*adamw"):
        load_config(None, ["optim.name=adam"])
    with pytest.raises(ConfigError, match=r"key=value"):
        load_config(None, ["optim.lr"])


def test_print_config_output_loads_back_to_an_equal_config(tmp_path: Path) -> None:
    config = load_config(None, ["optim.lr=2e-5", "finetune.classification.label_map={'1': negative, '5': positive}",
                                "model.hidden_size=64", "optim.betas=[0.9,0.95]"])
    saved = write(tmp_path / "resolved.yaml", config_to_yaml(config))
    assert load_config(saved) == config


def test_bad_yaml_and_missing_file_name_the_file(tmp_path: Path) -> None:
    broken = write(tmp_path / "broken.yaml", "optim:\n  lr: [1\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: not valid YAML"):
        load_config(broken)
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_extends_cycle_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_a_run_saved_by_an_earlier_version_still_loads_and_resumes_while_a_user_config_is_told_what_changed(
        tmp_path: Path) -> None:
    import yaml

    from bertforge.config import load_run_config
    from bertforge.train.resume_config import check_resumed_config

    # what an earlier bertforge saved in a run directory: data.packing and finetune.glue_* were in every config.yaml
    tree = yaml.safe_load(config_to_yaml(load_config(None, ["glue.seeds=3"])))
    tree["data"]["packing"] = True
    tree["finetune"] |= {f"glue_{name}": value for name, value in tree.pop("glue").items()}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(tree), encoding="utf-8")
    assert load_run_config(run_dir / "config.yaml").glue.seeds == 3
    check_resumed_config(run_dir, load_config(None, ["glue.seeds=3"]), write=True)  # the same run: no change
    assert not list(run_dir.glob("config-resume-*.yaml"))
    with pytest.raises(ConfigError, match=r"`data.packing` in .* was removed \(.*\); delete it"):
        load_config(run_dir / "config.yaml")


@pytest.mark.parametrize(("key", "value", "task_type"), [
    ("embedding.negative_column", "hard_negative", "embedding"), ("embedding.similarity_scale", "50.0", "embedding"),
    ("embedding.normalize", "true", "embedding"), ("embedding.loss", "cosine", "embedding"),
    ("tagging.tokens_column", "words", "token_classification"), ("tagging.tags_column", "ner", "token_classification"),
    ("classification.class_weights", "[1.0,2.0]", "classification"),
    ("classification.label_map", "{a: b}", "classification")])
def test_a_key_of_another_task_type_is_an_error_not_silently_ignored(key: str, value: str, task_type: str) -> None:
    others = {"classification", "regression", "embedding", "token_classification"} - {task_type}
    for other in sorted(others):
        with pytest.raises(ConfigError, match=rf"`finetune\.{key}`.*task_type={task_type} \(this run's is {other}\)"):
            load_config(None, [f"finetune.task_type={other}", f"finetune.{key}={value}"])
    section, name = key.split(".")
    assert getattr(getattr(load_config(None, [f"finetune.task_type={task_type}", f"finetune.{key}={value}"]).finetune,
                           section), name) is not None


@pytest.mark.parametrize(("key", "value", "task_type"), [
    ("labels", "[a,b]", "embedding"), ("labels", "[a,b]", "regression"), ("text_pair_column", "b", "token_classification"),
    ("label_column", "y", "token_classification"), ("delimiter", "';'", "token_classification")])
def test_a_shared_key_the_task_type_does_not_read_is_an_error(key: str, value: str, task_type: str) -> None:
    with pytest.raises(ConfigError, match=rf"`finetune\.{key}`.*task_type={task_type} does not read it"):
        load_config(None, [f"finetune.task_type={task_type}", f"finetune.{key}={value}"])


@pytest.mark.parametrize(("old", "new"), [
    ("label_map", "classification.label_map"), ("class_weights", "classification.class_weights"),
    ("tokens_column", "tagging.tokens_column"), ("tags_column", "tagging.tags_column"),
    ("embedding_loss", "embedding.loss"), ("negative_column", "embedding.negative_column"),
    ("similarity_scale", "embedding.similarity_scale"), ("normalize_embeddings", "embedding.normalize")])
def test_a_moved_finetune_key_says_where_it_went(old: str, new: str, tmp_path: Path) -> None:
    recipe = write(tmp_path / "old.yaml", f"finetune:\n  {old}: x\n")
    with pytest.raises(ConfigError, match=rf"`finetune\.{old}` in .* has moved to `finetune\.{new}`; use that key"):
        load_config(recipe)
