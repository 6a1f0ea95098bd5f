"""The router as an ASGI 3 app, so hypercorn (the reference transport, `--http-server hypercorn`) serves
the same endpoints as our own transport. Nothing here is on the default path.

Bodies arrive as chunks and are gathered once into one buffer; large response chunks go out in slices
so a response never doubles in memory. hypercorn only reports a client that leaves on `receive`, it does
not cancel the app: the handler runs as a task that a disconnect cancels (a request queued for its batch
then leaves the queue), as our transport cancels it from connection_lost.

A traced request's front-end timestamps (server/tracing/frontend.py) are coarser than our transport's:
hypercorn hands the app a request whose head it has already read, so HTTP_RECV_START is when the app is
called and HTTP_RECV_END when the app has the whole body; HTTP_SEND_START and HTTP_SEND_END bracket handing
the answer to hypercorn's send, not to the socket.
"""

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Iterator
from time import monotonic
from typing import Any, TypeVar

import hypercorn.asyncio.tcp_server
import numpy as np
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config, Sockets
from hypercorn.events import Closed
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.utils import wrap_app

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.http.listener import TlsFiles
from tensorgate.server.router import BodyTooLarge, HttpResponse, Router, framing_error
from tensorgate.server.tracing.frontend import TimedRequest, Timing, send_timed

log = logging.getLogger("tensorgate.http")

T = TypeVar("T")
SEND_SLICE = 1 << 20  # hypercorn copies each body message; slices keep that copy small
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class ClientGone(Exception):
    pass


class AsgiApp:
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
        started = monotonic() if Timing.on else 0.0
        method, path = scope["method"], scope["path"]
        headers = dict(scope["headers"])  # lowercased names, as hypercorn gives them
        found = self.router.find(method, path)
        if b"content-length" in headers and b"transfer-encoding" in headers:
            found = framing_error(
                self.router.fallback_errors,
                "a request must not carry both Content-Length and Transfer-Encoding",
            )
        if isinstance(found, HttpResponse):
            if await discard_body(receive):  # read first, so the connection stays usable
                await self._send(send, found, receive, method)
            return
        route, params = found
        answer = None
        try:
            body = await self._read_body(receive, headers) if method in ("POST", "PUT", "PATCH") else b""
        except ClientGone:
            return
        except InferError as e:
            response = route.errors(e)
            if isinstance(e, BodyTooLarge):  # as our transport does (it answers before the body is read)
                response.headers.append((b"connection", b"close"))
        else:
            request = TimedRequest(method, path, scope["query_string"], headers, body, params)
            request.started, request.received = started, monotonic() if started else 0.0
            request.answer = None
            try:
                response = await unless_client_leaves(self.router.call(route, request), receive)
            except ClientGone:
                return
            answer = request.answer
        if answer is None:
            await self._send(send, response, receive, method)
        else:  # traced: HTTP_SEND_START and HTTP_SEND_END around it, then its trace is written
            await send_timed(answer, self._send(send, response, receive, method))

    async def _read_body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes | memoryview:
        """The whole body: the one chunk it came in, else one copy into a buffer of its Content-Length,
        else (chunked, no length) the chunks joined. One over the limit is read and dropped."""
        limit = self.max_request_bytes
        declared = headers.get(b"content-length")
        expected = int(declared) if declared and declared.isdigit() else None
        if expected is not None and expected > limit:
            if not await discard_body(receive):
                raise ClientGone
            raise BodyTooLarge(limit)
        message = await receive()
        body = message.get("body", b"")
        if len(body) == expected and message["type"] == "http.request":
            # The usual case: the whole body in one message (hypercorn then sends an empty last one).
            if message.get("more_body", False) and not await discard_body(receive):
                raise ClientGone
            return body
        return await _gather_body(receive, message, expected, limit)

    async def _send(self, send: Send, response: HttpResponse, receive: Receive, method: str) -> None:
        try:
            await send(
                {"type": "http.response.start", "status": response.status, "headers": response.headers}
            )
            chunks: Any = response.chunks
            if method == "HEAD" and isinstance(chunks, list):
                await send({"type": "http.response.body", "body": b""})
            elif isinstance(chunks, list):
                pieces = list(slices(chunks, SEND_SLICE))
                for chunk in pieces[:-1]:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": pieces[-1] if pieces else b""})
            else:
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
            if more and not await discard_body(receive):
                raise ClientGone
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

    try:
        await unless_client_leaves(pump(), receive)
    except ClientGone:
        pass
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def unless_client_leaves(work: Awaitable[T], receive: Receive) -> T:
    """Awaits `work`, cancelled when the client disconnects first (then raises ClientGone)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task in done:
        return task.result()
    raise ClientGone


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


def slices(chunks: Iterable[bytes | memoryview], size: int) -> Iterator[bytes | memoryview]:
    """The chunks, each longer than `size` cut into views of at most `size` bytes."""
    for chunk in chunks:
        if len(chunk) <= size:
            yield chunk
            continue
        view = memoryview(chunk)
        for start in range(0, len(view), size):
            yield view[start : start + size]


# ------------------------------------------------------------------------------------------ hypercorn

# hypercorn reads sockets 64 KiB at a time; every read then travels h11/h2 and the app's receive queue.
# Reading up to 1 MiB at once moves large tensors ~25% faster (bench/: 64 MiB binary round trip) and
# changes nothing for small requests. It is a module global hypercorn looks up on each read.
hypercorn.asyncio.tcp_server.MAX_RECV = 1 << 20

_h2_handle = H2Protocol.handle


async def _h2_handle_closing_buffers(self: H2Protocol, event: object) -> None:
    """hypercorn 0.18 leaves a stream's send buffer open when its HTTP/2 connection drops: a handler
    waiting to flush its answer then waits forever, leaking the stream and holding up shutdown for
    graceful_timeout. Closing the buffers once the connection is closed releases those handlers."""
    await _h2_handle(self, event)
    if isinstance(event, Closed):
        for buffer in list(self.stream_buffers.values()):
            await buffer.close()


H2Protocol.handle = _h2_handle_closing_buffers


def hypercorn_config(log_level: str = "info", graceful_timeout: float = 30) -> Config:
    """hypercorn's settings for our listeners (sockets are bound by server/http/listener.py)."""
    config = Config()
    config.keep_alive_max_requests = 2**31  # hypercorn's default of 1000 makes load tests reconnect
    config.keep_alive_timeout = 75
    config.h2_max_concurrent_streams = 256
    config.h11_max_incomplete_size = 64 * 1024  # request line + headers
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through the process's own logging setup
    config.loglevel = log_level.upper()
    config.graceful_timeout = graceful_timeout
    return config


async def serve_hypercorn(
    app: AsgiApp,
    sockets: list,
    shutdown_trigger: Callable[[], Awaitable[object]],
    graceful_timeout: float,
    tls_files: TlsFiles | None = None,
) -> None:
    """Serves `app` on the bound `sockets` until `shutdown_trigger` returns, then drains. With
    `tls_files` the sockets speak TLS (mutual with its CAs), with ALPN h2 and http/1.1."""
    config = hypercorn_config(logging.getLevelName(log.getEffectiveLevel()).lower(), graceful_timeout)
    if tls_files is not None:
        config.certfile, config.keyfile = tls_files.certfile, tls_files.keyfile
        if tls_files.ca_certs is not None:
            config.ca_certs, config.verify_mode = tls_files.ca_certs, ssl.CERT_REQUIRED
        bound = Sockets(secure_sockets=list(sockets), insecure_sockets=[], quic_sockets=[])
    else:
        bound = Sockets(secure_sockets=[], insecure_sockets=list(sockets), quic_sockets=[])
    await worker_serve(wrap_app(app, 0, "asgi"), config, sockets=bound, shutdown_trigger=shutdown_trigger)
