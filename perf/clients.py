"""The connections `tensorgate perf` sends on, as raw asyncio protocols with callbacks (no task, no future
a request): HTTP/1.1 keep-alive (one request in flight, bench/h1client.py's head parsing), HTTP/2 with the
`h2` state machine (bench/h2client.py's settings), and gRPC on raw HTTP/2 frames (perf/h2frames.py): a
request's header block is encoded once, never indexed, so the same bytes go out each time; answers'
header blocks go through an HPACK decoder, as a strict client's must.

Each connection calls `sink.done(connection, index, began, answer)` when a request ends; `answer` is None
when the connection failed it (lost, reset), and `sink.lost(connection)` when the connection ends.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

import hpack
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

from tensorgate.perf.h1wire import build_request, dechunk, whole_answer
from tensorgate.perf.h2frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW,
    WINDOW_UPDATE,
    frame,
)
from tensorgate.perf.h2wire import CONFIG as H2_CONFIG
from tensorgate.perf.h2wire import WINDOW as H2_WINDOW
from tensorgate.perf.h2wire import build_headers, pump
from tensorgate.perf.protocols import Answer, Wire


class Connection(Protocol):
    """What the load (perf/load.py) uses of a connection, whichever its protocol."""

    multiplexed: bool  # carries any number of requests at once (HTTP/2 streams), else one
    transport: asyncio.Transport | None
    in_flight: int

    def send(self, index: int, began: float) -> None:
        """Sends request `index`; its latency counts from `began` (perf_counter)."""

    def close(self) -> None: ...


class Sink(Protocol):
    def done(self, connection: Connection | None, index: int, began: float, answer: Answer | None) -> None:
        """Request `index` ended: its answer, or None when the connection failed it."""

    def lost(self, connection: Connection) -> None:
        """The connection ended."""


# ------------------------------------------------------------------------------------------ HTTP/1.1


class H1(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request in flight."""

    multiplexed = False

    def __init__(self, requests: list[bytes], sink: Sink, binary: bool) -> None:
        self.requests = requests  # whole requests, head and body, by index
        self.sink = sink
        self.binary = binary  # find Inference-Header-Content-Length in answers
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.index = -1  # the request in flight, -1: none
        self.began = 0.0
        self.in_flight = 0

    @staticmethod
    def wire(wire: Wire, host: str) -> bytes:
        return build_request("POST", wire.path, host, wire.body, wire.headers)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, index: int, began: float) -> None:
        self.index, self.began, self.in_flight = index, began, 1
        self.transport.write(self.requests[index])  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        try:
            answer = whole_answer(buf)
        except ValueError:
            self._fail()
            return
        if answer is None:
            self.buf = buf
            return
        head, status, start, end, chunked = answer
        body = dechunk(buf[start:end]) if chunked else buf[start:end]
        self.buf = buf[end:]
        index, self.index, self.in_flight = self.index, -1, 0
        binary_header = header_length(head) if self.binary else -1
        self.sink.done(self, index, self.began, Answer(status, body, binary_header))

    def _fail(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.index >= 0:
            index, self.index, self.in_flight = self.index, -1, 0
            self.sink.done(self, index, self.began, None)
        self.sink.lost(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def header_length(head: bytes) -> int:
    """A binary answer's Inference-Header-Content-Length (-1: none, all of it is JSON)."""
    lower = head.lower()
    start = lower.find(b"\r\ninference-header-content-length:")
    if start < 0:
        return -1
    end = lower.find(b"\r\n", start + 2)
    return int(lower[start + 34 : end if end > 0 else None])


# ------------------------------------------------------------------------------------------ HTTP/2


class H2(asyncio.Protocol):
    """One HTTP/2 cleartext connection (prior knowledge), any number of streams in flight."""

    multiplexed = True

    def __init__(self, requests: list[tuple[list, bytes]], sink: Sink) -> None:
        self.requests = requests  # (header block fields, body) by index
        self.sink = sink
        self.conn = H2Connection(config=H2_CONFIG)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, list] = {}  # id -> [index, began, status, body parts]
        self.unsent: dict[int, memoryview] = {}  # request bodies waiting for the server's windows
        self.received = 0
        self.in_flight = 0

    @staticmethod
    def wire(wire: Wire, host: str) -> tuple[list, bytes]:
        return build_headers("POST", wire.path, host, wire.body, wire.headers), wire.body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.conn.initiate_connection()
        self.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: H2_WINDOW, SettingCodes.ENABLE_PUSH: 0})
        self.conn.increment_flow_control_window(H2_WINDOW)
        self.transport.write(self.conn.data_to_send())

    def send(self, index: int, began: float) -> None:
        headers, body = self.requests[index]
        sid = self.conn.get_next_available_stream_id()
        self.streams[sid] = [index, began, 0, []]
        self.in_flight += 1
        self.conn.send_headers(sid, headers, end_stream=not body)
        if body:
            self.unsent[sid] = memoryview(body)
            pump(self.conn, self.unsent, sid)
        self.transport.write(self.conn.data_to_send())  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except Exception:  # noqa: BLE001 (a protocol error: the connection is done for)
            self.transport.close()  # type: ignore[union-attr]
            return
        for event in events:
            kind = type(event)
            if kind is DataReceived:
                self.received += event.flow_controlled_length
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream[3].append(event.data)
            elif kind is ResponseReceived:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    for name, value in event.headers:
                        if name == b":status":
                            stream[2] = int(value)
            elif kind is StreamEnded:
                self._end(event.stream_id, True)
            elif kind is StreamReset:
                self._end(event.stream_id, False)
            elif kind is WindowUpdated:
                for sid in list(self.unsent):
                    pump(self.conn, self.unsent, sid)
            elif kind is ConnectionTerminated:
                self.transport.close()  # type: ignore[union-attr]
        if self.received > H2_WINDOW // 2:
            self.conn.increment_flow_control_window(self.received)
            self.received = 0
        out = self.conn.data_to_send()
        if out:
            self.transport.write(out)  # type: ignore[union-attr]

    def _end(self, sid: int, ok: bool) -> None:
        stream = self.streams.pop(sid, None)
        self.unsent.pop(sid, None)
        if stream is None:
            return
        self.in_flight -= 1
        index, began, status, parts = stream
        self.sink.done(self, index, began, Answer(status, b"".join(parts)) if ok else None)

    def connection_lost(self, exc: Exception | None) -> None:
        streams, self.streams = self.streams, {}
        self.in_flight = 0
        for index, began, _, _ in streams.values():
            self.sink.done(self, index, began, None)
        self.sink.lost(self)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.conn.close_connection()
            self.transport.write(self.conn.data_to_send())
            self.transport.close()


# ------------------------------------------------------------------------------------------ gRPC


def grpc_message(body: bytes) -> bytes:
    """A gRPC length-prefixed message (not compressed)."""
    return b"\x00" + len(body).to_bytes(4, "big") + body


class Grpc(asyncio.Protocol):
    """One HTTP/2 connection carrying gRPC calls on raw frames. Unary (`streaming` False): a stream per
    call, any number in flight. Streaming: `send` sends the next message on a ModelStreamInfer stream
    that has none in flight (opening one when none is idle); its answer is the next message on it."""

    multiplexed = True

    def __init__(self, requests: list[bytes], sink: Sink, authority: str, path: str, streaming: bool) -> None:
        self.requests = requests  # framed messages by index
        self.sink = sink
        self.streaming = streaming
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        self.block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in fields])
        self.decoder = hpack.Decoder()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.next_id = 1
        self.streams: dict[int, list] = {}  # id -> [index, began, :status, received bytes, (headers block)]
        self.idle: list[int] = []  # streaming: open streams with nothing in flight
        self.send_window = 65535  # the connection's, as the server grants it
        self.stream_window = 65535  # each new stream's (the server's INITIAL_WINDOW_SIZE)
        self.windows: dict[int, int] = {}
        self.max_frame = 16384
        self.waiting: list[tuple[int, memoryview, bool]] = []  # DATA that waits for window
        self.unacked = 0
        self.continuing: tuple[int, int, bytes] | None = None  # (stream, flags, block so far)
        self.in_flight = 0

    @staticmethod
    def wire(wire: Wire) -> bytes:
        return grpc_message(wire.body)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        settings = (4).to_bytes(2, "big") + WINDOW.to_bytes(4, "big")  # INITIAL_WINDOW_SIZE
        settings += (2).to_bytes(2, "big") + (0).to_bytes(4, "big")  # ENABLE_PUSH 0
        self.transport.write(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, (WINDOW - 65535).to_bytes(4, "big"))
        )

    def send(self, index: int, began: float) -> None:
        self.in_flight += 1
        message = self.requests[index]
        if self.streaming and self.idle:
            sid = self.idle.pop()
            self.streams[sid][:2] = [index, began]
            self._data(sid, memoryview(message), False)
            return
        sid, self.next_id = self.next_id, self.next_id + 2
        self.streams[sid] = [index, began, 0, b"", b""]
        self.windows[sid] = self.stream_window
        # one write with the message: the server reads the call whole, in one wake-up
        self._data(sid, memoryview(message), not self.streaming, frame(HEADERS, END_HEADERS, sid, self.block))

    def _data(self, sid: int, view: memoryview, end: bool, head: bytes = b"") -> None:
        out = [head] if head else []
        while view:
            n = min(len(view), self.max_frame, self.send_window, self.windows.get(sid, 0))
            if n <= 0:
                self.waiting.append((sid, view, end))
                break
            self.send_window -= n
            self.windows[sid] -= n
            out.append(frame(DATA, END_STREAM if end and n == len(view) else 0, sid, bytes(view[:n])))
            view = view[n:]
        if out:
            self.transport.write(b"".join(out))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos, size = 0, len(buffer)
        out = []
        while size - pos >= 9:
            length = int.from_bytes(buffer[pos : pos + 3], "big")
            end = pos + 9 + length
            if end > size:
                break
            kind, flags = buffer[pos + 3], buffer[pos + 4]
            sid = int.from_bytes(buffer[pos + 5 : pos + 9], "big") & WINDOW
            payload = buffer[pos + 9 : end]
            pos = end
            if kind == DATA:
                self.unacked += length
                if flags & PADDED:
                    payload = payload[1 : len(payload) - payload[0]]
                stream = self.streams.get(sid)
                if stream is not None:
                    stream[3] += payload
                    if self.streaming:
                        self._messages(sid, stream)
                if flags & END_STREAM:
                    self._end(sid)
            elif kind in (HEADERS, CONTINUATION):
                self._headers(kind, flags, sid, payload)
            elif kind == SETTINGS and not flags & ACK:
                self._settings(payload)
                out.append(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                increment = int.from_bytes(payload[:4], "big") & WINDOW
                if sid == 0:
                    self.send_window += increment
                elif sid in self.windows:
                    self.windows[sid] += increment
                self._resume()
            elif kind == RST_STREAM:
                self._end(sid, reset=True)
            elif kind == GOAWAY:
                self.transport.close()  # type: ignore[union-attr]
        self.buffer = buffer[pos:]
        if self.unacked > 1 << 24:
            out.append(frame(WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
            if self.streaming:  # long-lived streams get their windows back too
                out += [frame(WINDOW_UPDATE, 0, s, self.unacked.to_bytes(4, "big")) for s in self.streams]
            self.unacked = 0
        if out:
            self.transport.write(b"".join(out))  # type: ignore[union-attr]

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = (
                int.from_bytes(payload[i : i + 2], "big"),
                int.from_bytes(payload[i + 2 : i + 6], "big"),
            )
            if key == 4:
                delta, self.stream_window = value - self.stream_window, value
                for sid in self.windows:
                    self.windows[sid] += delta
            elif key == 5:
                self.max_frame = value
        self._resume()

    def _resume(self) -> None:
        waiting, self.waiting = self.waiting, []
        for sid, view, end in waiting:
            if sid in self.streams:
                self._data(sid, view, end)

    def _headers(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            self.continuing = (sid, flags, payload)
        elif self.continuing is not None:
            first_sid, first_flags, block = self.continuing
            self.continuing = (first_sid, first_flags | (flags & END_HEADERS), block + payload)
        if self.continuing is None or not self.continuing[1] & END_HEADERS:
            return
        sid, flags, block = self.continuing
        self.continuing = None
        try:
            fields = self.decoder.decode(block, raw=True)
        except Exception:  # noqa: BLE001 (a broken block: HPACK's state is lost with it)
            self.transport.close()  # type: ignore[union-attr]
            return
        stream = self.streams.get(sid)
        if stream is None:
            return
        for name, value in fields:
            if name == b":status":
                stream[2] = int(value)
        if flags & END_STREAM:
            stream[4] = fields
            self._end(sid)

    def _messages(self, sid: int, stream: list) -> None:
        """Streaming: each whole message on the stream is the answer to the request in flight on it."""
        data = stream[3]
        while len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[1:5], "big"):
            size = int.from_bytes(data[1:5], "big")
            body, data = data[5 : 5 + size], data[5 + size :]
            index, began = stream[0], stream[1]
            if index < 0:
                continue  # an answer nobody asked for
            stream[0] = -1
            self.in_flight -= 1
            self.idle.append(sid)
            self.sink.done(self, index, began, Answer(stream[2] or 200, body))
        stream[3] = data

    def _end(self, sid: int, reset: bool = False) -> None:
        stream = self.streams.pop(sid, None)
        self.windows.pop(sid, None)
        if sid in self.idle:
            self.idle.remove(sid)
        if stream is None:
            return
        index, began, status, data, trailers = stream
        if index < 0:
            return
        self.in_flight -= 1
        if reset:
            self.sink.done(self, index, began, None)
            return
        grpc_status, message = 2, "no grpc-status in the trailers"
        for name, value in trailers or ():
            if name == b"grpc-status":
                grpc_status = int(value)
            elif name == b"grpc-message":
                message = value.decode("utf-8", "replace")
        if grpc_status == 0:
            message = ""
        body = data[5:] if len(data) >= 5 else b""
        self.sink.done(
            self, index, began, Answer(status or 200, body, grpc_status=grpc_status, grpc_message=message)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        streams, self.streams = self.streams, {}
        self.in_flight = 0
        for index, began, *_ in streams.values():
            if index >= 0:
                self.sink.done(self, index, began, None)
        self.sink.lost(self)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(GOAWAY, 0, 0, (0).to_bytes(8, "big")))
            self.transport.close()
