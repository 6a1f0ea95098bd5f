"""What both protocols' connections share (h1.py, h2.py): the limits, the listener's host (router, gRPC
calls, the set of connections), the base of a connection (the transport, writes queued for the end of an
event-loop pass), and the request target and header folding both read the same way. A leaf: it imports
no other module of server/http but buffers.py's neighbours need nothing from it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast
from urllib.parse import unquote

from tensorgate.server.router import Router

if TYPE_CHECKING:
    from tensorgate.server.http.h2 import H2Connection
    from tensorgate.server.http.h2_frames import Stream, StreamHandler


@dataclass
class HttpSettings:
    """Every limit of the transport; each has a CLI flag (server/options_transport.py)."""

    max_request_bytes: int = 1 << 30
    max_head_bytes: int = 64 * 1024  # HTTP/1.1 request line + headers; HTTP/2 decoded header list
    head_timeout: float = 30.0  # a request head (or an HTTP/2 preface) must arrive whole within this
    body_timeout: float = 30.0  # a request body must make progress at least this often (slow uploads)
    keep_alive_timeout: float = 75.0  # an idle connection is closed after this
    max_connections: int = 10_000
    h2_max_concurrent_streams: int = 256
    h2_max_resets_per_second: int = 200  # client RST_STREAMs (rapid reset, CVE-2023-44487)
    # SETTINGS, PING, PRIORITY, empty DATA, WINDOW_UPDATE a second, beyond 10 per write of answer frames
    h2_max_control_frames_per_second: int = 1000
    # Keepalive PINGs, as grpc-core servers take them: one sooner than this after the last, with no answer
    # sent between, is a strike; past the strikes, GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
    h2_min_ping_interval: float = 300.0
    h2_max_ping_strikes: int = 2
    graceful_timeout: float = 30.0
    # HTTP/2 connections of ports that serve gRPC: grpc-core's server keepalive and connection age (Triton's
    # --grpc-keepalive-* and --grpc-max-connection-age* flags; seconds, an age or grace of 0 is none).
    grpc_keepalive_time: float = 7200.0
    grpc_keepalive_timeout: float = 20.0
    grpc_keepalive_permit_without_calls: bool = False
    grpc_max_pings_without_data: int = 2  # keepalive PINGs sent with no answer frame between; 0: any
    grpc_max_connection_age: float = 0.0
    grpc_max_connection_age_grace: float = 0.0
    grpc_infer_compression_level: str = "none"  # none, low, medium, high: ModelInfer's answers


class Connection(Protocol):
    def sweep(self, now: float) -> None:
        """Closes the connection if one of its timeouts has passed."""

    def shutdown(self) -> None:
        """Stops taking new requests: closes now if idle, else once what is in flight is answered."""

    def leave_when_idle(self) -> None:
        """The server went offline: the client is invited to take its next requests elsewhere."""

    def abort(self) -> None:
        """Closes at once."""


class Offline:
    """The server out of rotation (grps Offline), for every listener. While it is, connections are ended
    at their next idle moment, so keep-alive clients move to other replicas before a shutdown: HTTP/1.1
    answers say `connection: close`; an HTTP/2 connection gets GOAWAY NO_ERROR once no stream is open
    (a request racing it is one the client knows was not processed). Requests are served meanwhile."""

    def __init__(self) -> None:
        self.on = False
        self.hosts: list[ConnectionHost] = []

    def set(self, on: bool) -> None:
        self.on = on
        if on:
            for host in self.hosts:
                for connection in list(host.connections):
                    connection.leave_when_idle()


class CallOpener(Protocol):
    """What opens the HTTP/2 streams that are not plain requests (gRPC calls, server/http/grpc_call.py):
    given a stream whose head is in, its handler, or None when the stream is a plain request."""

    def open(self, connection: H2Connection, stream: Stream) -> StreamHandler | None: ...

    def begin_shutdown(self) -> None: ...


def fold_header(headers: dict[bytes, bytes], name: bytes, value: bytes) -> None:
    """A repeated header field joins the earlier ones with ", " (RFC 9110 5.3). Callers set a field seen
    for the first time themselves: a call per field costs ~60 ns on the hot path."""
    headers[name] += b", " + value


def split_target(target: bytes) -> tuple[str, bytes]:
    """A request target -> its percent-decoded path and its query string."""
    path, _, query = target.partition(b"?")
    text = path.decode("latin-1")
    return (unquote(text, encoding="latin-1") if "%" in text else text), query


class BaseConnection:
    """What both protocols share (h1.py, h2.py): their host, the transport, the event pause_writing and
    resume_writing keep, and the bytes queued for the end of the event loop's pass.

    An asyncio buffered protocol by its methods, not by asyncio.BufferedProtocol as its base: compiled, it
    is an extension type (connection.pxd), whose state is read as C fields, and an extension type's base
    is one too. uvloop reads into `get_buffer` whenever a protocol has one; asyncio's own loop hands such a
    protocol `data_received`."""

    def __init__(self, host: ConnectionHost) -> None:
        self.host = host
        self.router = host.router
        self.settings: HttpSettings = host.settings
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.out: list[bytes] = []  # bytes to write at the end of this pass of the event loop
        self.flush_pending = False

    def get_buffer(self, sizehint: int) -> memoryview:
        raise NotImplementedError

    def buffer_updated(self, nbytes: int) -> None:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        """The bytes of a read that the event loop did not make into `get_buffer` (asyncio's own loop, where
        uvloop is absent), copied into it piece by piece."""
        view = memoryview(data)
        while view:
            buffer = self.get_buffer(len(view))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            self.buffer_updated(size)
            view = view[size:]

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(cast("Connection", self))  # its subclasses are (h1.py, h2.py)
        self.transport = None
        self.writable.set()  # a writer waiting for the socket wakes and finds it gone

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def _send(self, data: bytes) -> None:
        """Queues bytes for the socket: what the answers of one event-loop pass write goes out at its end,
        together. Written one by one from the read callbacks, each answer woke the client separately:
        ~25% more server CPU a request at full load (bench.transport)."""
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        self.flush_pending = False
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out) if len(self.out) > 1 else self.out[0])
        self.out.clear()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class ConnectionHost:
    """What every connection of one listener shares: the router, what opens gRPC calls (HTTP/2 requests
    with content-type application/grpc), the limits, the set of connections."""

    def __init__(
        self,
        router: Router,
        settings: HttpSettings,
        calls: CallOpener | None = None,
        offline: Offline | None = None,
    ) -> None:
        self.router = router
        self.calls = calls
        self.settings = settings
        self.offline = offline if offline is not None else Offline()
        self.offline.hosts.append(self)
        self.connections: set[Connection] = set()
        self.closing = False
        self.idle = asyncio.Event()  # set whenever no connection is open
        self.idle.set()

    def opened(self, connection: Connection) -> bool:
        """Registers a new connection; False when it must be refused (limit reached, or shutting down)."""
        if self.closing or len(self.connections) >= self.settings.max_connections:
            return False
        self.connections.add(connection)
        self.idle.clear()
        return True

    def closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self.idle.set()
