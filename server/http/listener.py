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

from tensorgate.server.http.connection import CallOpener, ConnectionHost, HttpSettings, Offline
from tensorgate.server.http.h1 import H1Connection
from tensorgate.server.router import Router

log = logging.getLogger("tensorgate.http")

SWEEP_SECONDS = 1.0
BACKLOG = 4096


def bind(host: str, port: int, reuse_port: bool = False, listen: bool = True) -> list[socket.socket]:
    """Listening sockets for `host` (a name, an IPv4 or IPv6 address) and `port` (0: a free one). With
    `reuse_port`, other processes may listen on the same port (`rebind`), the kernel sharing the new
    connections among them; without `listen`, only bound (they take no connection)."""
    sockets: list[socket.socket] = []
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        if sockets:  # every address of the name on the same port, the first one's if it was free
            address = (address[0], sockets[0].getsockname()[1], *address[2:])
        try:
            sockets.append(_listening(family, address, reuse_port, kind, proto, listen))
        except OSError:
            for bound in sockets:
                bound.close()
            raise
    return sockets


def rebind(sockets: list[socket.socket]) -> list[socket.socket]:
    """More listening sockets on the addresses and ports of `sockets` (bound with reuse_port)."""
    return [_listening(sock.family, sock.getsockname(), True) for sock in sockets]


def _listening(
    family: int,
    address: tuple,
    reuse_port: bool,
    kind: int = socket.SOCK_STREAM,
    proto: int = 0,
    listen: bool = True,
) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        if listen:
            sock.listen(BACKLOG)  # now: a client may connect as soon as the port is logged
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


@dataclass(frozen=True)
class TlsFiles:
    """A port's TLS: its certificate and key (PEM), and for mutual TLS the CAs (PEM) whose certificates
    clients must present."""

    certfile: str
    keyfile: str
    ca_certs: str | None = None


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.certfile, files.keyfile)
    if files.ca_certs is not None:  # mutual: a client without a certificate these CAs signed is refused
        context.load_verify_locations(files.ca_certs)
        context.verify_mode = ssl.CERT_REQUIRED
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
        calls: CallOpener | None = None,
        offline: Offline | None = None,
    ) -> None:
        self.host = ConnectionHost(router, settings, calls, offline)
        self.sockets = sockets
        self.tls = tls
        self.servers: list[asyncio.Server] = []
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
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
