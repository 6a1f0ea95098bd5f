"""HTTP/1.1 on httptools (llhttp): a lean asyncio BufferedProtocol that calls the router directly.

- Keep-alive, pipelining (requests answered in order, one at a time), HTTP/1.0, HEAD, chunked request
  bodies, `Expect: 100-continue`, chunked transfer for streamed answers.
- A body with a Content-Length that does not arrive with its head is received straight into one buffer of
  that length: `get_buffer` hands the socket the rest of that buffer, the parser is bypassed until it is
  full (and replaced for the next request). No list of chunks, no join, no copy before the model.
- What can be refused from the head alone is refused before the body is read: 404 / 405 (the body is
  then read and dropped, the connection stays), 413 for a declared length over the limit (then the
  connection closes, after a lingering read, since the client may still be sending).
- The client leaving cancels the request's task at once (its queued work leaves the batcher).
- The first bytes of a connection that are the HTTP/2 preface hand the connection to server/http/h2.py.
- Its clock is time.monotonic(), the clock loop.time() reads but at full resolution (uvloop's is in
  milliseconds): the readings its timeouts take also say when each request's first and last bytes came,
  which a traced request's trace records (HTTP_RECV_START, HTTP_RECV_END; server/tracing/frontend.py).
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import logging
import time
from http import HTTPStatus
from time import monotonic
from typing import TYPE_CHECKING, Any, cast

import httptools

from tensorgate.server.http import eager
from tensorgate.server.http.buffers import body_buffer
from tensorgate.server.http.connection import BaseConnection, fold_header, split_target
from tensorgate.server.http.h2 import H2Connection
from tensorgate.server.router import (
    BodyTooLarge,
    HttpRequest,
    HttpResponse,
    Route,
    framing_error,
    stalled_body,
)
from tensorgate.server.tracing.frontend import TimedRequest, send_timed

if TYPE_CHECKING:
    from tensorgate.server.http.connection import ConnectionHost

log = logging.getLogger("tensorgate.http")

READ_SIZE = 256 * 1024
# One read buffer for every connection: the event loop reads into it and buffer_updated consumes all of it
# at once (the parser copies what it keeps), so no connection owns one (5000 idle connections would hold
# 1.2 GiB of them).
_read_view = memoryview(bytearray(READ_SIZE))
WRITE_SLICE = 1 << 20  # large bodies go out in slices, each waiting for the socket to drain
SMALL_BODY = 64 * 1024  # bodies up to this go out joined to their head in one write
MAX_PIPELINED = 16  # requests parsed ahead of their answers before reading pauses
LINGER_SECONDS = 2.0  # after an early 413, how long the rest of the upload is read and dropped

# Connection states, for timeouts and shutdown.
IDLE, HEAD, BODY, BUSY, CLOSING = range(5)

STATUS_LINES = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode() for status in HTTPStatus
}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def status_line(status: int) -> bytes:
    return STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()


class _Date:
    """The Date header, formatted once a second."""

    second = 0
    header = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second = second
            cls.header = b"date: " + email.utils.formatdate(second, usegmt=True).encode() + b"\r\n"
        return cls.header


def _head(response: HttpResponse, keep_alive: bool, chunked: bool) -> list[bytes | memoryview]:
    """The status line and header lines of an answer, Date, the framing and connection ones added."""
    head: list[bytes | memoryview] = [status_line(response.status)]
    for name, value in response.headers:
        head += (name, b": ", value, b"\r\n")
    head.append(_Date.now())
    if chunked:
        head.append(b"transfer-encoding: chunked\r\n")
    if not keep_alive and not any(name == b"connection" for name, _ in response.headers):
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    return head


class _Request(TimedRequest):
    """One request as the parser assembles it: the router's HttpRequest itself (handed to it as it is, no
    copy), with what the parser keeps beside. `started` and `received` are set as its bytes come."""

    __slots__ = ("route", "expected", "filled", "http10")

    def __init__(self) -> None:
        self.method = ""
        self.query = b""  # the request target as it comes; then the query string alone
        self.path = ""  # percent-decoded
        self.http10 = False
        self.headers = {}
        self.route: Route | None = None
        self.params = {}
        self.expected: int | None = None  # the Content-Length, when declared
        self.body: Any = b""  # bytes (came whole), a memoryview over a buffer of `expected`, or a bytearray
        self.filled = 0  # bytes of a buffered body received so far
        self.answer = None  # set by an endpoint that traces it


# A JSON error body, as Triton's C++ client reads any answer that is not 200.
_LIMIT_TEXT = b'{"error":"too many connections (raise it with --http-max-connections)"}'
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_LIMIT_TEXT), _LIMIT_TEXT)
)


class _Detached:
    """The parser of a connection that is over: it calls nothing back."""


# The parser holds its connection's callbacks and the connection holds its parser: a connection that
# is over takes this one instead, so both are freed at once rather than by the cycle collector.
_DETACHED = httptools.HttpRequestParser(_Detached())


class H1Connection(BaseConnection):
    def __init__(self, host: ConnectionHost) -> None:
        super().__init__(host)
        self.parser = httptools.HttpRequestParser(self)
        self.request: _Request | None = None  # the one being parsed
        self.head_bytes = 0  # of the request being parsed: its target and header fields
        self.max_head_bytes = self.settings.max_head_bytes  # a C field compiled: read at every header
        self.pending: collections.deque[tuple[_Request, bool]] = collections.deque()  # parsed, unanswered
        self.task: asyncio.Task | None = None  # the one being answered
        self.bypass: memoryview | None = None  # the rest of a body buffer the socket reads into
        self.state = IDLE
        self.since = monotonic()
        self.paused_reading = False
        self.shutting_down = False
        self.fresh = True  # nothing read yet: the bytes may still be the HTTP/2 preface
        self.last_read = False  # the client's last request is in: what it sends after is not read

    # ------------------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.host.opened(self):
            transport.write(TOO_MANY_CONNECTIONS)  # type: ignore[attr-defined]
            transport.close()
            self.transport = None
            return
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            self._become_h2(b"")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.parser = _DETACHED
        if self.task is not None:
            self.task.cancel()
        self.pending.clear()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.bypass is not None:
            return self.bypass
        return _read_view

    def buffer_updated(self, nbytes: int) -> None:
        if self.bypass is not None:
            self._bypassed(nbytes)
            return
        data = _read_view[:nbytes]
        if self.state == BODY:
            self.since = monotonic()  # the body makes progress
        if self.fresh:
            self.fresh = False
            if data[:3] == b"PRI":  # the HTTP/2 preface; no HTTP/1.1 method is called PRI
                self._become_h2(bytes(data))
                return
        if self.state == CLOSING or self.last_read:
            return  # lingering after an early close, or after the last request: dropped
        try:
            self._feed(data)
        except httptools.HttpParserCallbackError:
            return  # a callback answered and is closing the connection
        except httptools.HttpParserError as e:
            self._early_close(framing_error(self.router.fallback_errors, f"malformed request: {e}"))
            return
        request = self.request
        if request is not None and request.expected and request.route is not None and self.state == BODY:
            # The rest of a Content-Length body: straight into its buffer, the parser bypassed.
            self._buffer_body(request)
            self.bypass = request.body[request.filled :]

    def _feed(self, data: memoryview) -> None:
        while True:
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as upgrade:
                # Upgrade (h2c, websocket) is not offered: the request is answered as plain HTTP/1.1
                # (RFC 9110 7.8 lets a server ignore it), and the parser, stopped there, is replaced.
                self.parser = httptools.HttpRequestParser(self)
                data = data[upgrade.args[0] :]

    def eof_received(self) -> None:
        """The client closed its side: taken as the client leaving (what it asked is cancelled), as a
        half-closed client that still reads is rare and a vanished one must not hold work in the queue."""
        return None

    # ------------------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self.request = request = _Request()
        self.head_bytes = 0
        self.state = HEAD
        request.started = self.since = monotonic()

    def on_url(self, url: bytes) -> None:
        request: _Request = self.request  # type: ignore[assignment]  # set by on_message_begin
        request.query += url
        self.head_bytes += len(url)
        if self.head_bytes > self.max_head_bytes:
            self._refuse(self._head_too_large())

    def on_header(self, name: bytes, value: bytes) -> None:
        request: _Request = self.request  # type: ignore[assignment]  # set by on_message_begin
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > self.max_head_bytes:
            self._refuse(self._head_too_large())
        name = name.lower()
        headers = request.headers
        if name in headers:
            fold_header(headers, name, value)
        else:
            headers[name] = value

    def on_headers_complete(self) -> None:
        request: _Request = self.request  # type: ignore[assignment]  # set by on_message_begin
        parser = self.parser
        request.method = parser.get_method().decode("ascii", "replace")
        headers = request.headers
        # llhttp keeps an HTTP/1.1 connection unless `connection: close`, and an HTTP/1.0 one only with
        # `connection: keep-alive`: without that header, keep-alive tells the version (reading the version
        # itself costs ~0.15 us)
        if b"connection" in headers:
            request.http10 = parser.get_http_version() == "1.0"
        else:
            request.http10 = not parser.should_keep_alive()
        self.state = BODY
        self.since = monotonic()
        router = self.router
        if b"content-length" in headers and b"transfer-encoding" in headers:
            self._refuse(
                framing_error(
                    router.fallback_errors,
                    "a request must not carry both Content-Length and Transfer-Encoding",
                )
            )
        request.path, request.query = split_target(request.query)
        found = router.find(request.method, request.path)
        declared = headers.get(b"content-length")
        expected = request.expected = int(declared) if declared is not None else None  # checked by llhttp
        expects_continue = headers.get(b"expect", b"").lower() == b"100-continue"
        if isinstance(found, HttpResponse):
            if expects_continue and (expected or b"transfer-encoding" in headers):
                self._refuse(found)  # the client may or may not send the body now: framing unknown
            self._early_answer(found)
            return
        request.route, request.params = found
        if expected is not None and expected > self.settings.max_request_bytes:
            self._refuse(request.route.errors(BodyTooLarge(self.settings.max_request_bytes)))
        if expects_continue and self.transport is not None:
            self._send(CONTINUE)

    def on_body(self, chunk: bytes) -> None:
        request: _Request = self.request  # type: ignore[assignment]  # set by on_message_begin
        if request.route is None:
            return  # answered early: dropped
        expected = request.expected
        if expected is None:  # chunked
            if not request.body:
                request.body = bytearray()
            request.body += chunk
            if len(request.body) > self.settings.max_request_bytes:
                self._refuse(request.route.errors(BodyTooLarge(self.settings.max_request_bytes)))
        elif request.filled == 0 and len(chunk) == expected:
            request.body = chunk  # the usual case: the whole body with its head
            request.filled = expected
        else:
            self._buffer_body(request)
            end = request.filled + len(chunk)
            request.body[request.filled : end] = chunk
            request.filled = end

    def on_message_complete(self) -> None:
        request: _Request = self.request  # type: ignore[assignment]  # set by on_message_begin
        request.received = self.since  # the read that brought its last bytes
        self.request = None
        self.state = BUSY
        keep_alive = self.parser.should_keep_alive()
        if request.route is not None:
            self._queue(request, keep_alive)
        elif self.pending or self.task is not None:
            pass  # answered early, in its turn behind the pipelined requests (_early_answer)
        elif keep_alive:
            self._idle()
        else:
            self._close()
        if not keep_alive:  # `connection: close` or HTTP/1.0: the client's last request (RFC 9112 9.6)
            self.last_read = True
            raise httptools.HttpParserCallbackError

    # ------------------------------------------------------------------------------ bodies

    @staticmethod
    def _buffer_body(request: _Request) -> None:
        if not isinstance(request.body, memoryview):
            request.filled = len(request.body)
            request.body = body_buffer(request.expected, request.body)  # type: ignore[arg-type]  # only with a declared length

    def _bypassed(self, nbytes: int) -> None:
        request: _Request = self.request  # type: ignore[assignment]  # the one whose body it reads
        request.filled += nbytes
        request.received = self.since = monotonic()
        if request.filled < request.expected:  # type: ignore[operator]  # a declared length
            self.bypass = self.bypass[nbytes:]  # type: ignore[index]  # buffer_updated checked it
            return
        # Whole: the parser never saw these bytes, so a fresh one reads the next request.
        self.bypass = None
        keep_alive = self.parser.should_keep_alive()
        self.parser = httptools.HttpRequestParser(self)
        self.request = None
        self.state = BUSY
        self._queue(request, keep_alive)

    # ------------------------------------------------------------------------------ answering

    def _queue(self, request: _Request, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # a request pipelined behind one that closed the connection
        if self.task is None:
            self.task = eager.start(self._serve(request, keep_alive), self.loop)
        else:
            self.pending.append((request, keep_alive))
            if len(self.pending) >= MAX_PIPELINED and not self.paused_reading and self.transport is not None:
                self.paused_reading = True
                self.transport.pause_reading()

    async def _serve(self, request: _Request, keep_alive: bool) -> None:
        while True:
            response = await self.router.call(request.route, request)  # type: ignore[arg-type]  # queued with one
            if (self.shutting_down or self.host.offline.on) and not self.pending:
                keep_alive = False  # pipelined requests behind it are answered first
            if request.http10 and not isinstance(response.chunks, list):
                keep_alive = False  # no chunked encoding in HTTP/1.0: the end of the stream is the close
            try:
                if request.answer is not None:  # traced: HTTP_SEND_START and _END around it, then the trace
                    await send_timed(request.answer, self._answer(response, request, keep_alive))
                elif not self._wrote_whole(response, request.method, keep_alive):  # _answer, no coroutine
                    await self._write(response, request, keep_alive)
            except ConnectionError:
                return
            except Exception:  # a streamed answer that failed midway: its framing is broken, close
                log.exception("unexpected error answering %s %s", request.method, request.path)
                self.abort()
                return
            if not keep_alive or self.transport is None:
                self._close()
                return
            if not self.pending:
                break
            request, keep_alive = self.pending.popleft()
            if self.paused_reading and len(self.pending) < MAX_PIPELINED // 2:
                self.paused_reading = False
                self.transport.resume_reading()
        self.task = None
        if self.request is None:
            self._idle()

    async def _answer(self, response: HttpResponse, request: _Request, keep_alive: bool) -> None:
        """Any answer: whole (_wrote_whole), else streamed or large (_write)."""
        if not self._wrote_whole(response, request.method, keep_alive):
            await self._write(response, request, keep_alive)

    async def _write(self, response: HttpResponse, request: _Request, keep_alive: bool) -> None:
        """An answer _wrote_whole does not send: streamed, or a body over SMALL_BODY."""
        method = request.method
        chunks = response.chunks
        streamed = not isinstance(chunks, list)
        chunked = streamed and method != "HEAD" and not request.http10
        head = _head(response, keep_alive, chunked)
        transport = self.transport
        if transport is None:
            raise ConnectionResetError
        if method == "HEAD":  # streamed
            self._send(b"".join(head))
            if hasattr(chunks, "aclose"):
                await chunks.aclose()
            return
        if not isinstance(chunks, list):  # streamed
            self._send(b"".join(head))
            await self._write_stream(chunks, chunked, response)
            return
        self._send(b"".join(head))
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            for start in range(0, len(view), WRITE_SLICE):
                self._flush()
                await self._drained()
                transport.write(view[start : start + WRITE_SLICE])

    async def _write_stream(self, chunks: Any, chunked: bool, response: HttpResponse) -> None:
        try:
            async for chunk in chunks:
                if chunk:
                    await self._drained()
                    self._send(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                trailers = b"".join(b"%b: %b\r\n" % field for field in response.trailers or ())
                self._send(b"0\r\n" + trailers + b"\r\n")
        finally:
            await chunks.aclose()

    async def _drained(self) -> None:
        self._flush()
        if not self.writable.is_set():
            await self.writable.wait()
        if self.transport is None:
            raise ConnectionResetError

    # ------------------------------------------------------------------------------ early answers

    def _early_answer(self, response: HttpResponse) -> None:
        """An answer from the head alone (404, 405) while the body, if any, is still coming: it is read
        and dropped, and the connection serves the next request. Waits its turn behind pipelined ones."""
        parsed = self.request
        assert parsed is not None  # from on_headers_complete
        keep_alive = self.parser.should_keep_alive()
        if not keep_alive:
            self.last_read = True  # the client's last request: nothing after it is answered
        if self.task is not None or self.pending:
            request = _Request()
            request.route = _Fixed(response)  # type: ignore[assignment]
            request.method = parsed.method
            self.pending.append((request, keep_alive))
            return
        self._wrote_whole(response, parsed.method, keep_alive)  # an error: a small list, written whole

    def _early_close(self, response: HttpResponse) -> None:
        """An answer after which the framing cannot be trusted (413 by declared length, malformed,
        ambiguous): sent, then the connection closes once the client stops sending. Behind answers still
        going out, it waits its turn (written at once, it would land inside them) and is the last."""
        if self.transport is None or self.state == CLOSING:
            return  # already answered
        if self.last_read:  # the client's last request is answered, or will be: nothing more is
            if self.task is None and not self.pending:
                self._close()
            return
        if self.task is not None or self.pending:
            request = _Request()
            request.route = _Fixed(response)  # type: ignore[assignment]
            request.method = self.request.method if self.request is not None else "GET"
            self.pending.append((request, False))
            self.last_read = True
            return
        self._wrote_whole(response, self.request.method if self.request else "GET", False)
        self.state = CLOSING
        self.pending.clear()
        if self.task is not None:
            self.task.cancel()
        self._flush()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.abort)

    def _refuse(self, response: HttpResponse) -> None:
        """`_early_close` from a parser callback: the parser stops there."""
        self._early_close(response)
        raise httptools.HttpParserCallbackError

    def _head_too_large(self) -> HttpResponse:
        return framing_error(
            self.router.fallback_errors,
            f"request head exceeds the {self.max_head_bytes}-byte limit "
            "(raise it with --http-max-head-bytes)",
            status=431,
        )

    def _wrote_whole(self, response: HttpResponse, method: str, keep_alive: bool) -> bool:
        """Sends an answer whose body is a list of at most SMALL_BODY bytes (or any list, to HEAD) with its
        head, at once; False when it is not one (streamed, or large: _write sends it). Most answers are:
        without a coroutine of their own, each costs ~0.2 us less."""
        chunks = response.chunks
        if type(chunks) is not list or (method != "HEAD" and sum(map(len, chunks)) > SMALL_BODY):
            return False
        head = _head(response, keep_alive, chunked=False)
        self._send(b"".join(head if method == "HEAD" else head + chunks))
        return True

    # ------------------------------------------------------------------------------ lifecycle

    def _idle(self) -> None:
        self.state = IDLE
        self.since = monotonic()
        if self.shutting_down:
            self._close()

    def _close(self) -> None:
        self.state = CLOSING
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def sweep(self, now: float) -> None:
        state, elapsed = self.state, now - self.since
        if state == IDLE and elapsed > self.settings.keep_alive_timeout:
            self._close()
        elif state == HEAD and elapsed > self.settings.head_timeout:
            self._early_close(
                framing_error(
                    self.router.fallback_errors,
                    f"request head not received within {self.settings.head_timeout:g} s "
                    "(raise it with --http-head-timeout)",
                    status=408,
                )
            )
        elif state == BODY and elapsed > self.settings.body_timeout:
            route = self.request.route if self.request is not None else None
            errors = route.errors if route is not None else self.router.fallback_errors
            self._early_close(stalled_body(errors, self.settings.body_timeout))
        elif state == IDLE and self.fresh and elapsed > self.settings.head_timeout:
            self._close()  # connected, never sent a byte

    def leave_when_idle(self) -> None:
        pass  # its next answer says connection: close; closing it idle could race a request

    def shutdown(self) -> None:
        self.shutting_down = True
        if self.state == IDLE and self.task is None:
            self._close()

    def _become_h2(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None  # from connection_made or buffer_updated
        connection = H2Connection(self.host)
        self.host.closed(self)
        transport.set_protocol(cast("asyncio.BaseProtocol", connection))  # one by its methods (connection.py)
        connection.connection_made(transport)
        self.transport = None
        self.parser = _DETACHED
        if data:
            connection.data_in(data)


class _Fixed:
    """A route whose answer is already known: an early error waiting behind pipelined requests."""

    def __init__(self, response: HttpResponse) -> None:
        self.response = response

    async def handler(self, request: HttpRequest) -> HttpResponse:
        return self.response
