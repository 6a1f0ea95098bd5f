"""The ASGI application: reads the body, dispatches through the router, sends the answer.

Plain ASGI 3 for hypercorn (HTTP/1.1 and HTTP/2 alike). Bodies arrive as chunks and are gathered once
into one buffer; large response chunks go out in slices so a response never doubles in memory.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np

from codec.errors import ErrorKind, InferError
from server.router import HttpRequest, HttpResponse, MethodNotAllowed, Router

log = logging.getLogger("tensorgate.http")

SEND_SLICE = 1 << 20  # hypercorn copies each body message; slices keep that copy small
METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})

T = TypeVar("T")
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class BodyTooLarge(InferError):
    fixed_http_status = 413  # refused before it is read, as on every endpoint (TF Serving's 429 is for load)

    def __init__(self, limit: int) -> None:
        super().__init__(
            ErrorKind.RESOURCE_EXHAUSTED,
            f"request body exceeds the {limit}-byte limit (raise it with --max-request-bytes)",
        )


class ClientGone(Exception):
    pass


class App:
    def __init__(
        self, router: Router, max_request_bytes: int, on_shutdown: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.router = router
        self.max_request_bytes = max_request_bytes
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send, self.on_shutdown)

    async def _http(self, scope: dict, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        headers = dict(scope["headers"])  # lowercased names, as hypercorn gives them
        if b"content-length" in headers and b"transfer-encoding" in headers:
            await self._send(send, _ambiguous_framing(self.router.fallback_errors), receive)
            return
        errors = self.router.fallback_errors
        body_pending = True  # an early answer reads the body first, so the connection stays usable
        try:
            route, params = self.router.match(method, path)
            errors = route.errors
            body = b""
            if method in METHODS_WITH_BODY:
                body_pending = False  # _read_body consumes the body, also when it refuses it
                body = await self._read_body(receive, headers)
            request = HttpRequest(method, path, scope["query_string"], headers, body, params, receive)
            response = await route.handler(request)
        except ClientGone:
            return
        except MethodNotAllowed as e:
            response = e.errors(e)
            response.headers.append((b"allow", ", ".join(e.allowed).encode()))
        except InferError as e:
            response = errors(e)
        except Exception:
            log.exception("unexpected error serving %s %s", method, path)
            response = errors(InferError(ErrorKind.INTERNAL, f"internal error serving {method} {path}"))
        if body_pending and response.status >= 400 and not await discard_body(receive):
            return
        await self._send(send, response, receive)

    async def _read_body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes | memoryview:
        """The whole body: the one chunk it came in, else one copy into a buffer of its Content-Length,
        else (chunked, no length) the chunks joined."""
        limit = self.max_request_bytes
        declared = headers.get(b"content-length")
        expected = int(declared) if declared and declared.isdigit() else None
        if expected is not None and expected > limit:
            await discard_body(receive)
            raise BodyTooLarge(limit)
        message = await receive()
        body = message.get("body", b"")
        if len(body) == expected and message["type"] == "http.request":
            # The usual case: the whole body in one message (hypercorn then sends an empty last one).
            if message.get("more_body", False) and not await discard_body(receive):
                raise ClientGone
            return body
        return await _gather_body(receive, message, expected, limit)

    async def _send(self, send: Send, response: HttpResponse, receive: Receive) -> None:
        try:
            await send(
                {"type": "http.response.start", "status": response.status, "headers": response.headers}
            )
            chunks: Any = response.chunks
            if isinstance(chunks, list):
                if len(chunks) == 1 and len(chunks[0]) <= SEND_SLICE:  # the usual answer
                    await send({"type": "http.response.body", "body": chunks[0]})
                    return
                pieces = list(_slices(chunks))
                for chunk in pieces[:-1]:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": pieces[-1] if pieces else b""})
                return
            await _stream(send, receive, chunks)
        except (OSError, RuntimeError):  # the client went away mid-response
            return


async def _gather_body(
    receive: Receive, message: dict, expected: int | None, limit: int
) -> bytes | memoryview:
    """A body that comes in several messages, `message` the first."""
    first: bytes | None = None
    view: memoryview | None = None
    parts: list[bytes] = []
    received = 0
    while True:
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk, more = message.get("body", b""), message.get("more_body", False)
        end = received + len(chunk)
        if end > limit:
            if more:
                await discard_body(receive)
            raise BodyTooLarge(limit)
        if chunk:
            if first is None:
                first = chunk
            elif expected is None:
                parts.append(chunk)
            elif end > expected:  # hypercorn enforces Content-Length; this is defence only
                raise InferError(ErrorKind.INVALID_ARGUMENT, "request body longer than its Content-Length")
            else:
                if view is None:
                    # numpy's allocator asks for transparent huge pages: a large body then costs a few
                    # hundred page faults instead of one per 4 KiB (about 5x faster to fill).
                    view = memoryview(np.empty(expected, dtype=np.uint8))
                    view[: len(first)] = first
                view[received:end] = chunk
        received = end
        if not more:
            break
        message = await receive()
    if view is not None:
        return view[:received]
    if parts:
        return b"".join([first, *parts])
    return first if first is not None else b""


async def _stream(send: Send, receive: Receive, chunks: Any) -> None:
    """Sends chunks as the iterator yields them. A client that goes away (hypercorn then says
    http.disconnect, and drops what is still sent) stops the iterator at once and closes it."""

    async def pump() -> None:
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    pumping = asyncio.ensure_future(pump())
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        pumping.cancel()
        try:
            await pumping
        except asyncio.CancelledError:
            pass
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


async def unless_client_leaves(work: Awaitable[T], receive: Receive | None) -> T:
    """Awaits `work`, cancelled when the client disconnects first (then raises ClientGone).

    hypercorn only reports a disconnect on `receive`, it does not cancel the handler: a request queued
    for its batch would be executed for nobody. The watch costs a task (~10 us), so only work that may
    wait (a model with a queue) uses it."""
    if receive is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    raise ClientGone


def infer_watching(version: Any, request: Any, receive: Receive | None) -> Awaitable[Any]:
    """`version.infer(request)` (a ModelVersion), watching for the client to leave when it may queue."""
    if version.queues:
        return unless_client_leaves(version.infer(request), receive)
    return version.infer(request)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def lifespan(
    receive: Receive, send: Send, on_shutdown: Callable[[], Awaitable[None]] | None = None
) -> None:
    """The ASGI lifespan protocol: nothing to start; `on_shutdown` runs when the server stops."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if on_shutdown is not None:
                await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def discard_body(receive: Receive) -> bool:
    """Reads the rest of a request body and drops it; False when the client went away instead."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        if not message.get("more_body", False):
            return True


def _ambiguous_framing(errors: Callable[[InferError], HttpResponse]) -> HttpResponse:
    """Content-Length beside Transfer-Encoding: answered, then the connection is closed (RFC 9112 6.1)."""
    response = errors(
        InferError(
            ErrorKind.INVALID_ARGUMENT, "a request must not carry both Content-Length and Transfer-Encoding"
        )
    )
    response.headers.append((b"connection", b"close"))
    return response


def _slices(chunks: list[bytes | memoryview]):
    for chunk in chunks:
        if len(chunk) <= SEND_SLICE:
            yield chunk
            continue
        view = memoryview(chunk)
        for start in range(0, len(view), SEND_SLICE):
            yield view[start : start + SEND_SLICE]
