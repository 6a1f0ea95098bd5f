"""The transport's fuzz targets: bytes fed to a real connection (server/http/h1.py, which hands an HTTP/2
preface to server/http/h2.py) over a transport that records what the server writes, with a real router
(a JSON echo, a streamed answer, an error) behind it.

An input passes when no protocol method raises, no callback or task the connection started ends in an
exception the event loop would only log (a handler's errors are answers, never tracebacks), nothing is
logged with a traceback, and what the server wrote reads back (fuzz/readback.py) as well-formed HTTP/1.1
answers or HTTP/2 frames, with no traceback text in them. A bit of the first byte puts a valid request
before the data: it must be answered, correctly, before the data arrives.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hpack import Encoder

from fuzz.readback import Mismatch, client_max_frame, http1_answers, http2_answers
from tensorgate.codec.errors import invalid
from tensorgate.server.endpoints.v2 import error_response
from tensorgate.server.http.h1 import H1Connection
from tensorgate.server.http.listener import ConnectionHost, HttpSettings
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
TRACEBACK = b"Traceback (most recent call last)"

# The valid request put before the data (when the first byte asks), and its answer's body.
ASKED = b"hello"
H1_REQUEST = b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n" + ASKED
_block = Encoder().encode(
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/echo"),
        (":authority", "x"),
        ("content-length", "5"),
    ]
)
H2_REQUEST = (  # HEADERS then DATA (END_STREAM) on stream 1
    len(_block).to_bytes(3, "big") + b"\x01\x04\x00\x00\x00\x01" + _block
) + (len(ASKED).to_bytes(3, "big") + b"\x00\x01\x00\x00\x00\x01" + ASKED)


class LoopError(Exception):
    """What the event loop was asked to log: an exception that escaped a callback or a task."""


class _Tracebacks(logging.Handler):
    """The server's log records that carry an exception (its "unexpected error" tracebacks)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


TRACEBACKS = _Tracebacks()  # on the server's logger while an input runs


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = None
        self.out = bytearray()  # everything the server wrote
        self.closed = False
        self.eof = False

    def write(self, data: Any) -> None:
        if self.eof:  # as asyncio's socket transports do
            raise RuntimeError("Cannot call write() after write_eof()")
        self.out += data

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)


class RecordingH1(H1Connection):
    """The HTTP/1.1 connection, noting the method of each answer it writes: reading the output back
    needs it (an answer to HEAD has a Content-Length and no body)."""

    def __init__(self, host: ConnectionHost) -> None:
        super().__init__(host)
        self.methods: list[str] = []

    def _wrote_whole(self, response: HttpResponse, method: str, keep_alive: bool) -> bool:
        whole = super()._wrote_whole(response, method, keep_alive)
        if whole:
            self.methods.append(method)
        return whole

    async def _write(self, response: HttpResponse, request: Any, keep_alive: bool) -> None:
        self.methods.append(request.method)  # the answers _wrote_whole does not send
        await super()._write(response, request, keep_alive)


async def echo(request: HttpRequest) -> HttpResponse:
    return body_response(bytes(request.body))


async def streamed(request: HttpRequest) -> HttpResponse:
    async def chunks():
        for part in (b"one ", b"two"):
            await asyncio.sleep(0)
            yield part

    return HttpResponse(200, [(b"content-type", b"text/plain")], chunks())


async def refuse(request: HttpRequest) -> HttpResponse:
    raise invalid("refused")


def router() -> Router:
    routes = Router(fallback_errors=error_response)
    for method in ("GET", "POST"):
        routes.add(method, "/echo", echo, error_response)
        routes.add(method, "/stream", streamed, error_response)
        routes.add(method, "/refuse", refuse, error_response)
    return routes


ROUTER = router()
SETTINGS_USED = HttpSettings(max_request_bytes=1 << 20)


def feed(data: bytes, step: int, first: bytes = b"") -> Any:
    """`data` on one new connection, on an event loop of its own (nothing carries over between inputs):
    `first` in one piece, the loop run until it is answered, then `data` fed `step` bytes at a time, the
    loop run between pieces and until the connection's work is done. Returns what the server wrote, read
    back: a list of HTTP/1.1 answers or a dict of HTTP/2 streams."""
    loop = asyncio.new_event_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    TRACEBACKS.records.clear()
    logger = logging.getLogger("tensorgate")
    logger.addHandler(TRACEBACKS)
    try:
        answers = loop.run_until_complete(_feed(data, step, first))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
        logger.removeHandler(TRACEBACKS)
    if errors:
        raise LoopError(f"{errors[0].get('message')}: {errors[0].get('exception')!r}")
    if TRACEBACKS.records:
        record = TRACEBACKS.records[0]
        TRACEBACKS.records.clear()
        raise LoopError(f"the server logged a traceback: {record.getMessage()}: {record.exc_info[1]!r}")
    return answers


def _read_back(transport: FakeTransport, sent: bytes) -> Any:
    """What the server wrote so far, read back (raises Mismatch when it does not read)."""
    out = bytes(transport.out)
    if TRACEBACK in out:
        raise Mismatch(f"traceback text in the output: {out[max(0, out.index(TRACEBACK) - 200) :][:1000]!r}")
    protocol = transport.get_protocol()
    if isinstance(protocol, RecordingH1):
        return http1_answers(out, protocol.methods)
    return http2_answers(out, client_max_frame(sent))


def _answered(answers: Any) -> bool:
    """Whether the valid request put first got its answer: 200 and the body it sent (echoed)."""
    if isinstance(answers, dict):
        stream = answers.get(1)
        return stream is not None and stream.ended and (stream.status, stream.body) == (200, ASKED)
    finals = [a for a in answers if a.status >= 200]
    return len(finals) == 1 and finals[0].complete and (finals[0].status, finals[0].body) == (200, ASKED)


async def _feed(data: bytes, step: int, first: bytes) -> Any:
    host = ConnectionHost(ROUTER, SETTINGS_USED)
    transport = FakeTransport()
    connection = RecordingH1(host)
    transport.set_protocol(connection)
    connection.connection_made(transport)
    sent = first + data
    if first:
        connection.data_received(first)  # into get_buffer, piece by piece, as uvloop reads
        for _ in range(50):
            await asyncio.sleep(0)
            if _answered(_read_back(transport, first)):
                break
        else:
            raise Mismatch(f"a valid request got no answer: {bytes(transport.out)[:2000]!r}")
    for start in range(0, len(data), step):
        if transport.closed:
            break
        transport.get_protocol().data_received(data[start : start + step])
        for _ in range(3):
            await asyncio.sleep(0)
    for _ in range(5):  # handlers and answers run their course
        await asyncio.sleep(0)
    transport.get_protocol().connection_lost(None)
    for _ in range(5):
        await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return _read_back(transport, sent)


def http1(data: bytes) -> Any:
    """Bytes on a connection, in pieces whose size the first byte's low 6 bits choose (a head split
    anywhere); its bit 6 puts a valid request (answered before the data comes) first."""
    if not data:
        return None
    return feed(data[1:], data[0] % 64 + 1, H1_REQUEST if data[0] & 0x40 else b"")


def http2(data: bytes) -> Any:
    """Frames after the preface and an empty SETTINGS (HPACK blocks, flow control, every frame type), in
    pieces whose size the first byte's low 7 bits choose; its bit 7 puts a valid request on stream 1
    (answered before the data comes) first."""
    if not data:
        return None
    step = data[0] % 128 + 1
    if data[0] & 0x80:
        return feed(data[1:], step, PREFACE + SETTINGS + H2_REQUEST)
    return feed(PREFACE + SETTINGS + data[1:], step)
