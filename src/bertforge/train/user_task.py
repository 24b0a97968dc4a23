"""Load a user's `Task` class from `path/to/file.py:ClassName` or `package.module:ClassName`."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.train.task import Task


def load_task_class(reference: str) -> type[Task]:
    if ":" not in reference:
        raise BertforgeError(f"--task {reference!r} must look like path/to/file.py:ClassName or module:ClassName")
    location, class_name = reference.rsplit(":", 1)
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise BertforgeError(f"--task: file {path} does not exist")
        spec = importlib.util.spec_from_file_location(f"bertforge_user_task_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # worker processes and pickling find the module by name
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            raise BertforgeError(f"--task: cannot import module {location!r} ({error})") from None
    task_class = getattr(module, class_name, None)
    if task_class is None:
        raise BertforgeError(f"--task: {location} has no class {class_name!r}")
    if not (isinstance(task_class, type) and issubclass(task_class, Task)):
        raise BertforgeError(f"--task: {class_name} in {location} is not a subclass of bertforge.train.task.Task")
    return task_class
