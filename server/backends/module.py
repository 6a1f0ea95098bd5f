"""A model.py run as a module of its own, shared by both python APIs: ours (server/backends/python.py)
and Triton's (server/backends/triton_python.py), which `ModelModule.uses_triton_api` tells apart.

Before model.py runs, what model files written for other servers import is made importable:
Triton's `triton_python_backend_utils` (ours, server/backends/pb_utils.py, given the host for BLS) and
grps's `grps_framework.monitor.monitor.app_monitor` (the host's, server/app_monitor.py).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tensorgate.server.backends.pb_utils as pb_utils
from tensorgate.server.app_monitor import AppMonitor, app_monitor

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Host

CLASS_NAMES = ("TritonPythonModel", "Model")
TRITON_UTILS = "triton_python_backend_utils"
GRPS_MONITOR = "grps_framework.monitor.monitor"

# grps's monitor module as model code imports it: `app_monitor` (the host's) and its class.
_grps_monitor = types.ModuleType(GRPS_MONITOR)
_grps_monitor.AppMonitor = AppMonitor  # type: ignore[attr-defined]
_grps_monitor.app_monitor = app_monitor  # type: ignore[attr-defined]


class ModelModule:
    """A model.py run as a module of its own (`tensorgate_models.<model>.v<version>`), and its class."""

    def __init__(self, version_dir: Path, config: dict, version: int, host: Host | None = None) -> None:
        path = version_dir / "model.py"
        if not path.is_file():
            raise FileNotFoundError(f"no model.py in {version_dir}")
        _install_aliases(host)
        self.name = f"tensorgate_models.{config['name']}.v{version}"
        self.path = path
        module = types.ModuleType(self.name)
        module.__file__ = str(path)
        previous = sys.modules.get(self.name)  # a version being reloaded keeps serving meanwhile
        sys.modules[self.name] = module  # lets dataclasses/pickle inside model.py resolve the module
        try:
            # Compiled from the source every time: no __pycache__ written into the repository, and no
            # stale bytecode when model.py changes within the same second at the same size.
            exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
        except BaseException:
            _restore_module(self.name, module, previous)
            raise
        self.module = module
        self.uses_triton_api = any(  # `import ... as pb_utils`, or `from ... import InferenceResponse`
            value is pb_utils or getattr(value, "__module__", None) in pb_utils.API_MODULES
            for value in vars(module).values()
        )
        self.model_class = _model_class(module, path)

    def close(self) -> None:
        _restore_module(self.name, self.module, None)

    def unload(self, model: Any) -> None:
        """The model's `finalize`, if it has one, then the module is forgotten."""
        try:
            if hasattr(model, "finalize"):
                model.finalize()
        finally:
            self.close()


def use_app_monitor(monitor: AppMonitor) -> None:
    """Where grps's `app_monitor` records, for model code (a model's process forwards it to the server)."""
    _grps_monitor.app_monitor = monitor  # type: ignore[attr-defined]


def _install_aliases(host: Host | None) -> None:
    """What model.py files written for other servers import, found here, pointed at the host: Triton's
    `triton_python_backend_utils` and grps's `grps_framework.monitor.monitor.app_monitor`. Without a
    host (a backend loaded alone) BLS is refused and app_monitor is the process's."""
    sys.modules.setdefault(TRITON_UTILS, pb_utils)
    if host is not None:
        pb_utils.attach_host(host)
        _grps_monitor.app_monitor = host.app_monitor  # type: ignore[attr-defined]
    if GRPS_MONITOR not in sys.modules:
        parts = GRPS_MONITOR.split(".")
        for depth in range(1, len(parts)):
            package = ".".join(parts[:depth])
            if package not in sys.modules:
                stub = types.ModuleType(package)
                stub.__path__ = []  # a package: its submodules import
                sys.modules[package] = stub
        sys.modules[GRPS_MONITOR] = _grps_monitor


def _model_class(module: Any, path: Path) -> type:
    for name in CLASS_NAMES:
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            return cls
    candidates = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and (hasattr(obj, "execute") or hasattr(obj, "execute_stream"))
    ]
    if len(candidates) != 1:
        raise TypeError(
            f"{path} must define one model class (TritonPythonModel or Model) with execute() "
            "or execute_stream()"
        )
    return candidates[0]


def _restore_module(name: str, mine: types.ModuleType, previous: types.ModuleType | None) -> None:
    """Unregisters `mine` unless a newer load of the same version has taken its place."""
    if sys.modules.get(name) is mine:
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
