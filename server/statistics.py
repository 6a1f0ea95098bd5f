"""Triton's statistics extension: the counters of each ready model version, in Triton's JSON shape.

HTTP (`GET /v2/models[/{m}[/versions/{v}]]/stats`), gRPC ModelStatistics and the Prometheus metrics all
read the same `ModelStats` (batcher/stats.py) through `ready_versions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorgate.codec.errors import ErrorKind, InferError

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository import Repository


def ready_versions(repository: Repository, name: str = "", version: str = "") -> list[ModelVersion]:
    """The ready versions statistics are reported for, ordered by model name then version number: all
    models for name "", all ready versions of `name` for version "". Unknown names and versions are
    NOT_FOUND, a known one that is not ready UNAVAILABLE, with Triton's messages."""
    if not name:
        return [
            v
            for _, model in sorted(repository.models.items())
            for _, v in sorted(model.versions.items())
            if v.ready
        ]
    model = repository.models.get(name)
    if model is None:
        raise InferError(ErrorKind.NOT_FOUND, f"requested model '{name}' is not available")
    ready = [v for _, v in sorted(model.versions.items()) if v.ready]
    if not ready:
        raise InferError(ErrorKind.UNAVAILABLE, f"requested model '{name}' is not available")
    if not version:
        return ready
    found = model.versions.get(int(version)) if version.isdigit() else None
    if found is None:
        raise InferError(ErrorKind.NOT_FOUND, f"requested model version is not available for model '{name}'")
    if not found.ready:
        raise InferError(
            ErrorKind.UNAVAILABLE, f"requested model version is not available for model '{name}'"
        )
    return [found]


def model_statistics(repository: Repository, name: str = "", version: str = "") -> dict:
    """`{"model_stats": [{"name", "version", "last_inference", "inference_count", "execution_count",
    "inference_stats", "batch_stats", "response_stats"}, ...]}` as Triton answers GET .../stats; raises
    InferError."""
    return {
        "model_stats": [
            {"name": v.name, "version": v.version_str, **v.stats.as_dict(), **_responses(v), **_restarts(v)}
            for v in ready_versions(repository, name, version)
        ]
    }


def _responses(version: ModelVersion) -> dict:
    """Triton's `response_stats`: per response index, for a decoupled model that counts its responses
    (Triton's python API, server/backends/triton_python.py); empty for the others."""
    counted = getattr(version.backend, "response_stats", None)
    return {"response_stats": {} if counted is None else counted.as_dict()}


def _restarts(version: ModelVersion) -> dict:
    """`instance_restarts`, ours (not Triton's), for a python model whose instances are processes: how
    often one died and was started again (server/backends/process.py)."""
    backend = version.backend
    return {} if backend is None or backend.restarts is None else {"instance_restarts": backend.restarts}
