"""Backends: each loads one model version and executes one batch; they know nothing of protocols."""

from pathlib import Path
from typing import Any, Protocol

SUPPORTED = ("python", "pytorch", "onnxruntime")


class Backend(Protocol):
    is_async: bool  # execute is `async def`
    # A backend may also set `in_thread = True`: its execute blocks (a forward pass), so the batcher runs
    # it in a worker thread instead of on the event loop. It may set `staging` (batcher/staging.py): the
    # staging it built for itself, which then stages its batches (the pytorch backend's device is its).

    def execute(self, inputs: dict[str, Any]) -> Any: ...

    def close(self) -> None: ...


def load_backend(version_dir: Path, config: dict, version: int) -> Backend:
    """The backend named by the config, loaded for one version folder. Raises with the reason on failure."""
    name = config.get("backend") or config.get("platform")
    if name == "python":
        from server.backends.python import PythonBackend

        return PythonBackend(version_dir, config, version)
    if name in ("pytorch", "pytorch_libtorch"):
        from server.backends.pytorch import PyTorchBackend  # imports torch itself, only now

        return PyTorchBackend(version_dir, config, version)
    if name in ("onnxruntime", "onnxruntime_onnx"):
        from server.backends.onnxruntime import OnnxRuntimeBackend  # imports onnxruntime itself, only now

        return OnnxRuntimeBackend(version_dir, config, version)
    raise ValueError(f"backend {name!r} is not supported (supported: {', '.join(SUPPORTED)})")
