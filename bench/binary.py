"""The big-payload round trip: FP32 tensors through `identity_fp32` with Triton's binary data extension.

One keep-alive HTTP/1.1 connection, one request at a time. The payload is sent straight from the numpy
array's memory (a memoryview, no copy) while the response is read into a bytearray allocated once, so
the client adds no copies of its own to what is measured.
"""

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from bench.stats import Recorder
from tensorgate.perf.h1wire import chunked_end, parse_head

_IHCL = b"\r\ninference-header-content-length:"


def make_payload(nbytes: int) -> np.ndarray:
    """Little-endian FP32 values 0, 1, 2, ... (exact up to 2**24), `nbytes` bytes in all."""
    return np.arange(nbytes // 4, dtype="<f4")


def build_head(host: str, path: str, nbytes: int) -> bytes:
    """Request head plus the JSON inference header; the raw tensor bytes follow it on the wire."""
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [nbytes // 4],
                    "parameters": {"binary_data_size": nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(header) + nbytes}\r\n\r\n"
    )
    return head.encode("latin-1") + header


@dataclass
class Response:
    status: int
    header: dict  # the JSON inference header
    output: memoryview  # the raw output bytes (a view into the client's buffer)
    chunked: bool


class BinaryClient:
    def __init__(self, host: str, port: int, path: str, payload: np.ndarray) -> None:
        self.data = memoryview(payload).cast("B")
        self.head = build_head(f"{host}:{port}", path, self.data.nbytes)
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.head_buf = bytearray(64 * 1024)
        self.body = bytearray(self.data.nbytes + 64 * 1024)

    def close(self) -> None:
        self.sock.close()

    async def round_trip(self) -> Response:
        loop = asyncio.get_running_loop()

        async def send() -> None:
            await loop.sock_sendall(self.sock, self.head)
            await loop.sock_sendall(self.sock, self.data)

        sending = asyncio.create_task(send())  # read while writing, in case the server answers early
        try:
            response = await self._receive(loop)
        finally:
            if not sending.done():
                sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        return response

    async def _recv_into(self, loop: asyncio.AbstractEventLoop, view: memoryview) -> int:
        n = await loop.sock_recv_into(self.sock, view)
        if n == 0:
            raise ConnectionError("server closed the connection mid-response")
        return n

    async def _receive(self, loop: asyncio.AbstractEventLoop) -> Response:
        buf, got = self.head_buf, 0
        while (end := buf.find(b"\r\n\r\n", 0, got)) < 0:
            if got == len(buf):
                raise ValueError("response head over 64 KiB")
            got += await self._recv_into(loop, memoryview(buf)[got:])
        head = bytes(buf[:end])
        status, length = parse_head(head)
        lower = head.lower()
        i = lower.find(_IHCL)
        if i >= 0:
            j = lower.find(b"\r\n", i + len(_IHCL))
            header_len = int(lower[i + len(_IHCL) : j if j >= 0 else None])
        else:
            header_len = -1
        extra = buf[end + 4 : got]
        if length is None:
            body = await self._receive_chunked(loop, bytes(extra))
        else:
            if length > len(self.body):
                self.body = bytearray(length)
            view = memoryview(self.body)
            view[: len(extra)] = extra
            filled = len(extra)
            while filled < length:
                filled += await self._recv_into(loop, view[filled:length])
            body = view[:length]
        if header_len < 0:  # a plain JSON answer (an error, most likely)
            header_len = len(body)
        header = orjson.loads(bytes(body[:header_len])) if header_len else {}
        return Response(status, header, body[header_len:], length is None)

    async def _receive_chunked(self, loop: asyncio.AbstractEventLoop, data: bytes) -> memoryview:
        """The slow path for a response without Content-Length: gather, then strip the chunk framing."""
        raw = bytearray(data)
        chunk = bytearray(1 << 20)
        while chunked_end(raw, 0) < 0:
            n = await self._recv_into(loop, memoryview(chunk))
            raw += chunk[:n]
        out = memoryview(self.body)
        pos = filled = 0
        while True:
            eol = raw.find(b"\r\n", pos)
            size = int(bytes(raw[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                return out[:filled]
            out[filled : filled + size] = raw[eol + 2 : eol + 2 + size]
            filled += size
            pos = eol + 2 + size + 2


def check(response: Response, payload: np.ndarray, full: bool) -> str:
    """'' when the response carries the payload back unchanged, else what is wrong."""
    if not 200 <= response.status < 300:
        return f"HTTP {response.status}: {bytes(response.output[:200])!r} {response.header}"
    if response.output.nbytes != payload.nbytes:
        return f"output is {response.output.nbytes} bytes, sent {payload.nbytes}"
    got = np.frombuffer(response.output, dtype="<f4")
    if full:
        same = np.array_equal(got, payload)
    else:
        picks = [0, payload.size // 2, payload.size - 1]
        same = bool((got[picks] == payload[picks]).all())
    return "" if same else "output values differ from the input"


@dataclass
class BinaryResult:
    round_trips: int
    seconds: float
    gb_per_s: float
    problem: str
    chunked: bool
    cpu: dict[str, float]  # cores each clock kept busy during the timed round trips


async def run_binary(
    host: str,
    port: int,
    path: str,
    nbytes: int,
    rounds: int,
    rec: Recorder,
    max_seconds: float = 120.0,
    clocks: dict[str, Callable[[], float]] | None = None,
) -> BinaryResult:
    """One verified warm-up round trip, then up to `rounds` timed ones (sequential).

    `clocks` are CPU-seconds counters, as for `stats.drive`: read over the timed round trips only.
    """
    clocks = clocks or {}
    payload = make_payload(nbytes)
    client = BinaryClient(host, port, path, payload)
    try:
        first = await client.round_trip()
        problem = check(first, payload, full=True)
        chunked = first.chunked
        rec.reset()
        start = {key: clock() for key, clock in clocks.items()}
        done = 0
        t0 = time.perf_counter()
        while not problem and done < rounds and time.perf_counter() - t0 < max_seconds:
            t = time.perf_counter()
            response = await client.round_trip()
            problem = check(response, payload, full=False)
            rec.record(time.perf_counter() - t, not problem)
            done += 1
        seconds = time.perf_counter() - t0
        cpu = {key: (clock() - start[key]) / seconds for key, clock in clocks.items()} if done else {}
    finally:
        client.close()
    rec.stop()
    moved = 2 * nbytes * done  # tensor bytes sent plus received; HTTP and JSON headers not counted
    gb_per_s = moved / seconds / 1e9 if seconds else 0.0
    return BinaryResult(done, seconds, gb_per_s, problem, chunked, cpu)
