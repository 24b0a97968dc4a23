"""A task kind's name appears only in its registry record, its own modules and the config (issue 35): no
command, loader, exporter or model-family adapter branches on a kind's name; they look the kind up.
Read from the source with `ast`, so comments and docstrings do not count, a string equal to a name does."""

from __future__ import annotations

import ast
from pathlib import Path

import bertforge
from bertforge.tasks.kinds import KINDS

PACKAGE = Path(bertforge.__file__).parent
EVERY_KIND = {"config.py"}  # finetune.task_type's choices and each one's keys; the records live in tasks/kinds/
CLASSIFICATION = {"tasks/classify.py", "models/classification.py", "data/labels.py", "data/labeled.py",
                  "tasks/metrics.py", "tasks/evaluation.py", "tasks/glue_tasks.py"}
OWN_MODULES = {
    "classification": CLASSIFICATION,
    "regression": CLASSIFICATION | {"tasks/embedding.py"},  # the cosine loss is scored by the regression metrics
    "token_classification": {"tasks/tagging.py", "models/token_classification.py"},
    "embedding": {"tasks/embedding.py", "models/embedding.py",
                  "data/labels.py",  # names finetune.embedding.*, the sub-section negative_column lives in
                  "serving/app.py"},  # OpenAI's embeddings API calls each vector an object of type "embedding"
    "multiple_choice": {"tasks/multiple_choice.py"},
}


def kind_names_in(path: Path, names: set[str]) -> set[str]:
    """The `names` that are string constants of the module at `path` (a comment or a longer text is not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names}


def test_every_kind_name_is_listed_here() -> None:
    assert {name for kind in KINDS for name in (kind.name, *kind.task_types)} == set(OWN_MODULES)


def test_a_kind_is_named_only_in_its_record_its_own_modules_and_the_config() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the scan reads the real package
    stray = []
    for path in files:
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("tasks/kinds/") or relative in EVERY_KIND:
            continue
        stray += [f"{relative} names {name!r}" for name in sorted(kind_names_in(path, set(OWN_MODULES)))
                  if relative not in OWN_MODULES[name]]
    assert stray == []


def test_the_scan_sees_a_kind_named_outside_its_modules(tmp_path: Path) -> None:
    family = tmp_path / "family.py"
    family.write_text('"""The docstring may say token_classification."""\n'
                      'def class_for(kind):\n    return "BertForTokenClassification" if kind == "token_classification" '
                      'else None\n', encoding="utf-8")
    assert kind_names_in(family, set(OWN_MODULES)) == {"token_classification"}
