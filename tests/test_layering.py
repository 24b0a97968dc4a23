"""`models/` is network code: it imports nothing of bertforge above it (config, locate, data, tasks, train,
commands, the run directory), only itself and a few leaf utilities that import nothing else of bertforge.
Read from the source with `ast`, so an import inside a function or under TYPE_CHECKING counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import bertforge

PACKAGE = Path(bertforge.__file__).parent
# what models/ may use besides itself: leaves of the package (errors, logging, disk writes, size checks, a
# tokenizer's special tokens)
LEAF_MODULES = {"bertforge.errors", "bertforge.console", "bertforge.disk", "bertforge.size_limits",
                "bertforge.special_tokens"}
LEAF_NAMES = {"bertforge.__version__"}  # `from bertforge import __version__`: a constant of the package's __init__


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bertforge_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Every bertforge module the code `source` of module `module` imports (relative imports resolved;
    `from bertforge import NAME` as `bertforge.NAME`), wherever the import statement stands."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found += [f"{base}.{alias.name}" if base == "bertforge" else base for alias in node.names]
    return [name for name in found if name == "bertforge" or name.startswith("bertforge.")]


def imports_of(path: Path) -> list[str]:
    return bertforge_imports(path.read_text(encoding="utf-8"), module_name(path), is_package=path.name == "__init__.py")


def allowed_for_models(name: str) -> bool:
    return name.startswith("bertforge.models.") or name == "bertforge.models" or name in LEAF_MODULES | LEAF_NAMES


def test_models_import_nothing_above_them() -> None:
    files = sorted((PACKAGE / "models").rglob("*.py"))
    assert len(files) > 10  # the scan reads the real package
    upward = [f"{path.relative_to(PACKAGE.parent)} imports {name}"
              for path in files for name in imports_of(path) if not allowed_for_models(name)]
    assert upward == []


def test_the_leaves_models_use_import_only_leaves() -> None:
    for name in sorted(LEAF_MODULES):
        path = PACKAGE / f"{name.removeprefix('bertforge.').replace('.', '/')}.py"
        assert [imported for imported in imports_of(path) if imported not in LEAF_MODULES] == [], name


def test_the_scan_sees_imports_in_functions_relative_imports_and_type_checking_blocks() -> None:
    probe = ("from typing import TYPE_CHECKING\nfrom . import heads\nfrom ..config import Config\n"
             "if TYPE_CHECKING:\n    from bertforge.locate import resolve_model\n"
             "def f():\n    import bertforge.train.trainer\n    from bertforge import errors\n")
    names = bertforge_imports(probe, "bertforge.models.config")
    assert sorted(names) == ["bertforge.config", "bertforge.errors", "bertforge.locate", "bertforge.models",
                             "bertforge.train.trainer"]
    assert sorted(name for name in names if not allowed_for_models(name)) == [
        "bertforge.config", "bertforge.locate", "bertforge.train.trainer"]
