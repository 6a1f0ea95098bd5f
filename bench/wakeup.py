"""python -m bench.wakeup: what a message between two processes costs, by how it travels (issue 26's "a ring
or queue with a cheap wake-up (eventfd, pipe or futex: measure)").

Two processes on uvloop answer each other's `simple`-sized messages (the INFER a worker sends, packed by
codec/ipc.py), with `--in-flight` messages outstanding, over:

    socket      server/link.Link on a Unix socketpair: what `--workers` and python instances use
    ring        a ring of bytes in shared memory each way, and an eventfd written with each flush
    ring-lazy   the same, the eventfd written only while the reader said it sleeps (a full fence, a
                lock-prefixed instruction, between the write and the look; the futex pattern)

CPU per round trip is both processes' (user + system, from getrusage and /proc), over `--messages` round
trips, the mechanisms alternating round by round. The ring's reader can only learn of new bytes from the
eventfd: an asyncio loop has no turn in which to look at a ring without being woken, so ring-lazy saves a
wake-up only while the reader is inside its read callback.

Then what idling costs one server process: `simple` JSON over HTTP/1.1 (`tensorgate perf`, open loop at
each of `--rates` requests/s, then closed loop at 16 connections), the server's CPU per request. A process
that sleeps between requests pays for each waking; one that never sleeps does not.

    python -m bench.wakeup [--in-flight 1 8 64] [--rates 500 2000 8000] [--rounds 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mmap
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import uvloop

from bench.procs import ServerProcess, cpu_clock, serve_argv
from bench.transport import save
from tensorgate.codec import messages as msg
from tensorgate.codec.framing import pack, unpack
from tensorgate.server.link import Link

MECHANISMS = ("socket", "ring", "ring-lazy")
RING_BYTES = 4 << 20
_HEAD = struct.Struct("<QQQ")  # bytes written, bytes read, the reader sleeps (1) or not
_LENGTH = struct.Struct("<I")
_TENSOR = bytes(64)  # one [1, 16] INT32 tensor
MESSAGE = [
    msg.INFER,
    1,
    ["simple", "", "", None, [["INPUT0", "INT32", [1, 16], _TENSOR, None]] * 2, None, False, None, 0, 0],
]


class Ring:
    """One direction: a single writer and a single reader of a byte ring in a memfd both map."""

    DATA = 64  # the head's bytes, then the ring's

    def __init__(self, fd: int, wakeup: int, lazy: bool) -> None:
        self.map = mmap.mmap(fd, RING_BYTES)
        self.size = RING_BYTES - self.DATA
        self.wakeup = wakeup
        self.lazy = lazy
        self.fence = threading.Lock()  # acquire + release: a lock-prefixed instruction, a full fence on x86

    def _head(self) -> tuple[int, int, int]:
        return _HEAD.unpack_from(self.map, 0)

    def write(self, data: bytes) -> None:
        written, read, _ = self._head()
        assert written + len(data) - read <= self.size, "ring full"
        start = written % self.size
        first = min(len(data), self.size - start)
        self.map[self.DATA + start : self.DATA + start + first] = data[:first]
        self.map[self.DATA : self.DATA + len(data) - first] = data[first:]
        struct.pack_into("<Q", self.map, 0, written + len(data))
        if self.lazy:
            self.fence.acquire()
            self.fence.release()
            if not self._head()[2]:
                return
        os.eventfd_write(self.wakeup, 1)

    def read(self) -> bytes:
        """Every byte written so far, and not yet read."""
        chunks = []
        while True:
            written, read, _ = self._head()
            if written == read and self.lazy:  # say so before sleeping, then look once more
                struct.pack_into("<Q", self.map, 16, 1)
                self.fence.acquire()
                self.fence.release()
                written = self._head()[0]
            if written == read:
                return b"".join(chunks)
            struct.pack_into("<Q", self.map, 16, 0)
            start, length = read % self.size, written - read
            first = min(length, self.size - start)
            chunks.append(self.map[self.DATA + start : self.DATA + start + first])
            chunks.append(self.map[self.DATA : self.DATA + length - first])
            struct.pack_into("<Q", self.map, 8, written)


class RingLink:
    """Link's interface (send, messages to on_message) over two rings."""

    def __init__(self, out: Ring, into: Ring, on_message: Callable[[list], None]) -> None:
        self.out, self.into, self.on_message = out, into, on_message
        self.pending: list[bytes] = []
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(into.wakeup, self._readable)
        if into.lazy:  # asleep until woken
            struct.pack_into("<Q", into.map, 16, 1)

    def send(self, message: list) -> None:
        data = pack(message)
        if not self.pending:
            self.loop.call_soon(self._flush)
        self.pending += (_LENGTH.pack(len(data)), data)

    def _flush(self) -> None:
        self.out.write(b"".join(self.pending))
        self.pending.clear()

    def _readable(self) -> None:
        with contextlib.suppress(BlockingIOError):  # woken by an earlier write whose bytes were read
            os.eventfd_read(self.into.wakeup)
        data, pos = memoryview(self.into.read()), 0
        while pos < len(data):
            (length,) = _LENGTH.unpack_from(data, pos)
            self.on_message(unpack(data[pos + 4 : pos + 4 + length]))
            pos += 4 + length


async def _side(mechanism: str, ends: tuple, answers: bool, messages: int, in_flight: int) -> float:
    """The answering side answers forever; the asking side returns its seconds for `messages` round trips."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    received = 0

    def on_message(message: list) -> None:
        nonlocal received
        if answers:
            link.send([msg.RESULT, message[1], message[2]])
            return
        received += 1
        if received == messages:
            done.set_result(None)
        elif received + in_flight <= messages:
            link.send(MESSAGE)

    if mechanism == "socket":
        link = Link(on_message, lambda: None, lambda message, error: None)
        await loop.create_unix_connection(lambda: link, sock=ends[answers])
    else:
        rings = [Ring(fd, wakeup, mechanism == "ring-lazy") for fd, wakeup in ends]
        link = RingLink(rings[answers], rings[not answers], on_message)
    if answers:
        await asyncio.Event().wait()
    started = time.perf_counter()
    for _ in range(in_flight):
        link.send(MESSAGE)
    await done
    return time.perf_counter() - started


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(mechanism: str, messages: int, in_flight: int) -> dict:
    if mechanism == "socket":
        ends: tuple = socket.socketpair()
    else:
        ends = tuple((os.memfd_create("ring"), os.eventfd(0, os.EFD_NONBLOCK)) for _ in range(2))
        for fd, _ in ends:
            os.ftruncate(fd, RING_BYTES)
    child = os.fork()
    if child == 0:
        try:
            uvloop.run(_side(mechanism, ends, True, messages, in_flight))
        finally:
            os._exit(0)
    time.sleep(0.2)  # the answering side is up
    mine, theirs = _own_cpu(), cpu_clock(child, tree=False)
    seconds = uvloop.run(_side(mechanism, ends, False, messages, in_flight))
    mine, theirs = _own_cpu() - mine, cpu_clock(child, tree=False) - theirs
    os.kill(child, 9)
    os.waitpid(child, 0)
    for end in ends:
        if mechanism == "socket":
            end.close()
        else:
            os.close(end[0])
            os.close(end[1])
    return {"rate": messages / seconds, "cpu_us": (mine + theirs) / messages * 1e6}


def server_cost(server: ServerProcess, load: list[str], seconds: float) -> dict:
    """The server's CPU per request under `tensorgate perf`'s `load` (its plan flags) for `seconds`."""
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "level.json")
        cpu = cpu_clock(server.pid, tree=False)
        subprocess.run(
            [sys.executable, "-m", "tensorgate.perf", f"http://127.0.0.1:{server.port}", "-m", "simple",
             *load, "--duration", str(seconds), "--warmup", "0", "--no-progress", "--no-server-stats",
             "--json", out],
            check=True, capture_output=True, timeout=seconds + 60,
        )  # fmt: skip
        cpu = cpu_clock(server.pid, tree=False) - cpu
        with open(out) as f:
            level = json.load(f)[0]
    served = level["requests_per_s"] * seconds
    return {"rate": level["requests_per_s"], "cpu_us": cpu / max(1.0, served) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--messages", type=int, default=50_000, help="round trips per mechanism per round")
    parser.add_argument("--rates", type=int, nargs="+", default=[500, 2000, 8000], help="open-loop req/s")
    parser.add_argument("--seconds", type=float, default=4.0, help="each load level of the server part")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--machine", default="vm", help="what the report names the machine")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    trips: dict = {}
    for in_flight in args.in_flight:
        rounds: dict[str, list[dict]] = {m: [] for m in MECHANISMS}
        for round_ in range(args.rounds):
            for mechanism in MECHANISMS if round_ % 2 == 0 else reversed(MECHANISMS):
                rounds[mechanism].append(measure(mechanism, args.messages, in_flight))
                r = rounds[mechanism][-1]
                print(f"  in flight {in_flight} round {round_ + 1} {mechanism}: "
                      f"{r['rate']:.0f}/s, {r['cpu_us']:.1f} us", flush=True)  # fmt: skip
        trips[in_flight] = rounds
    loads = {f"{rate}/s": ["--request-rate", str(rate)] for rate in args.rates}
    loads["16 connections"] = ["--concurrency", "16"]
    served: dict[str, list[dict]] = {name: [] for name in loads}
    with ServerProcess(serve_argv()) as server:
        for round_ in range(args.rounds):
            for name in loads if round_ % 2 == 0 else reversed(loads):
                served[name].append(server_cost(server, loads[name], args.seconds))
                print(f"  server round {round_ + 1} {name}: {served[name][-1]['cpu_us']:.1f} us", flush=True)
    lines = [
        f"# Messages between two processes, by how they travel: {time.strftime('%Y-%m-%d')}",
        "",
        f"`python -m bench.wakeup --rounds {args.rounds} --messages {args.messages}` on {args.machine} "
        f"({os.cpu_count()} cores). Round trips of a `simple` INFER message and its answer, both "
        "processes on uvloop; CPU per round trip is both processes' (median of the rounds); the "
        "mechanisms alternate round by round.",
        "",
        "| in flight | mechanism | round trips/s | CPU per round trip | against socket |",
        "|---|---|---|---|---|",
    ]
    for in_flight, rounds in trips.items():
        base = statistics.median(r["cpu_us"] for r in rounds["socket"])
        for mechanism, runs in rounds.items():
            cpu = statistics.median(r["cpu_us"] for r in runs)
            rate = statistics.median(r["rate"] for r in runs)
            lines.append(f"| {in_flight} | {mechanism} | {rate:,.0f} | {cpu:.1f} µs | {cpu / base:.2f}x |")
    lines += [
        "",
        f"One server process, `simple` JSON over HTTP/1.1 from `tensorgate perf` ({args.seconds:g} s a "
        "level, the levels alternating round by round; CPU per request the median of the rounds):",
        "",
        "| load | req/s | server CPU per request |",
        "|---|---|---|",
    ]
    for name, runs in served.items():
        cpu = statistics.median(r["cpu_us"] for r in runs)
        rate = statistics.median(r["rate"] for r in runs)
        lines.append(f"| {name} | {rate:,.0f} | {cpu:.1f} µs |")
    save("\n".join(lines) + "\n", {"round_trips": trips, "server": served}, args, "wakeup")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
