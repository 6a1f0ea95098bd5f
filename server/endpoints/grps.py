"""grps REST endpoints under /grps/v1/ (the interface itself is server/grps.py).

Over REST the HTTP status is the answer's `status.code`. A bin_data answer goes back as the raw bytes
(application/octet-stream), without status.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from tensorgate.codec import grps as wire
from tensorgate.codec import grps_answers as answers
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.server.endpoints.customized import CustomizedHttp, StreamingControl
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

if TYPE_CHECKING:
    from tensorgate.server.grps import GrpsInference, GrpsStatus

log = logging.getLogger("tensorgate.grps")

ROOT = "/grps/v1"
OCTET_STREAM = b"application/octet-stream"


# ------------------------------------------------------------------------------------------ REST


def status_response(code: int, msg: str) -> HttpResponse:
    return body_response(answers.status_json(code, msg), status=code)


def error_response(error: InferError) -> HttpResponse:
    return status_response(answers.status_code(error), error.message)


def install_customized(
    router: Router, grps: GrpsInference, streaming: StreamingControl, path: str | None
) -> None:
    """--grps-customized-predict-http, once every other route is in (it may not take one's place)."""
    if path:
        CustomizedHttp(grps, streaming).install(router, path, error_response)


class GrpsPredict:
    """POST /grps/v1/infer/predict: the front end's, through the engine client."""

    def __init__(self, grps: GrpsInference, streaming: StreamingControl | None = None) -> None:
        self.grps = grps
        self.streaming = streaming or StreamingControl()

    def install(self, router: Router) -> None:
        router.add("POST", ROOT + "/infer/predict", self.predict, error_response)

    async def predict(self, request: HttpRequest) -> HttpResponse:
        query = _query(request.query)
        content_type = request.headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if content_type == OCTET_STREAM:
            payload = wire.payload_from_bytes(request.body)
        else:
            payload = wire.payload_from_json(request.body)
        payload.model = payload.model or query.get("model", "")  # the body's model wins
        return_ndarray = _flag(query, "return-ndarray")
        if self.streaming.wants(request):
            stream = await self.grps.predict_stream(payload, return_ndarray)
            content_type = self.streaming.content_type.encode()
            return HttpResponse(answers.OK, [(b"content-type", content_type)], _chunks(stream))
        answer = await self.grps.predict(payload, return_ndarray)
        if answer.kind == wire.BIN_DATA:
            return body_response(answer.data, OCTET_STREAM, answers.OK)
        return body_response(answers.answer_json(answer))


class GrpsEndpoints:
    """Online and Offline, health and metadata, over the repository."""

    def __init__(self, grps: GrpsStatus) -> None:
        self.grps = grps

    def install(self, router: Router) -> None:
        both, post = ("GET", "POST"), ("POST",)
        for methods, path, handler in (
            (both, "/health/online", self.online),
            (both, "/health/offline", self.offline),
            (both, "/health/live", self.live),
            (both, "/health/ready", self.ready),
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


async def _chunks(stream: AsyncGenerator[answers.Answer, None]) -> AsyncIterator[bytes]:
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
