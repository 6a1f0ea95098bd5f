"""TENSORGATE_PURE_PYTHON=1: every module of ours runs from its .py source, even where the build compiled
it (setup.py: the hot path, compiled with Cython beside its source). The compiled and the pure-Python runs
behave the same; `make test` runs the unit tests and an end-to-end pass both ways."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


def wanted() -> bool:
    return os.environ.get("TENSORGATE_PURE_PYTHON", "") not in ("", "0")


class SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds our modules as the path finder does, but takes a compiled module's .py beside it instead."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is None or not fullname.startswith("tensorgate."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return spec
        folder, compiled = os.path.split(spec.origin or "")
        source = os.path.join(folder, compiled.partition(".")[0] + ".py")
        return importlib.util.spec_from_file_location(fullname, source) if os.path.exists(source) else spec


def install() -> None:
    """Puts the finder first (once); modules imported before it stay as they were loaded."""
    if not any(isinstance(finder, SourcesFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourcesFirst())


def is_compiled(module: ModuleType) -> bool:
    """Whether `module` runs from a compiled build."""
    return not (module.__file__ or "").endswith(".py")
