"""The grps interface (NetEase-Media/grps): what its REST endpoints (server/endpoints/grps.py) and its
gRPC GrpsService (server/grpc/grps.py) share: predicting (`GrpsInference`, the front end's) and the
server's health and metadata (`GrpsStatus`, over the repository).

Every answer carries `status` {code, msg, status: SUCCESS | FAILURE}.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING

from tensorgate.codec import grps as wire
from tensorgate.codec import grps_answers as answers
from tensorgate.codec import grps_mapping as mapping
from tensorgate.codec.datatypes import BY_V2
from tensorgate.codec.errors import HTTP_STATUS, ErrorKind, InferError, invalid
from tensorgate.codec.grps_yaml import dump as yaml_dump
from tensorgate.codec.tensor import InferRequest, InferResponse
from tensorgate.server import __version__

if TYPE_CHECKING:
    from tensorgate.server.engine_client import EngineClient
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository import Repository

log = logging.getLogger("tensorgate.grps")

UNAVAILABLE = HTTP_STATUS[ErrorKind.UNAVAILABLE]


class GrpsInference:
    """Predict and PredictStreaming, for both front doors, through the engine client."""

    def __init__(self, engine: EngineClient, default_model: str | None = None) -> None:
        self.engine = engine  # inference (server/engine_client.py)
        self.default_model = default_model  # --grps-default-model

    def select(self, model: str) -> ModelVersion:
        """The version `name` or `name-version` names; without one, the default model."""
        if not model:
            model = self.default_model or self._only_model()
        name, version = mapping.split_model(model, self.engine.table.models.__contains__)
        return self.engine.resolve(name, version)

    def _only_model(self) -> str:
        names = list(self.engine.table.models)
        if len(names) == 1:
            return names[0]
        if not names:
            raise InferError(ErrorKind.UNAVAILABLE, "no model is loaded")
        raise invalid(
            f"no model selected and the repository has {len(names)}: set `model` (name or name-version) "
            "in the message or ?model=, or start the server with --grps-default-model"
        )

    async def predict(self, payload: wire.Payload, return_ndarray: bool = False) -> answers.Answer:
        version, request = self._request(payload)
        response = await self.engine.infer(version, request)
        return answers.to_answer(response, payload.kind, return_ndarray)

    async def predict_stream(
        self, payload: wire.Payload, return_ndarray: bool = False
    ) -> AsyncGenerator[answers.Answer, None]:
        """The answers, one per yield of the model's execute_stream. A bad request raises here; what
        fails later comes out of the iteration as an InferError. A model without execute_stream
        answers once (run here as predict runs it, so its errors raise here too)."""
        version, request = self._request(payload)
        if not version.streams:
            response = await self.engine.infer(version, request)
            return _once(answers.to_answer(response, payload.kind, return_ndarray))
        return _answers(self.engine.infer_stream(version, request), payload.kind, return_ndarray)

    def _request(self, payload: wire.Payload) -> tuple[ModelVersion, InferRequest]:
        """The version the payload selects, and the payload as that version's request."""
        version = self.select(payload.model)
        return version, mapping.to_infer_request(payload, version.name, version.version_str, version.inputs)


class GrpsStatus:
    """Online and Offline, health and metadata, over the repository."""

    def __init__(self, repository: Repository, default_model: str | None = None) -> None:
        self.repository = repository
        self.default_model = default_model  # --grps-default-model

    def set_online(self, online: bool) -> None:
        self.repository.online = online
        if online:
            log.info("grps Online: readiness probes follow the models again")
        else:
            log.info("grps Offline: every readiness probe says not ready; requests are still served")

    def readiness(self) -> tuple[int, str]:
        if self.repository.ready:
            return answers.OK, "OK"
        if not self.repository.online:
            return (
                UNAVAILABLE,
                "Service Unavailable: the server is offline (grps Offline; Online restores it)",
            )
        return UNAVAILABLE, "Service Unavailable: not every model is ready"

    def server_metadata(self) -> str:
        models = []
        for name, model in sorted(self.repository.models.items()):
            ready = [v.version_str for v in reversed(model.newest_first) if v.ready]
            models.append({"name": name, "versions": ready, "ready": bool(ready)})
        default = self.default_model or (models[0]["name"] if len(models) == 1 else None)
        doc = {
            "server": {"name": "tensorgate", "version": __version__, "protocols": ["kserve-v2", "grps"]},
            "online": self.repository.online,
            "ready": self.repository.ready,
            "default_model": default,
            "models": models,
        }
        return yaml_dump(doc)

    def model_metadata(self, model: str) -> str:
        if not model:
            raise invalid("no model name: send its name (or name-version) as str_data")
        name, version = mapping.split_model(model, self.repository.models.__contains__)
        found = self.repository.model(name)
        doc = found.metadata(version)
        chosen = found.resolve(version)
        for tensor in doc["inputs"] + doc["outputs"]:
            tensor["dtype"] = BY_V2[tensor["datatype"]].grps
        doc["max_batch_size"] = chosen.max_batch_size
        doc["streaming"] = chosen.streams
        return yaml_dump(doc)


async def _once(answer: answers.Answer) -> AsyncGenerator[answers.Answer, None]:
    yield answer


async def _answers(
    responses: AsyncIterator[InferResponse], kind: str, return_ndarray: bool
) -> AsyncGenerator[answers.Answer, None]:
    # closing the answers closes the model's generator (infer_stream's iterators are async generators)
    async with aclosing(responses):  # type: ignore[type-var]
        async for response in responses:
            yield answers.to_answer(response, kind, return_ndarray)
