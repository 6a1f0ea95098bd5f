"""The transport's fuzz targets: bytes fed to a real connection (server/http/h1.py, which hands an HTTP/2
preface to server/http/h2.py) over a transport that only records what the server writes, with a real
router (a JSON echo, a streamed answer, an error) behind it.

An input passes when no protocol method raises, and no callback or task the connection started ends
in an exception the event loop would only log (a handler's errors are answers, never tracebacks).
"""

from __future__ import annotations

import asyncio
from typing import Any

from codec.errors import invalid
from server.endpoints.v2 import error_response
from server.http.h1 import H1Connection
from server.http.listener import ConnectionHost, HttpSettings
from server.router import HttpRequest, HttpResponse, Router, body_response

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame


class LoopError(Exception):
    """What the event loop was asked to log: an exception that escaped a callback or a task."""


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = None
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)

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
        pass

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


def feed(data: bytes, step: int) -> None:
    """`data` on one new connection, on an event loop of its own (nothing carries over between inputs):
    fed `step` bytes at a time, the loop run between pieces and until the connection's work is done."""
    loop = asyncio.new_event_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    try:
        loop.run_until_complete(_feed(data, step))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
    if errors:
        raise LoopError(f"{errors[0].get('message')}: {errors[0].get('exception')!r}")


async def _feed(data: bytes, step: int) -> None:
    host = ConnectionHost(ROUTER, SETTINGS_USED)
    transport = FakeTransport()
    connection = H1Connection(host)
    transport.set_protocol(connection)
    connection.connection_made(transport)
    for start in range(0, len(data), step):
        protocol = transport.get_protocol()
        if transport.closed:
            break
        chunk = data[start : start + step]
        while chunk:
            buffer = protocol.get_buffer(len(chunk))
            size = min(len(buffer), len(chunk))
            buffer[:size] = chunk[:size]
            protocol.buffer_updated(size)
            chunk = chunk[size:]
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


def http1(data: bytes) -> None:
    """Bytes on a connection, in pieces whose size the first byte chooses (a head split anywhere)."""
    if data:
        feed(data[1:], data[0] % 64 + 1)


def http2(data: bytes) -> None:
    """Frames after the preface and an empty SETTINGS (HPACK blocks, flow control, every frame type)."""
    if data:
        feed(PREFACE + SETTINGS + data[1:], data[0] % 256 + 1)
