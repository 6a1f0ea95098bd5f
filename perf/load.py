"""One process's share of the load: its connections, the requests it sends, and what it measured.

Closed loop (`concurrency`): each of `concurrency` slots (an HTTP/1.1 connection, an HTTP/2 or gRPC
stream) sends its next request when the last is answered; latency runs from the send.

Open loop (`rate`): requests are due at fixed intervals (constant) or at exponential ones (Poisson), and
each goes out at its due time on a free slot, a new connection opened when none is free (up to
`max_connections`, past which it waits); latency runs from the due time, not the send, so a server that
stalls is charged for the queue it made (no coordinated omission).

`swap()` ends a measurement window and starts the next without pausing the load: what the window
counted (answers, errors by kind, an HDR histogram, this process's CPU). `stop()` sends nothing more and
waits for the requests in flight, so every request sent is answered (or failed) and counted in `sent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter, deque
from dataclasses import dataclass

from tensorgate.perf.clients import H1, H2, Connection, Grpc
from tensorgate.perf.hdr import Histogram
from tensorgate.perf.pacer import Pacer
from tensorgate.perf.protocols import GRPC, HTTP1, STREAM_PATH, Answer, Checker, Wire

CONNECT_RETRIES = 3


@dataclass
class Window:
    seconds: float
    ok: int
    errors: Counter
    histogram: Histogram
    cpu: float  # this process's CPU seconds in it
    delayed: int = 0  # open loop: requests sent later than 1 ms after their due time

    def to_wire(self) -> dict:
        return {
            "seconds": self.seconds,
            "ok": self.ok,
            "errors": dict(self.errors),
            "cpu": self.cpu,
            "histogram": self.histogram.to_wire(),
            "delayed": self.delayed,
        }

    @classmethod
    def from_wire(cls, doc: dict) -> Window:
        return cls(
            doc["seconds"],
            doc["ok"],
            Counter(doc["errors"]),
            Histogram.from_wire(doc["histogram"]),
            doc["cpu"],
            doc["delayed"],
        )


@dataclass
class Target:
    host: str
    port: int
    protocol: str
    wires: list[Wire]
    checker: Checker
    connections: int = 4  # HTTP/2 and gRPC: the connections the streams share
    max_connections: int = 1024  # open loop over HTTP/1.1 and gRPC streams


class Load:
    def __init__(self, target: Target) -> None:
        self.target = target
        host = f"{target.host}:{target.port}"
        protocol = target.protocol
        if protocol in HTTP1:
            requests = [H1.wire(w, host) for w in target.wires]
            binary = protocol == "rest-binary"
            self.factory = lambda: H1(requests, self, binary)
        elif protocol in GRPC:
            framed = [Grpc.wire(w) for w in target.wires]
            path, streaming = target.wires[0].path, target.wires[0].path == STREAM_PATH
            self.factory = lambda: Grpc(framed, self, host, path, streaming)
        else:
            pairs = [H2.wire(w, host) for w in target.wires]
            self.factory = lambda: H2(pairs, self)
        self.h1 = protocol in HTTP1  # a connection carries one request at a time
        self.one_each = self.h1 or protocol == "grpc-stream"  # a slot (connection, stream) carries one
        self.count = len(target.wires)
        self.next_index = 0
        self.connections: list[Connection] = []
        self.free: list[
            Connection
        ] = []  # open loop, one-each: connections (or streams' connection) with room
        self.queue: deque[tuple[int, float]] = deque()  # open loop: due requests waiting for a slot
        self.closed_loop = True
        self.running = False
        self.orphans = 0  # closed loop: slots whose connection was lost, waiting for a new one
        self.sent = 0
        self.answered = 0
        self.failed = Counter()  # every failure of the whole run, by kind
        self._reset_window()
        self._drained: asyncio.Future | None = None
        self._pacer: Pacer | None = None

    def _reset_window(self) -> None:
        self.latencies: list[float] = []
        self.ok = 0
        self.errors: Counter = Counter()
        self.delayed = 0
        self.window_start = time.perf_counter()
        self.cpu_start = time.process_time()

    # ---------------------------------------------------------------------------------- starting

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        for attempt in range(CONNECT_RETRIES):
            try:
                _, connection = await loop.create_connection(self.factory, self.target.host, self.target.port)
                self.connections.append(connection)
                return connection
            except OSError as e:
                if attempt == CONNECT_RETRIES - 1:
                    raise ConnectionError(f"{self.target.host}:{self.target.port}: {e}") from None
                await asyncio.sleep(0.2)
        raise AssertionError

    async def start_closed(self, concurrency: int) -> None:
        self.closed_loop, self.running = True, True
        if self.h1:
            connections = [await self._connect() for _ in range(concurrency)]
            slots = connections
        else:
            count = max(1, min(self.target.connections, concurrency))
            connections = [await self._connect() for _ in range(count)]
            slots = [connections[i % count] for i in range(concurrency)]
        self._reset_window()
        for connection in slots:
            self._send(connection, time.perf_counter())

    async def start_open(self, rate: float, poisson: bool, seed: int = 0) -> None:
        self.closed_loop, self.running = False, True
        count = 1 if self.h1 else max(1, self.target.connections)
        for _ in range(count):
            self.free.append(await self._connect())
        self._reset_window()
        draw = random.Random(seed)
        self._gap = (lambda: draw.expovariate(rate)) if poisson else (lambda: 1.0 / rate)
        self._due = time.perf_counter()
        self._pacer = Pacer(asyncio.get_running_loop(), self._tick)
        self._tick()

    def _tick(self) -> None:
        """Every request due by now sent (each charged from its due time), the pacer set for the next."""
        if not self.running:
            return
        now = time.perf_counter()
        while self._due <= now:
            self._dispatch(self._due, now)
            self._due += self._gap()
        self._pacer.at(self._due)  # type: ignore[union-attr]

    def _dispatch(self, due: float, now: float) -> None:
        if now - due > 0.001:
            self.delayed += 1
        index = self._index()
        slot = self._slot()
        if slot is None:
            self.queue.append((index, due))
            if len(self.connections) < self.target.max_connections:
                asyncio.get_running_loop().create_task(self._grow())
            return
        self._send_index(slot, index, due)

    def _slot(self) -> Connection | None:
        if not self.one_each:  # multiplexed: the connection with fewest in flight
            live = [c for c in self.free if c.transport is not None and not c.transport.is_closing()]
            return min(live, key=lambda c: c.in_flight, default=None)
        while self.free:
            connection = self.free.pop()
            if connection.transport is not None and not connection.transport.is_closing():
                if self.target.protocol == "grpc-stream" and connection.in_flight >= 64:
                    continue
                return connection
        return None

    async def _grow(self) -> None:
        try:
            connection = await self._connect()
        except ConnectionError:
            self._fail_queue()
            return
        self._release(connection)

    def _fail_queue(self) -> None:
        queue, self.queue = self.queue, deque()
        for index, due in queue:
            self.sent += 1
            self.done(None, index, due, None)

    # ---------------------------------------------------------------------------------- the loop

    def _index(self) -> int:
        index = self.next_index
        self.next_index = (index + 1) % self.count
        return index

    def _send(self, connection: Connection, began: float) -> None:
        self._send_index(connection, self._index(), began)

    def _send_index(self, connection: Connection, index: int, began: float) -> None:
        self.sent += 1
        connection.send(index, began)
        if self.target.protocol == "grpc-stream" and not self.closed_loop and connection not in self.free:
            self.free.append(connection)  # it opens another stream for the next one, if asked

    def done(self, connection: Connection | None, index: int, began: float, answer: Answer | None) -> None:
        now = time.perf_counter()
        self.answered += 1
        if answer is None:
            kind = "connection lost"
            self.target.checker.examples.setdefault(kind, "the connection ended with the request in flight")
        else:
            kind = self.target.checker(index, answer)
        self.latencies.append(now - began)
        if kind:
            self.errors[kind] += 1
            self.failed[kind] += 1
        else:
            self.ok += 1
        if self.running and connection is not None:
            if not self.closed_loop:
                self._release(connection)
            elif connection.transport is not None and not connection.transport.is_closing():
                self._send(connection, now)
            else:  # its slot goes on on a new connection (lost())
                self.orphans += 1
        elif self._drained is not None and self.answered >= self.sent and not self._drained.done():
            self._drained.set_result(None)

    def _release(self, connection: Connection) -> None:
        if self.queue:
            index, due = self.queue.popleft()
            self._send_index(connection, index, due)
        elif self.h1 or connection not in self.free:
            self.free.append(connection)

    def lost(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.remove(connection)
        if connection in self.free:
            self.free.remove(connection)
        if self.running and self.closed_loop and self.orphans:  # its slots go on on a new connection
            slots, self.orphans = self.orphans, 0
            asyncio.get_running_loop().create_task(self._reconnect(slots))

    async def _reconnect(self, slots: int) -> None:
        while True:
            await asyncio.sleep(0.01)
            if not self.running:
                return
            try:
                connection = await self._connect()
                break
            except ConnectionError as e:  # the server is away: counted, and tried again
                self.errors["connection refused"] += 1
                self.failed["connection refused"] += 1
                self.target.checker.examples.setdefault("connection refused", str(e))
        if self.h1:
            self._send(connection, time.perf_counter())
            for _ in range(slots - 1):
                asyncio.get_running_loop().create_task(self._reconnect(1))
            return
        for _ in range(slots):
            self._send(connection, time.perf_counter())

    # ---------------------------------------------------------------------------------- windows

    def swap(self) -> Window:
        now, cpu = time.perf_counter(), time.process_time()
        histogram = Histogram()
        histogram.record(self.latencies)
        window = Window(
            now - self.window_start, self.ok, self.errors, histogram, cpu - self.cpu_start, self.delayed
        )
        self._reset_window()
        return window

    async def stop(self, timeout: float = 30.0) -> dict:
        """No more requests; waits (up to `timeout` s) for those in flight; closes the connections.
        Returns the whole run's counts: sent, answered, and failures by kind."""
        self.running = False
        if self._pacer is not None:
            self._pacer.close()
        self._fail_queue()
        if self.answered < self.sent:
            self._drained = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained, timeout)
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)
        return {"sent": self.sent, "answered": self.answered, "failed": dict(self.failed)}
