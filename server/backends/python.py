"""The python backend: `<version>/model.py` defines a model class.

The class is `TritonPythonModel` or `Model`, or else the one class in the module with `execute` or
`execute_stream`:

    class Model:
        def initialize(self, config: dict) -> None: ...            # optional; the model config as JSON
        def execute(self, inputs: dict[str, Array]) -> dict[str, Array]: ...
        def finalize(self) -> None: ...                             # optional
        async def execute_stream(self, inputs): yield {...}        # optional: one answer per yield

With max_batch_size > 0 every array carries the leading batch dimension. Arrays are numpy by default;
the config parameter `array_module` asks for torch tensors or CuPy arrays (batcher/staging.py). A model
staged on a GPU runs in the batcher's worker threads, one per instance, all calling this one object.
Input arrays may be read-only views of the request: a model copies before writing in place. `execute`
may be `async def`.

A model.py that imports `triton_python_backend_utils` is a model written for Triton's python backend and
gets Triton's API instead (`execute(requests)`, server/backends/triton_python.py): a repository moved
from Triton runs unchanged, and our own API stays for models that want whole batches as arrays.

A streaming model defines the async generator `execute_stream`: streaming clients (grps streaming, v2
ModelStreamInfer) receive each yield as it comes; a client that goes away closes the generator. Such a
model may omit `execute`; plain infer then answers 400. A model may define `handle_http(http)` to
answer grps customized HTTP (server/endpoints/customized.py).
"""

import inspect
import sys
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from codec.errors import ErrorKind, InferError

CLASS_NAMES = ("TritonPythonModel", "Model")
TRITON_UTILS = "triton_python_backend_utils"
GRPS_MONITOR = "grps_framework.monitor.monitor"


def load_python(version_dir: Path, config: dict, version: int) -> Any:
    """The model.py of a version folder: Triton's API when it imports `triton_python_backend_utils`
    (server/backends/triton_python.py), else ours."""
    module = ModelModule(version_dir, config, version)
    try:
        if module.uses_triton_api:
            from server.backends.triton_python import TritonPythonBackend

            return TritonPythonBackend(module, config, version)
        return PythonBackend(module, config)
    except BaseException:
        module.close()
        raise


class ModelModule:
    """A model.py run as a module of its own (`tensorgate_models.<model>.v<version>`), and its class."""

    def __init__(self, version_dir: Path, config: dict, version: int) -> None:
        path = version_dir / "model.py"
        if not path.is_file():
            raise FileNotFoundError(f"no model.py in {version_dir}")
        from server.backends import pb_utils

        _install_aliases()
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
            value is pb_utils or getattr(value, "__module__", None) == pb_utils.__name__
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


class PythonBackend:
    def __init__(self, module: ModelModule, config: dict) -> None:
        self._module = module
        path = module.path
        self.model = module.model_class()
        if hasattr(self.model, "initialize"):
            self.model.initialize(config)
        execute = getattr(self.model, "execute", None)
        self.stream_only = execute is None  # the server refuses a plain infer before it is counted
        execute = execute or _no_execute(config["name"])
        self.is_async = inspect.iscoroutinefunction(execute)
        # inputs -> outputs dict (an awaitable of it when async); bound directly: one call less per batch
        self.execute: Callable[[dict[str, Any]], Any] = execute
        stream = getattr(self.model, "execute_stream", None)
        if stream is not None and not inspect.isasyncgenfunction(stream):
            raise TypeError(f"{path}: execute_stream must be an async generator (async def with yield)")
        self.execute_stream: Callable[[dict[str, Any]], AsyncIterator[Any]] | None = stream
        # grps customized HTTP (server/endpoints/customized.py): handle_http(http), plain or async
        self.handle_http: Callable[[Any], Any] | None = getattr(self.model, "handle_http", None)

    def close(self) -> None:
        self._module.unload(self.model)


def _install_aliases() -> None:
    """What model.py files written for other servers import, found here: Triton's
    `triton_python_backend_utils` (ours, server/backends/pb_utils.py) and grps's
    `grps_framework.monitor.monitor.app_monitor` (server/monitor.py)."""
    from server import monitor
    from server.backends import pb_utils

    sys.modules.setdefault(TRITON_UTILS, pb_utils)
    if GRPS_MONITOR not in sys.modules:
        parts = GRPS_MONITOR.split(".")
        for depth in range(1, len(parts)):
            package = ".".join(parts[:depth])
            if package not in sys.modules:
                stub = types.ModuleType(package)
                stub.__path__ = []  # a package: its submodules import
                sys.modules[package] = stub
        sys.modules[GRPS_MONITOR] = monitor


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


def stream_only_error(model: str) -> InferError:
    return InferError(
        ErrorKind.INVALID_ARGUMENT,
        f"model '{model}' only streams its answers: use grps streaming or gRPC ModelStreamInfer",
    )


def _no_execute(model: str) -> Callable[[dict[str, Any]], Any]:
    def execute(inputs: dict[str, Any]) -> Any:
        raise stream_only_error(model)

    return execute
