"""HTTP/2 load generator: the `h2` state machine on raw asyncio protocols, cleartext with prior knowledge.

`concurrency` streams are spread over a few connections; whenever a stream ends another one starts, so the
number in flight stays constant. Header validation and normalisation are off and the receive windows are
huge, so the per-request cost is h2's frame handling and little else.
"""

import asyncio
import time
from typing import cast

from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.settings import SettingCodes

from bench.connections import connect, run_until_cancelled
from bench.stats import Recorder
from tensorgate.perf.h2wire import CONFIG, WINDOW, pump


class _Connection(asyncio.Protocol):
    def __init__(
        self,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        streams: int,
        rec: Recorder,
        closed: "asyncio.Future[None]",
    ) -> None:
        self.headers = headers
        self.body = body
        self.streams = streams
        self.rec = rec
        self.closed = closed
        self.conn = H2Connection(config=CONFIG)
        self.transport: asyncio.Transport
        self.started: dict[int, float] = {}  # stream id -> perf_counter at send
        self.status: dict[int, int] = {}
        self.unsent: dict[int, memoryview] = {}  # request body bytes waiting for send window
        self.received = 0  # response bytes since the last connection window top-up
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        conn = self.conn
        conn.initiate_connection()
        conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: WINDOW, SettingCodes.ENABLE_PUSH: 0})
        conn.increment_flow_control_window(WINDOW)
        for _ in range(self.streams):
            self.start()
        transport.write(conn.data_to_send())

    def start(self) -> None:
        if self.closing:
            return
        sid = self.conn.get_next_available_stream_id()
        self.started[sid] = time.perf_counter()
        self.conn.send_headers(sid, self.headers, end_stream=not self.body)
        if self.body:
            self.unsent[sid] = memoryview(self.body)
            pump(self.conn, self.unsent, sid)

    def finish(self, sid: int, ok: bool) -> None:
        t0 = self.started.pop(sid, None)
        self.status.pop(sid, None)
        self.unsent.pop(sid, None)
        if t0 is not None:
            self.rec.record(time.perf_counter() - t0, ok)
            self.start()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        try:
            events = conn.receive_data(data)
        except Exception:  # a protocol error from the server: count it and give up on this connection
            self.rec.error()
            self.transport.close()
            return
        for event in events:
            kind = type(event)
            if kind is DataReceived:
                self.received += event.flow_controlled_length
            elif kind is ResponseReceived:
                for name, value in event.headers:
                    if name == b":status":
                        self.status[event.stream_id] = int(value)
                        break
            elif kind is StreamEnded:
                status = self.status.get(event.stream_id, 0)
                self.finish(event.stream_id, 200 <= status < 300)
            elif kind is StreamReset:
                self.finish(event.stream_id, False)
            elif kind is WindowUpdated:
                for sid in list(self.unsent):
                    pump(self.conn, self.unsent, sid)
            elif kind is ConnectionTerminated:
                self.closing = True
                self.transport.close()
        if self.received > WINDOW // 2:  # keep the connection window open; stream windows are 1 GiB each
            conn.increment_flow_control_window(self.received)
            self.received = 0
        out = conn.data_to_send()
        if out:
            self.transport.write(out)

    async def shutdown(self, wait: float = 2.0) -> None:
        """Start no more streams, let those in flight finish (up to `wait` s), then GOAWAY and close.

        Dropping the TCP connection under open streams is legal too, but hypercorn 0.18 then keeps a
        task alive that holds up its graceful shutdown for `graceful_timeout`; a polite client avoids that.
        """
        self.closing = True
        deadline = time.perf_counter() + wait
        while self.started and not self.transport.is_closing() and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        if not self.transport.is_closing():
            self.conn.close_connection()
            self.transport.write(self.conn.data_to_send())
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if not self.closed.done():
            self.closed.set_result(None)


async def run_h2(
    host: str,
    port: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    concurrency: int,
    rec: Recorder,
    connections: int = 4,
) -> None:
    """Keep `concurrency` streams in flight over `connections` connections until cancelled."""
    loop = asyncio.get_running_loop()
    connections = max(1, min(connections, concurrency))
    shares = [concurrency // connections + (i < concurrency % connections) for i in range(connections)]

    async def connection(streams: int) -> None:
        while True:
            closed: asyncio.Future[None] = loop.create_future()
            _, proto = await connect(
                lambda closed=closed: _Connection(headers, body, streams, rec, closed), host, port, rec
            )
            try:
                await closed
            except asyncio.CancelledError:
                await proto.shutdown()
                raise
            for _ in proto.started:  # streams that were in flight when the connection went away
                rec.error()
            await asyncio.sleep(0.01)

    await run_until_cancelled(connection(n) for n in shares)
