"""HTTP/1.1 load generator: keep-alive connections on raw asyncio protocols, one request in flight each.

The request is serialised once; per response the client finds the end of the head, reads the status and
Content-Length (or walks the chunks), records the latency and writes the next request. Nothing else.
"""

import asyncio
import time
from typing import cast

from bench.connections import connect, run_until_cancelled
from bench.stats import Recorder
from tensorgate.perf.h1wire import whole_answer


class _Connection(asyncio.Protocol):
    def __init__(self, request: bytes, rec: Recorder, closed: "asyncio.Future[None]") -> None:
        self.request = request
        self.rec = rec
        self.closed = closed
        self.transport: asyncio.Transport
        self.buf = b""
        self.t0 = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.send()

    def send(self) -> None:
        self.t0 = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        try:
            answer = whole_answer(buf)
        except ValueError:
            self.rec.error()
            self.transport.close()
            return
        if answer is None:
            self.buf = buf
            return
        _, status, _, end, _ = answer
        self.rec.record(time.perf_counter() - self.t0, 200 <= status < 300)
        self.buf = buf[end:]  # empty: one request is in flight at a time
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def run_h1(host: str, port: int, request: bytes, concurrency: int, rec: Recorder) -> None:
    """Keep `concurrency` connections busy until cancelled; a lost connection is an error, then reconnects."""
    loop = asyncio.get_running_loop()

    async def connection() -> None:
        while True:
            closed: asyncio.Future[None] = loop.create_future()
            transport, _ = await connect(
                lambda closed=closed: _Connection(request, rec, closed), host, port, rec
            )
            try:
                await closed
            finally:
                transport.close()
            rec.error()  # the server closed it with a request in flight
            await asyncio.sleep(0.01)

    await run_until_cancelled(connection() for _ in range(concurrency))
