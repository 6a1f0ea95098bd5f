"""The hypercorn settings every HTTP listener of ours (and bench's bare ceiling app) runs with."""

import logging

import hypercorn.asyncio.tcp_server
from hypercorn.config import Config
from hypercorn.events import Closed
from hypercorn.protocol.h2 import H2Protocol

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


def hypercorn_config(host: str, port: int, *, log_level: str = "info") -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.keep_alive_max_requests = 2**31  # hypercorn's default of 1000 makes load tests reconnect
    config.keep_alive_timeout = 75
    config.h2_max_concurrent_streams = 256
    config.h11_max_incomplete_size = 64 * 1024  # request line + headers
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through the process's own logging setup
    config.loglevel = log_level.upper()
    config.graceful_timeout = 30
    return config
