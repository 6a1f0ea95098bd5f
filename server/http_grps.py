"""The grps interface (NetEase-Media/grps): what its REST endpoints under /grps/v1/ and its gRPC
GrpsService (server/grpc/grps.py) share, and the REST endpoints.

Every answer carries `status` {code, msg, status: SUCCESS | FAILURE}; over REST the HTTP status is
`status.code`. A bin_data answer goes back as the raw bytes (application/octet-stream), without status.
"""

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qs

from codec import grps as wire
from codec import grps_answers as answers
from codec import grps_mapping as mapping
from codec.datatypes import BY_V2
from codec.errors import HTTP_STATUS, ErrorKind, InferError, invalid
from codec.grps_yaml import dump as yaml_dump
from codec.tensor import InferRequest, InferResponse
from server import __version__
from server.app import Receive, infer_watching
from server.model import ModelVersion
from server.repository import Repository
from server.router import HttpRequest, HttpResponse, Router, body_response

log = logging.getLogger("tensorgate.grps")

ROOT = "/grps/v1"
OCTET_STREAM = b"application/octet-stream"
UNAVAILABLE = HTTP_STATUS[ErrorKind.UNAVAILABLE]


class Grps:
    """The grps interface over the model repository, for both front doors."""

    def __init__(self, repository: Repository, default_model: str | None = None) -> None:
        self.repository = repository
        self.default_model = default_model

    # ------------------------------------------------------------------------------------ inference

    def select(self, model: str) -> ModelVersion:
        """The version `name` or `name-version` names; without one, the default model."""
        if not model:
            model = self.default_model or self._only_model()
        name, version = mapping.split_model(model, self.repository.models.__contains__)
        return self.repository.resolve(name, version)

    def _only_model(self) -> str:
        names = list(self.repository.models)
        if len(names) == 1:
            return names[0]
        if not names:
            raise InferError(ErrorKind.UNAVAILABLE, "no model is loaded")
        raise invalid(
            f"no model selected and the repository has {len(names)}: set `model` (name or name-version) "
            "in the message or ?model=, or start the server with --grps-default-model"
        )

    async def predict(
        self, payload: wire.Payload, return_ndarray: bool = False, receive: Receive | None = None
    ) -> answers.Answer:
        """`receive`: the REST request's, to drop a queued request whose client left (gRPC cancels)."""
        version, request = self._request(payload)
        response = await infer_watching(version, request, receive)
        return answers.to_answer(response, payload.kind, return_ndarray)

    async def predict_stream(
        self, payload: wire.Payload, return_ndarray: bool = False, receive: Receive | None = None
    ) -> AsyncIterator[answers.Answer]:
        """The answers, one per yield of the model's execute_stream. A bad request raises here; what
        fails later comes out of the iteration as an InferError. A model without execute_stream
        answers once (run here as predict runs it, so its errors raise here too)."""
        version, request = self._request(payload)
        if not version.streams:
            response = await infer_watching(version, request, receive)
            return _once(answers.to_answer(response, payload.kind, return_ndarray))
        return _answers(version.infer_stream(request), payload.kind, return_ndarray)

    def _request(self, payload: wire.Payload) -> tuple[ModelVersion, InferRequest]:
        """The version the payload selects, and the payload as that version's request."""
        version = self.select(payload.model)
        return version, mapping.to_infer_request(payload, version.name, version.version_str, version.inputs)

    # --------------------------------------------------------------------------- health, metadata

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


async def _once(answer: answers.Answer) -> AsyncIterator[answers.Answer]:
    yield answer


async def _answers(
    responses: AsyncIterator[InferResponse], kind: str, return_ndarray: bool
) -> AsyncIterator[answers.Answer]:
    async with aclosing(responses):  # closing the answers closes the model's generator
        async for response in responses:
            yield answers.to_answer(response, kind, return_ndarray)


# ------------------------------------------------------------------------------------------ REST


def status_response(code: int, msg: str) -> HttpResponse:
    return body_response(answers.status_json(code, msg), status=code)


def error_response(error: InferError) -> HttpResponse:
    return status_response(answers.status_code(error), error.message)


class GrpsEndpoints:
    def __init__(self, repository: Repository, default_model: str | None = None) -> None:
        self.grps = Grps(repository, default_model)

    def install(self, router: Router) -> None:
        both, post = ("GET", "POST"), ("POST",)
        for methods, path, handler in (
            (both, "/health/online", self.online),
            (both, "/health/offline", self.offline),
            (both, "/health/live", self.live),
            (both, "/health/ready", self.ready),
            (post, "/infer/predict", self.predict),
            (both, "/metadata/server", self.server_metadata),
            (post, "/metadata/model", self.model_metadata),
        ):
            for method in methods:
                router.add(method, ROOT + path, handler, error_response)

    async def online(self, request: HttpRequest) -> HttpResponse:
        self.grps.set_online(True)
        return status_response(answers.OK, "OK")

    async def offline(self, request: HttpRequest) -> HttpResponse:
        self.grps.set_online(False)
        return status_response(answers.OK, "OK")

    async def live(self, request: HttpRequest) -> HttpResponse:
        return status_response(answers.OK, "OK")

    async def ready(self, request: HttpRequest) -> HttpResponse:
        return status_response(*self.grps.readiness())

    async def server_metadata(self, request: HttpRequest) -> HttpResponse:
        return body_response(answers.answer_json(answers.Answer(wire.STR_DATA, self.grps.server_metadata())))

    async def model_metadata(self, request: HttpRequest) -> HttpResponse:
        payload = wire.payload_from_json(request.body)
        if payload.kind != wire.STR_DATA:
            raise invalid("metadata/model takes the model's name as str_data")
        name = payload.tensors[0].data[()].decode()
        return body_response(
            answers.answer_json(answers.Answer(wire.STR_DATA, self.grps.model_metadata(name)))
        )

    async def predict(self, request: HttpRequest) -> HttpResponse:
        query = _query(request.query)
        content_type = request.headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if content_type == OCTET_STREAM:
            payload = wire.payload_from_bytes(request.body)
        else:
            payload = wire.payload_from_json(request.body)
        payload.model = payload.model or query.get("model", "")  # the body's model wins
        return_ndarray = _flag(query, "return-ndarray")
        if _flag(query, "streaming"):
            stream = await self.grps.predict_stream(payload, return_ndarray, request.receive)
            return HttpResponse(answers.OK, [(b"content-type", OCTET_STREAM)], _chunks(stream))
        answer = await self.grps.predict(payload, return_ndarray, request.receive)
        if answer.kind == wire.BIN_DATA:
            return body_response(answer.data, OCTET_STREAM, answers.OK)
        return body_response(answers.answer_json(answer))


async def _chunks(stream: AsyncIterator[answers.Answer]) -> AsyncIterator[bytes]:
    """One chunk per answer: its JSON and a newline, or its raw bytes for bin_data. A failure ends the
    stream with a FAILURE message."""
    async with aclosing(stream):
        try:
            async for answer in stream:
                yield answer.data if answer.kind == wire.BIN_DATA else answers.answer_json(answer) + b"\n"
        except InferError as e:
            yield answers.error_json(e) + b"\n"
        except Exception:
            log.exception("unexpected error streaming a grps answer")
            yield (
                answers.error_json(InferError(ErrorKind.INTERNAL, "internal error streaming the answer"))
                + b"\n"
            )


def _query(raw: bytes) -> dict[str, Any]:
    return {key: values[-1] for key, values in parse_qs(raw.decode("latin-1")).items()}


def _flag(query: dict[str, Any], name: str) -> bool:
    return str(query.get(name, "")).lower() == "true"
