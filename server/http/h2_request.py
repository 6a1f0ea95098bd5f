"""A plain HTTP/2 request: its body gathered whole, the router's answer, and the answer's frames.

The `StreamHandler` of every stream that is not a gRPC call. Its body goes into one buffer of its
declared length (large DATA frames straight from the socket, `start_direct`); when the client ends the
stream, the router's handler runs as a task and its answer goes out as HEADERS and DATA frames within the
peer's windows and frame size, through the connection's stream API. What can be answered from the head
alone (404, 405, 413 by declared length) or once the body passes the limit is answered at once
(`answer_early`); what the client still sends is read and dropped, and a stream still open
LINGER_SECONDS later is reset with NO_ERROR (RFC 9113 8.1): resetting at once is what the RFC allows,
but clients such as httpx then fail the request they are still sending.

While tracing is on (frontend.Timing), it reads the clock when the stream opens and when its body is
whole: a traced request's HTTP_RECV_START and HTTP_RECV_END (server/tracing/frontend.py).
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic
from typing import TYPE_CHECKING, Any, cast

from tensorgate.server.http import hpack_encode
from tensorgate.server.http.buffers import body_buffer
from tensorgate.server.http.h2_frames import (
    CONNECTION_SPECIFIC,
    INTERNAL_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    StreamReset,
)
from tensorgate.server.router import BodyTooLarge, HttpResponse, Route, stalled_body
from tensorgate.server.tracing.frontend import TimedRequest, Timing, send_timed

if TYPE_CHECKING:
    from tensorgate.server.http.h2 import H2Connection
    from tensorgate.server.http.h2_frames import Stream

log = logging.getLogger("tensorgate.http")

LINGER_SECONDS = 2.0  # after an early answer, how long what the client still sends is read and dropped


def head_block(response: HttpResponse) -> bytes:
    """The answer's status and headers, HPACK-encoded, without HTTP/1.1's connection-specific fields."""
    return hpack_encode.encode(
        response.status, [(n, v) for n, v in response.headers if n not in CONNECTION_SPECIFIC]
    )


class BufferedRequest:
    __slots__ = (
        "connection",
        "stream",
        "route",
        "params",
        "body",
        "filled",
        "answered",
        "task",
        "direct",
        "started",
        "received",
    )

    def __init__(self, connection: H2Connection, stream: Stream) -> None:
        self.connection = connection
        self.stream = stream
        self.route: Route | None = None
        self.params: dict[str, str] = {}
        self.body: Any = (
            b""  # bytes (came in one frame), a memoryview over a buffer of `expected`, a bytearray
        )
        self.filled = 0
        self.answered = 0.0  # when an early answer went out: what the client still sends is dropped
        self.task: asyncio.Task | None = None
        # self.direct: bytes of a DATA frame the socket is still reading straight into the body
        self.started = monotonic() if Timing.on else 0.0  # its head is in (time.monotonic())
        self.received = 0.0  # its body is whole

    def start(self) -> None:
        """The head is in: answered at once if the route or the declared size says so, else served once
        the body is whole (at once without one)."""
        connection, stream = self.connection, self.stream
        found = connection.router.find(stream.method, stream.path)
        if isinstance(found, HttpResponse):
            return self.answer_early(found)
        self.route, self.params = found
        limit = connection.settings.max_request_bytes
        if stream.expected is not None and stream.expected > limit:
            return self.answer_early(self.route.errors(BodyTooLarge(limit)))
        if not stream.remote_open:
            self.end_in()

    # ------------------------------------------------------------------------------ the body

    def data_in(self, data: memoryview) -> None:
        stream = self.stream
        if not self.filled and not stream.remote_open and len(data) == stream.expected and not self.answered:
            self.body = bytes(data)  # the usual body: whole, in the frame that ends the stream
            self.filled = len(data)
            return
        if self.answered or not data:
            return
        if stream.remote_open:  # read at once: the window is given back as it comes
            self.connection.credit(stream)
        end = self.filled + len(data)
        if stream.expected is not None:
            if end > stream.expected:
                return self.connection.refuse(stream, PROTOCOL_ERROR)
            if self.filled == 0 and end == stream.expected:
                self.body = bytes(data)
            else:
                self._buffer()
                self.body[self.filled : end] = data
        else:
            limit = self.connection.settings.max_request_bytes
            if end > limit:
                return self.answer_early(cast(Route, self.route).errors(BodyTooLarge(limit)))  # start set it
            if not self.body:
                self.body = bytearray()
            self.body += data
        self.filled = end

    def _buffer(self) -> None:
        if not isinstance(self.body, memoryview):
            self.body = body_buffer(self.stream.expected, self.body)  # type: ignore[arg-type]  # only with a declared length

    def takes_direct(self, length: int) -> bool:
        """Whether a DATA frame of `length` bytes, still coming, may be read straight into the body."""
        stream = self.stream
        return stream.expected is not None and not self.answered and self.filled + length <= stream.expected

    def start_direct(self, have: memoryview, length: int) -> memoryview:
        """The first bytes of such a frame into the body; where the socket reads the rest of it."""
        if self.stream.remote_open:  # the whole frame is taken from the window now: given back now
            self.connection.credit(self.stream)
        self._buffer()
        self.body[self.filled : self.filled + len(have)] = have
        self.filled += len(have)
        self.direct = length - len(have)
        return self.body[self.filled : self.filled + self.direct]

    def direct_read(self, nbytes: int) -> bool:
        """The socket read `nbytes` more of it: True once the frame is whole."""
        self.filled += nbytes
        self.direct -= nbytes
        return self.direct == 0

    def end_in(self) -> None:
        stream, connection = self.stream, self.connection
        if self.answered:
            connection.close(stream)
            return
        if stream.expected is not None and self.filled != stream.expected:
            return connection.refuse(stream, PROTOCOL_ERROR)
        if isinstance(self.body, memoryview) and self.filled != len(self.body):
            self.body = self.body[: self.filled]
        if self.started:
            self.received = monotonic()
        self.task = connection.loop.create_task(self._serve())

    def reset(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def sweep(self, now: float) -> None:
        stream, connection = self.stream, self.connection
        if self.answered and now - self.answered > LINGER_SECONDS:
            connection.reset(stream, NO_ERROR)
            connection.close(stream)
        elif (
            stream.remote_open and not self.answered and now - stream.since > connection.settings.body_timeout
        ):
            # A body the app awaits whole that stopped coming.
            errors = self.route.errors if self.route is not None else connection.router.fallback_errors
            self.answer_early(stalled_body(errors, connection.settings.body_timeout))

    # ------------------------------------------------------------------------------ the answer

    def answer_early(self, response: HttpResponse) -> None:
        """An answer from the head (or a body past the limit) while the body may still come: sent now,
        or as the peer's window opens for it."""
        connection, stream = self.connection, self.stream
        self.answered = connection.loop.time()
        # an early answer is an error's, its chunks a list
        body = b"" if stream.method == "HEAD" else b"".join(cast("list[bytes]", response.chunks))
        connection.send_headers(stream, head_block(response), end=not body)
        if body and not connection.send_now(stream, body, True):  # a peer may give no window at all
            self.task = connection.loop.create_task(self._send_early(memoryview(body)))
        elif not stream.remote_open:
            connection.close(stream)

    async def _send_early(self, body: memoryview) -> None:
        try:
            await self.connection.send_data(self.stream, body, True)
        except StreamReset:
            return
        if not self.stream.remote_open:
            self.connection.close(self.stream)

    async def _serve(self) -> None:
        connection, stream = self.connection, self.stream
        request = TimedRequest(
            stream.method, stream.path, stream.query, stream.headers, self.body, self.params
        )
        request.started, request.received, request.answer = self.started, self.received, None
        try:
            response = await connection.router.call(self.route, request)  # type: ignore[arg-type]  # start set it (no early answer)
            if request.answer is None:
                await self._respond(response)
            else:  # traced: HTTP_SEND_START and HTTP_SEND_END around it, then its trace is written
                await send_timed(request.answer, self._respond(response))
        except StreamReset:
            return
        except Exception:  # a streamed answer that failed midway: the stream ends in an error
            log.exception("unexpected error answering %s %s", stream.method, stream.path)
            if not stream.reset:
                connection.refuse(stream, INTERNAL_ERROR)
                connection.flush()
            return
        if not stream.reset:
            connection.close(stream)

    async def _respond(self, response: HttpResponse) -> None:
        connection, stream = self.connection, self.stream
        chunks = response.chunks
        if stream.method == "HEAD":
            if not isinstance(chunks, list):
                await chunks.aclose()  # type: ignore[attr-defined]  # router.Chunks: an async generator
            connection.send_headers(stream, head_block(response), end=True)
            return
        trailers = response.trailers
        if isinstance(chunks, list):
            if (
                len(chunks) == 1
                and trailers is None
                and connection.answer_now(stream, head_block(response), chunks[0])
            ):
                return  # the usual answer: HEADERS and one DATA frame in one write
            final = len(chunks) - 1 if trailers is None else None  # the chunk whose frame ends the stream
            connection.send_headers(stream, head_block(response), end=not chunks and final is not None)
            for index, chunk in enumerate(chunks):
                await connection.send_data(stream, memoryview(chunk).cast("B"), index == final)
        else:
            connection.send_headers(stream, head_block(response))
            try:
                async for chunk in chunks:
                    if chunk:
                        await connection.send_data(stream, memoryview(chunk).cast("B"), False)
                if response.trailers is None:
                    await connection.send_data(stream, memoryview(b""), True)
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]  # router.Chunks: an async generator
        if response.trailers is not None:  # read now: a stream may have filled it as it ended
            block = hpack_encode.encode(
                None, [(n, v) for n, v in response.trailers if n not in CONNECTION_SPECIFIC]
            )
            connection.send_headers(stream, block, end=True)
