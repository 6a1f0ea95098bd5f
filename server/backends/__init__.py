"""Backends: each loads one model version and executes one batch; they know nothing of protocols.

This module picks the backend a config names and loads it, importing it only then. The interfaces
between server and backends are in server/backends/base.py: `Backend` (what the server reads of one)
and `Host` (what a backend may use of the server, handed to it here at load).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.backends.base import Backend, Host

SUPPORTED = ("python", "pytorch", "onnxruntime", "ensemble")


def complete_config(version_dir: Path, config: dict, host: Host | None = None) -> dict:
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

            return complete(version_dir, config, host)
    return config


def load_backend(version_dir: Path, config: dict, version: int, host: Host | None = None) -> Backend:
    """The backend named by the config, loaded for one version folder. Raises with the reason on failure.
    `host`: the server loading it (None: a backend loaded alone, which then serves no ensemble nor BLS)."""
    name = config.get("backend") or config.get("platform")
    if name == "python":
        from server.backends.python import load_python

        return load_python(version_dir, config, version, host)
    if name in ("pytorch", "pytorch_libtorch"):
        from server.backends.pytorch import PyTorchBackend  # imports torch itself, only now

        return PyTorchBackend(version_dir, config, version)
    if name in ("onnxruntime", "onnxruntime_onnx"):
        from server.backends.onnxruntime import OnnxRuntimeBackend  # imports onnxruntime itself, only now

        return OnnxRuntimeBackend(version_dir, config, version)
    if name == "ensemble":
        from server.backends.ensemble import EnsembleBackend

        return EnsembleBackend(config, host)
    raise ValueError(f"backend {name!r} is not supported (supported: {', '.join(SUPPORTED)})")
