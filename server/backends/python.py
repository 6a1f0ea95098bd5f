"""The python backend: `<version>/model.py` defines a model class.

The class is `TritonPythonModel` or `Model`, or else the one class in the module with `execute` or `execute_stream`:

    class Model:
        def initialize(self, config: dict) -> None: ...            # optional; the model config as JSON
        def execute(self, inputs: dict[str, Array]) -> dict[str, Array]: ...
        def finalize(self) -> None: ...                             # optional
        async def execute_stream(self, inputs): yield {...}        # optional: one answer per yield

With max_batch_size > 0 every array carries the leading batch dimension. Arrays are numpy on the host;
later device staging hands CuPy arrays or torch tensors with the same interface. Input arrays may be
read-only views of the request: a model copies before writing in place. `execute` may be `async def`.

A streaming model defines the async generator `execute_stream`: streaming clients (grps streaming, v2
ModelStreamInfer) receive each yield as it comes; a client that goes away closes the generator. Such a
model may omit `execute`; plain infer then answers 400.
"""

import importlib.util
import inspect
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from codec.errors import ErrorKind, InferError

CLASS_NAMES = ("TritonPythonModel", "Model")


class PythonBackend:
    def __init__(self, version_dir: Path, config: dict, version: int) -> None:
        path = version_dir / "model.py"
        if not path.is_file():
            raise FileNotFoundError(f"no model.py in {version_dir}")
        module_name = f"tensorgate_models.{config['name']}.v{version}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # lets dataclasses/pickle inside model.py resolve the module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        self._module_name = module_name
        self.model = _model_class(module, path)()
        if hasattr(self.model, "initialize"):
            self.model.initialize(config)
        execute = getattr(self.model, "execute", None) or _no_execute(config["name"])
        self.is_async = inspect.iscoroutinefunction(execute)
        # inputs -> outputs dict (an awaitable of it when async); bound directly: one call less per batch
        self.execute: Callable[[dict[str, Any]], Any] = execute
        stream = getattr(self.model, "execute_stream", None)
        if stream is not None and not inspect.isasyncgenfunction(stream):
            raise TypeError(f"{path}: execute_stream must be an async generator (async def with yield)")
        self.execute_stream: Callable[[dict[str, Any]], AsyncIterator[Any]] | None = stream

    def close(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                self.model.finalize()
        finally:
            sys.modules.pop(self._module_name, None)


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


def _no_execute(model: str) -> Callable[[dict[str, Any]], Any]:
    def execute(inputs: dict[str, Any]) -> Any:
        raise InferError(
            ErrorKind.INVALID_ARGUMENT,
            f"model '{model}' only streams its answers: use grps streaming or gRPC ModelStreamInfer",
        )

    return execute
