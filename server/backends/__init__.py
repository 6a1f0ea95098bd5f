"""Backends: each loads one model version and executes one batch; they know nothing of protocols."""

import asyncio
from pathlib import Path
from typing import Any, Protocol

SUPPORTED = ("python", "pytorch", "onnxruntime", "ensemble")

# The server this process runs, for models that call other models (BLS, ensembles): its repository and
# event loop, set once at startup by bind_server.
SERVER: dict[str, Any] = {}


def bind_server(repository: Any, loop: asyncio.AbstractEventLoop) -> None:
    SERVER["repository"] = repository
    SERVER["loop"] = loop


class Backend(Protocol):
    is_async: bool  # execute is `async def`
    # A backend may also set `in_thread = True`: its execute blocks (a forward pass), so the batcher runs
    # it in a worker thread instead of on the event loop. It may set `staging` (batcher/staging.py): the
    # staging it built for itself, which then stages its batches (the pytorch backend's device is its).

    def execute(self, inputs: dict[str, Any]) -> Any: ...

    def close(self) -> None: ...


def complete_config(version_dir: Path, config: dict) -> dict:
    """The config as its backend completes it from the model in `version_dir`: an ONNX graph's inputs
    and outputs where the config leaves them out, a Triton python model's `auto_complete_config`."""
    backend = config.get("backend")
    if backend == "onnxruntime" and not (config["input"] and config["output"]):
        from server.backends.onnxruntime import complete

        return complete(version_dir, config)
    if backend == "python":
        model = version_dir / "model.py"
        if model.is_file() and b"auto_complete_config" in model.read_bytes():
            from server.backends.triton_python import complete

            return complete(version_dir, config)
    return config


def load_backend(version_dir: Path, config: dict, version: int) -> Backend:
    """The backend named by the config, loaded for one version folder. Raises with the reason on failure."""
    name = config.get("backend") or config.get("platform")
    if name == "python":
        from server.backends.python import load_python

        return load_python(version_dir, config, version)
    if name in ("pytorch", "pytorch_libtorch"):
        from server.backends.pytorch import PyTorchBackend  # imports torch itself, only now

        return PyTorchBackend(version_dir, config, version)
    if name in ("onnxruntime", "onnxruntime_onnx"):
        from server.backends.onnxruntime import OnnxRuntimeBackend  # imports onnxruntime itself, only now

        return OnnxRuntimeBackend(version_dir, config, version)
    if name == "ensemble":
        from server.backends.ensemble import EnsembleBackend

        return EnsembleBackend(config)
    raise ValueError(f"backend {name!r} is not supported (supported: {', '.join(SUPPORTED)})")
