"""A lean gRPC stream driver: ModelStreamInfer ping-pong on raw HTTP/2 frames, for the gRPC bench.

h2load sends a stream's body whole; it cannot send a stream's next message after the answer to the last,
which is how a client that waits for each answer streams (and how bench/grpc_load.py's grpclib client
streams, at as much CPU a message as the server it measures). This client keeps `streams` ModelStreamInfer
streams on each of `connections` connections, each sending one request, then the next when its answer
has come, for `seconds`; frames are pre-built bytes and answers are only cut at their length prefixes,
so it costs a fraction of a server's time a message (`python -m bench.grpc_bench` reports both).

    python -m bench.grpc_pingpong PORT [--seconds 4] [--connections 4] [--streams 4]

prints `messages errors seconds client_cpu_seconds` as JSON.
"""

import argparse
import asyncio
import json
import time
from typing import Protocol

import hpack

from bench.bare_app import new_event_loop
from bench.grpc_load import STREAM_PATH, infer_request
from tensorgate.perf.h2frames import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW,
    WINDOW_UPDATE,
    frame,
)

ERROR_FIELD = 0x0A  # a ModelStreamInferResponse that starts with error_message (field 1)


class FrameClient(Protocol):
    """A client protocol on raw HTTP/2 frames (this bench's, bench/sequence.py's)."""

    buffer: bytes
    unacked: int
    transport: asyncio.Transport | None

    def _answers(self, stream: int, payload: bytes) -> list[bytes]:
        """The frames to send for a DATA frame's payload on `stream`."""

    def ended(self, stream: int) -> None:
        """`stream` ended (trailers, a reset, GOAWAY) before its run did."""


def answer_frames(client: FrameClient, data: bytes) -> None:
    """The whole frames in `client.buffer` + `data` handled: DATA to `_answers`, SETTINGS and PING
    acknowledged, the connection window given back each MiB; what they call for written at once."""
    buffer = client.buffer + data if client.buffer else data
    out, pos = [], 0
    while len(buffer) - pos >= 9:
        length = int.from_bytes(buffer[pos : pos + 3], "big")
        end = pos + 9 + length
        if end > len(buffer):
            break
        kind, flags = buffer[pos + 3], buffer[pos + 4]
        stream = int.from_bytes(buffer[pos + 5 : pos + 9], "big")
        if kind == DATA:
            client.unacked += length
            out += client._answers(stream, buffer[pos + 9 : end])
        elif kind == HEADERS and flags & END_STREAM or kind in (RST_STREAM, GOAWAY):
            client.ended(stream)
        elif kind == SETTINGS and not flags & ACK:
            out.append(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            out.append(frame(PING, ACK, 0, buffer[pos + 9 : end]))
        pos = end
    client.buffer = buffer[pos:]
    if client.unacked > 1 << 20:  # the server's windows for its answers (ours is never exhausted)
        out.append(frame(WINDOW_UPDATE, 0, 0, client.unacked.to_bytes(4, "big")))
        client.unacked = 0
    if out and client.transport is not None:
        client.transport.write(b"".join(out))


class PingPong(asyncio.Protocol):
    def __init__(self, port: int, streams: int, counts: dict) -> None:
        self.port = port
        self.counts = counts
        request = bytes(infer_request())
        self.message = b"\x00" + len(request).to_bytes(4, "big") + request
        self.stream_ids = [1 + 2 * i for i in range(streams)]
        self.data_frames = {s: frame(DATA, 0, s, self.message) for s in self.stream_ids}
        self.pending = {s: b"" for s in self.stream_ids}  # answer bytes not yet a whole message
        self.buffer = b""
        self.unacked = 0  # bytes received since our last WINDOW_UPDATEs
        self.transport: asyncio.Transport | None = None
        self.stopping = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        encoder = hpack.Encoder()
        out = [
            PREFACE,
            frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + WINDOW.to_bytes(4, "big")),  # initial window
            frame(WINDOW_UPDATE, 0, 0, (WINDOW - 65535).to_bytes(4, "big")),  # the connection's window
        ]
        for stream in self.stream_ids:
            fields = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", STREAM_PATH),
                (":authority", f"127.0.0.1:{self.port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
            out += [frame(HEADERS, END_HEADERS, stream, encoder.encode(fields)), self.data_frames[stream]]
        transport.write(b"".join(out))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        answer_frames(self, data)

    def ended(self, stream: int) -> None:
        self.counts["errors"] += 1  # a stream that ends (trailers, reset) ends the run for it

    def _answers(self, stream: int, payload: bytes) -> list[bytes]:
        data = self.pending[stream] + payload
        sends = []
        while len(data) >= 5:
            size = int.from_bytes(data[1:5], "big")
            if len(data) < 5 + size:
                break
            if data[5] == ERROR_FIELD:
                self.counts["errors"] += 1
            else:
                self.counts["messages"] += 1
            data = data[5 + size :]
            if not self.stopping:
                sends.append(self.data_frames[stream])
        self.pending[stream] = data
        return sends


async def drive(port: int, seconds: float, connections: int, streams: int, warmup: float) -> dict:
    loop = asyncio.get_running_loop()
    counts = {"messages": 0, "errors": 0}
    protocols = []
    for _ in range(connections):
        _, protocol = await loop.create_connection(lambda: PingPong(port, streams, counts), "127.0.0.1", port)
        protocols.append(protocol)
    await asyncio.sleep(warmup)
    counts.update(messages=0, errors=0)
    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    result = dict(counts, seconds=time.perf_counter() - started, client_cpu_seconds=time.process_time() - cpu)
    for protocol in protocols:
        protocol.stopping = True
        protocol.transport.close()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_pingpong", description=__doc__.splitlines()[0]
    )
    parser.add_argument("port", type=int)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds run before counting")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        result = runner.run(drive(args.port, args.seconds, args.connections, args.streams, args.warmup))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
