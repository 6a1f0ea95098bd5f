"""grps's customized HTTP (docs/11_CustomizedHttp.md) and its streaming control.

`--grps-customized-predict-http PATH` routes GET and POST requests on PATH to a python model (the grps
default model, or `?model=name` / `?model=name-version`) whose class defines `handle_http(self, http)`
(plain or `async def`). The model reads the raw request from `http` and writes its own answer:

    http.method, http.path, http.query (dict), http.headers (dict, lowercased names), http.body (bytes)
    http.json()                      the body parsed as JSON
    http.streaming                   whether the client asked for a streamed answer (below)
    http.set_response(body, status=200, headers=None, content_type=None)
    await http.send(chunk)           streams one chunk (bytes or str) at once

A streamed answer is chunked (HTTP/1.1) or DATA frames (HTTP/2) with the content type
`--grps-streaming-res-content-type`; it starts with the model's first `send`. Whether a request streams
is grps's streaming control: `--grps-streaming-ctrl-mode` query_param (`?streaming=true`), header_param
(a `streaming: true` header) or body_param (`"streaming": true` in a JSON body), the key being
`--grps-streaming-ctrl-key`. The same control decides streaming on `/grps/v1/infer/predict`.
A model's exception answers a grps FAILURE status (500) before the answer started, and ends a stream
after it. Each request counts in the model's statistics (and so in the monitor).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from tensorgate.codec.errors import InferError, invalid
from tensorgate.server.router import HttpRequest, HttpResponse, Router

if TYPE_CHECKING:
    from tensorgate.server.grps import GrpsInference

log = logging.getLogger("tensorgate.grps")

CTRL_MODES = ("query_param", "header_param", "body_param")
PATH_FORMAT = re.compile(r"^/[a-zA-Z0-9_\-/]+$")  # grps's own check


@dataclass(frozen=True)
class StreamingControl:
    mode: str = "query_param"
    key: str = "streaming"
    content_type: str = "application/octet-stream"

    def wants(self, request: HttpRequest) -> bool:
        """Whether `request` asks for a streamed answer."""
        if self.mode == "query_param":
            value: Any = query_of(request).get(self.key, "")
        elif self.mode == "header_param":
            value = request.headers.get(self.key.lower().encode(), b"").decode("latin-1")
        else:
            try:
                doc = json.loads(bytes(request.body)) if request.body else {}
            except ValueError:
                return False  # not JSON: the handler says what is wrong with it
            value = doc.get(self.key, "") if isinstance(doc, dict) else ""
        return value is True or str(value).lower() == "true"


def query_of(request: HttpRequest) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(request.query.decode("latin-1")).items()}


class HttpContext:
    """What a model's `handle_http` reads the request from and writes its answer to."""

    def __init__(self, request: HttpRequest, streaming: bool) -> None:
        self.method = request.method
        self.path = request.path
        self.query = query_of(request)
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers.items()}
        self.body = bytes(request.body)
        self.streaming = streaming
        self.status = 200
        self.response_headers: dict[str, str] = {}
        self.response_body = b""
        self.chunks: asyncio.Queue | None = None  # set by the endpoint for a streamed answer
        self.started: asyncio.Future | None = None

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise invalid(f"the request body is not JSON: {e}") from None

    def set_response(
        self,
        body: bytes | str = b"",
        status: int = 200,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> None:
        self.response_body = body.encode() if isinstance(body, str) else bytes(body)
        self.status = status
        self.response_headers.update(headers or {})
        if content_type is not None:
            self.response_headers["content-type"] = content_type

    async def send(self, chunk: bytes | str) -> None:
        """Streams one chunk; the first one starts the answer."""
        if self.chunks is None:
            raise RuntimeError("this request does not stream: use set_response")
        if not self.started.done():
            self.started.set_result(None)
        await self.chunks.put(chunk.encode() if isinstance(chunk, str) else bytes(chunk))


class CustomizedHttp:
    def __init__(self, grps: GrpsInference, control: StreamingControl) -> None:
        self.grps = grps
        self.control = control

    def install(self, router: Router, path: str, errors: Any) -> None:
        if not PATH_FORMAT.match(path):
            raise ValueError(f"invalid customized predict path {path!r}: it must match {PATH_FORMAT.pattern}")
        for method in ("GET", "POST"):
            found = router.find(method, path)
            if isinstance(found, tuple) or found.status == 405:
                raise ValueError(f"customized predict path {path} collides with a built-in route")
        for method in ("GET", "POST"):
            router.add(method, path, self.handle, errors, group="inference")

    async def handle(self, request: HttpRequest) -> HttpResponse:
        version = self.grps.select(query_of(request).get("model", ""))
        handler = version.backend.handle_http if version.backend is not None else None
        if handler is None:
            raise invalid(f"model '{version.name}' has no handle_http: it cannot answer customized HTTP")
        http = HttpContext(request, self.control.wants(request))
        start = perf_counter_ns()
        loop = asyncio.get_running_loop()
        if http.streaming:
            http.chunks = asyncio.Queue(maxsize=16)  # a slow reader slows the model's sends
            http.started = loop.create_future()
        running = asyncio.ensure_future(_call(handler, http))
        waiting = (running,) if http.started is None else (running, http.started)
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if http.started is None or not http.started.done():  # answered without a chunk sent: a plain answer
            await asyncio.wait((running,))
            error = running.exception()
            if error is not None:
                version.stats.record_failure(1, perf_counter_ns() - start)
                raise error if isinstance(error, InferError) else version.executor.failure(error)
            version.stats.record_alone(1, perf_counter_ns() - start)
            headers = _headers(http, b"application/octet-stream")
            headers.append((b"content-length", str(len(http.response_body)).encode()))
            return HttpResponse(http.status, headers, [http.response_body])
        headers = _headers(http, self.control.content_type.encode())
        return HttpResponse(http.status, headers, _stream(http, running, version, start))


def _headers(http: HttpContext, default_type: bytes) -> list[tuple[bytes, bytes]]:
    headers = [(k.lower().encode(), v.encode()) for k, v in http.response_headers.items()]
    if not any(name == b"content-type" for name, _ in headers):
        headers.append((b"content-type", default_type))
    return headers


async def _call(handler: Any, http: HttpContext) -> None:
    result = handler(http)
    if inspect.isawaitable(result):
        await result


async def _stream(
    http: HttpContext, running: asyncio.Future, version: Any, start: int
) -> AsyncIterator[bytes]:
    """The chunks the model sends, until its handle_http returns; a failure ends the stream."""
    getting: asyncio.Future | None = None
    try:
        while True:
            getting = asyncio.ensure_future(http.chunks.get())
            await asyncio.wait((getting, running), return_when=asyncio.FIRST_COMPLETED)
            if getting.done():
                yield getting.result()
                continue
            getting.cancel()
            while not http.chunks.empty():
                yield http.chunks.get_nowait()
            break
        error = running.exception()
        if error is not None:
            log.error("model '%s': handle_http failed while streaming", version.name, exc_info=error)
            version.stats.record_failure(1, perf_counter_ns() - start)
            return
        version.stats.record_alone(1, perf_counter_ns() - start)
    finally:
        if getting is not None:
            getting.cancel()
        if not running.done():  # the client went away
            running.cancel()
