"""The python backend: `<version>/model.py` defines a model class.

The class is `TritonPythonModel` or `Model`, or else the one class in the module with `execute` or
`execute_stream`:

    class Model:
        def initialize(self, config: dict) -> None: ...            # optional; the model config as JSON
        def execute(self, inputs: dict[str, Array]) -> dict[str, Array]: ...
        # or execute(self, inputs, parameters): also the request's custom parameters (a dict; requests
        # batch together only when theirs agree)
        def finalize(self) -> None: ...                             # optional
        async def execute_stream(self, inputs): yield {...}        # optional: one answer per yield

With max_batch_size > 0 every array carries the leading batch dimension. Arrays are numpy by default;
the config parameter `array_module` asks for torch tensors or CuPy arrays (batcher/staging.py). A model
staged on a GPU runs in the batcher's worker threads, one per instance, all calling this one object.
Input arrays may be read-only views of the request: a model copies before writing in place. `execute`
may be `async def`.

A model.py that imports `triton_python_backend_utils` is a model written for Triton's python backend and
gets Triton's API instead (`execute(requests)`, server/backends/triton_python.py): a repository moved
from Triton runs unchanged, and our own API stays for models that want whole batches as arrays. Where
the instances run (`execution_mode`) follows the API by default: Triton's in processes, as Triton runs
them; ours in threads.

A streaming model defines the async generator `execute_stream`: streaming clients (grps streaming, v2
ModelStreamInfer) receive each yield as it comes; a client that goes away closes the generator. Such a
model may omit `execute`; plain infer then answers 400. A model may define `handle_http(http)` to
answer grps customized HTTP (server/endpoints/customized.py).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorgate.server.backends.base import Backend, stream_only_error
from tensorgate.server.backends.module import TRITON_UTILS, ModelModule
from tensorgate.server.model_config import parameter

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Host

# EXECUTION_MODE when the config names none, as --python-execution-mode sets it. `auto`: Triton's API gets
# Triton's isolation (a process per instance, as Triton's stubs), ours keeps threads (docs/models/python.md).
EXECUTION_MODES = ("auto", "process", "thread")


def load_python(version_dir: Path, config: dict, version: int, host: Host | None = None) -> Backend:
    """The model.py of a version folder: Triton's API when it imports `triton_python_backend_utils`
    (server/backends/triton_python.py), else ours. The module shared by both: server/backends/module.py."""
    mode = execution_mode(config, version_dir, host)
    if mode == "process":
        from tensorgate.server.backends.process import ProcessBackend

        return ProcessBackend(version_dir, config, version, host)
    module = ModelModule(version_dir, config, version, host)
    try:
        if module.uses_triton_api:
            from tensorgate.server.backends.triton_python import TritonPythonBackend

            return TritonPythonBackend(module, config, version)
        return PythonBackend(module, config)
    except BaseException:
        module.close()
        raise


def execution_mode(config: dict, version_dir: Path, host: Host | None = None) -> str:
    """Where the model's instances run: `process` (each in a process of its own, server/backends/
    process.py) or `thread` (threads of the server's process), as the config's EXECUTION_MODE says, else
    the server's default (`host.python_execution_mode`), where `auto` means process for a model.py
    written for Triton's API and thread for ours."""
    named = parameter(config, "EXECUTION_MODE", "").lower()
    if named and named not in ("process", "thread"):
        raise ValueError(f"model '{config['name']}': EXECUTION_MODE is 'process' or 'thread', not {named!r}")
    mode = named or (host.python_execution_mode if host is not None else "auto")
    if mode == "auto":
        return "process" if imports_triton_utils(version_dir / "model.py") else "thread"
    return mode


def imports_triton_utils(path: Path) -> bool:
    """Whether a model.py imports `triton_python_backend_utils` anywhere, read from its source without
    running it (a file that does not parse is left to the load to report)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == TRITON_UTILS for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == TRITON_UTILS:
            return True
    return False


class PythonBackend(Backend):
    def __init__(self, module: ModelModule, config: dict) -> None:
        self._module = module
        path = module.path
        self.model = module.model_class()
        if hasattr(self.model, "initialize"):
            self.model.initialize(config)
        execute = getattr(self.model, "execute", None)
        self.stream_only = execute is None  # the server refuses a plain infer before it is counted
        self.with_parameters = execute is not None and _takes_parameters(execute)
        execute = execute or _no_execute(config["name"])
        self.is_async = inspect.iscoroutinefunction(execute)
        # inputs -> outputs dict (an awaitable of it when async); bound directly: one call less per batch
        self.execute: Callable[[dict[str, Any]], Any] = execute
        stream = getattr(self.model, "execute_stream", None)
        if stream is not None and not inspect.isasyncgenfunction(stream):
            raise TypeError(f"{path}: execute_stream must be an async generator (async def with yield)")
        if stream is not None and _takes_parameters(stream) != self.with_parameters and not self.stream_only:
            raise TypeError(f"{path}: execute and execute_stream must both take `parameters`, or neither")
        self.with_parameters = self.with_parameters or (stream is not None and _takes_parameters(stream))
        self.execute_stream: Callable[[dict[str, Any]], AsyncIterator[Any]] | None = stream
        # grps customized HTTP (server/endpoints/customized.py): handle_http(http), plain or async
        self.handle_http: Callable[[Any], Any] | None = getattr(self.model, "handle_http", None)

    def close(self) -> None:
        self._module.unload(self.model)


def _takes_parameters(method: Callable[..., Any]) -> bool:
    """Whether a model method takes the request's custom parameters: `execute(self, inputs, parameters)`."""
    try:
        return "parameters" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _no_execute(model: str) -> Callable[[dict[str, Any]], Any]:
    def execute(inputs: dict[str, Any], *_: Any) -> Any:
        raise stream_only_error(model)

    return execute
