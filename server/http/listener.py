"""One listener per port: binds the sockets, accepts connections, tells HTTP/1.1 from HTTP/2, and drains.

A connection starts as HTTP/1.1 (server/http/h1.py) and becomes HTTP/2 (server/http/h2.py) when its
first bytes are the HTTP/2 connection preface (cleartext, prior knowledge) or TLS chose `h2` by ALPN.
Timeouts are checked by one sweep a second over the open connections, not a timer per request.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from server.router import Router

if TYPE_CHECKING:
    from server.http.grpc_call import GrpcServices

log = logging.getLogger("tensorgate.http")

SWEEP_SECONDS = 1.0
BACKLOG = 4096


@dataclass
class HttpSettings:
    """Every limit of the transport; each has a CLI flag (server/cli.py)."""

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


LARGE_BODY = 1 << 20  # bodies from this size are received into numpy memory


def body_buffer(size: int, first: bytes | memoryview) -> memoryview:
    """A buffer for a request body of `size` bytes, `first` (what came so far) already in it. From a MiB
    it is numpy memory: not zeroed, and numpy asks the kernel for transparent huge pages, so 64 MiB fill
    in ~10 ms instead of ~50 ms of page faults."""
    buffer = memoryview(np.empty(size, dtype=np.uint8) if size >= LARGE_BODY else bytearray(size))
    buffer[: len(first)] = first
    return buffer


class BaseConnection(asyncio.BufferedProtocol):
    """What both protocols share (h1.py, h2.py): their host, the transport, the event pause_writing and
    resume_writing keep, and the bytes queued for the end of the event loop's pass."""

    def __init__(self, host: ConnectionHost) -> None:
        self.host = host
        self.settings = host.settings
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.out: list[bytes] = []  # bytes to write at the end of this pass of the event loop
        self.flush_pending = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(self)
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
    """What every connection of one listener shares: the router, the gRPC services (HTTP/2 requests with
    content-type application/grpc go to them), the limits, the set of connections."""

    def __init__(
        self,
        router: Router,
        settings: HttpSettings,
        grpc: GrpcServices | None = None,
        offline: Offline | None = None,
    ) -> None:
        self.router = router
        self.grpc = grpc
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


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host` (a name, an IPv4 or IPv6 address) and `port` (0: a free one)."""
    sockets = []
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            for bound in sockets:
                bound.close()
            raise
        sock.listen(BACKLOG)  # now: a client may connect as soon as the port is logged
        sock.setblocking(False)
        sockets.append(sock)
        if port == 0:  # every address of the name on the same free port
            port = sock.getsockname()[1]
    return sockets


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    context.set_alpn_protocols(["h2", "http/1.1"])
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def raise_fd_limit() -> None:
    """Lifts the soft limit on open files to the hard one: every connection is a file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            log.warning("could not raise the open-file limit from %d to %d", soft, hard)


class Listener:
    """Our transport on bound sockets: `start`, then `shutdown` (graceful) when the server stops."""

    def __init__(
        self,
        router: Router,
        settings: HttpSettings,
        sockets: list[socket.socket],
        tls: ssl.SSLContext | None = None,
        grpc: GrpcServices | None = None,
        offline: Offline | None = None,
    ) -> None:
        self.host = ConnectionHost(router, settings, grpc, offline)
        self.sockets = sockets
        self.tls = tls
        self.servers: list[asyncio.Server] = []
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        from server.http.h1 import H1Connection

        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            self.servers.append(
                await loop.create_server(
                    lambda: H1Connection(self.host), sock=sock, ssl=self.tls, backlog=BACKLOG
                )
            )
        self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            now = loop.time()
            for connection in list(self.host.connections):
                connection.sweep(now)

    async def shutdown(self) -> None:
        """Stops accepting, lets every connection finish what it has in flight (idle ones close at
        once, HTTP/2 ones get GOAWAY), and closes what is left after the graceful timeout."""
        self.host.closing = True
        for server in self.servers:
            server.close()
        for connection in list(self.host.connections):
            connection.shutdown()
        try:
            await asyncio.wait_for(self.host.idle.wait(), self.host.settings.graceful_timeout)
        except TimeoutError:
            log.warning("%d connections still open after the graceful timeout", len(self.host.connections))
            for connection in list(self.host.connections):
                connection.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for server in self.servers:
            await server.wait_closed()
