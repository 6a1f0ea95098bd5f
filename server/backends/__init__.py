"""Backends: each loads one model version and executes one batch; they know nothing of protocols.

This module picks the backend a config names and loads it, importing it only then. The interfaces
between server and backends are in server/backends/base.py: `Backend` (what the server reads of one)
and `Host` (what a backend may use of the server, handed to it here at load).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from tensorgate.server.config_error import ConfigError

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Backend, Host

SUPPORTED = ("python", "pytorch", "onnxruntime", "ensemble")
log = logging.getLogger("tensorgate.backends")

# Set by server/cli.py at startup: Triton's --backend-config settings by backend ("" holds those given
# without a backend, which every backend gets), and --model-load-retry-count.
backend_config: dict[str, dict[str, str]] = {}
load_retries = 0


def backend_setting(backend: str, setting: str, default: str) -> str:
    """A --backend-config setting as `backend` sees it: its own, else the one given for every backend."""
    for scope in (backend, ""):
        if setting in backend_config.get(scope, {}):
            return backend_config[scope][setting]
    return default


# Triton's auto-complete (core model_config_utils.cc AutoCompleteBackendFields): the model file that
# tells a config naming neither backend nor platform which backend it is, and the platform it then gets.
MODEL_FILES = {
    "model.onnx": ("onnxruntime", "onnxruntime_onnx"),
    "model.pt": ("pytorch", "pytorch_libtorch"),
    "model.pt2": ("pytorch", "pytorch_libtorch"),
    "model.py": ("python", ""),
}


def backend_from_files(version_dir: Path, config: dict) -> dict:
    """The config with `backend` (and `platform`) filled, when it names neither, from its
    `default_model_filename` or else the model file in `version_dir`, as Triton's auto-complete does;
    raises ConfigError when nothing tells."""
    if config.get("backend") or config.get("platform"):
        return config
    filename = config.get("default_model_filename")
    names = [filename] if filename else [n for n in MODEL_FILES if (version_dir / n).exists()]
    if not names or names[0] not in MODEL_FILES:
        held = f"default_model_filename '{filename}'" if filename else f"version folder {version_dir.name}"
        raise ConfigError(
            f"model '{config['name']}': must specify 'backend' or 'platform' ({held} is none of "
            f"{', '.join(MODEL_FILES)}, the files that tell the backend)"
        )
    backend, platform = MODEL_FILES[names[0]]
    return {**config, "backend": backend, "platform": platform}


def complete_config(version_dir: Path, config: dict, host: Host | None = None) -> dict:
    """The config as its backend completes it from the model in `version_dir`: an ONNX graph's inputs
    and outputs where the config leaves them out, a Triton python model's `auto_complete_config`."""
    backend = config.get("backend")
    if backend == "onnxruntime" and not (config["input"] and config["output"]):
        from tensorgate.server.backends.onnxruntime import complete

        return complete(version_dir, config)
    if backend == "python":
        model = version_dir / "model.py"
        if model.is_file() and b"auto_complete_config" in model.read_bytes():
            from tensorgate.server.backends.python import execution_mode

            if (
                execution_mode(config, version_dir, host) == "process"
            ):  # the model's code runs in its processes only
                from tensorgate.server.backends.instance import complete_in_process

                return complete_in_process(version_dir, config)
            from tensorgate.server.backends.triton_python import complete

            return complete(version_dir, config, host)
    return config


def load_backend(version_dir: Path, config: dict, version: int, host: Host | None = None) -> Backend:
    """The backend named by the config, loaded for one version folder. Raises with the reason on failure,
    once --model-load-retry-count more tries failed too. `host`: the server loading it (None: a backend
    loaded alone, which then serves no ensemble nor BLS)."""
    for retry in range(load_retries):
        try:
            return _load_once(version_dir, config, version, host)
        except Exception as e:  # a model's initialize may raise anything
            log.warning(
                "failed to load '%s' version %d (%s: %s): retry %d of %d",
                config.get("name"),
                version,
                type(e).__name__,
                e,
                retry + 1,
                load_retries,
            )
    return _load_once(version_dir, config, version, host)


def _load_once(version_dir: Path, config: dict, version: int, host: Host | None) -> Backend:
    name = config.get("backend") or config.get("platform")
    if name == "python":
        from tensorgate.server.backends.python import load_python

        return load_python(version_dir, config, version, host)
    if name in ("pytorch", "pytorch_libtorch"):
        from tensorgate.server.backends.pytorch import PyTorchBackend  # imports torch itself, only now

        return PyTorchBackend(version_dir, config, version)
    if name in ("onnxruntime", "onnxruntime_onnx"):
        from tensorgate.server.backends.onnxruntime import (
            OnnxRuntimeBackend,  # imports onnxruntime itself, only now
        )

        return OnnxRuntimeBackend(version_dir, config, version)
    if name == "ensemble":
        from tensorgate.server.backends.ensemble import EnsembleBackend

        return EnsembleBackend(config, host)
    raise ValueError(f"backend {name!r} is not supported (supported: {', '.join(SUPPORTED)})")
