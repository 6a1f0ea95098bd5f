"""HTTP/2's frame vocabulary, sans-IO (RFC 9113): frame types, flags, error codes and settings, frame
bytes, the checks that need no connection state (padding, SETTINGS entries, a request's header list),
the record a connection keeps per stream, and what a stream's handler is. The connection is h2.py and
h2_receive.py."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from typing import Protocol

from tensorgate.server.http.connection import fold_header, split_target

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 5, 6, 7, 9
ENHANCE_YOUR_CALM = 0xB

S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6

MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
# Our choices, advertised or applied to every connection.
OUR_MAX_FRAME = 1 << 20  # what we accept (advertised); large frames move tensors in fewer pieces
OUR_STREAM_WINDOW = 16 << 20  # advertised per stream; topped up as the body arrives
OUR_CONNECTION_WINDOW = 64 << 20
READ_BUFFER = 64 << 10  # to start with; grows to hold the largest frame that comes (idle ones stay small)
BULK_READ = 1 << 20  # and up to this while reads keep filling it
DIRECT_READ = 64 << 10  # DATA frames from this size go straight into their body's buffer
SMALL_DATA = 16 << 10  # DATA up to this is copied into the queued frames; larger goes out as views
SEND_BATCH = 1 << 20  # the most bytes of DATA frames (views) one writev takes
GOAWAY_DELAY = 0.1  # at shutdown, from the last answer to GOAWAY and close
LINGER_SECONDS = 2.0  # after a connection error, how long what the client still sends is read and dropped
# gRPC keepalive and connection age (grpc-core's chttp2 server): our PINGs' payloads, tell their ACKs apart
KEEPALIVE_PING = b"keepaliv"
GOAWAY_PING = b"goaway!!"
GOAWAY_PING_WAIT = 20.0  # the graceful GOAWAY's PING unanswered this long: the final GOAWAY anyway
AGE_JITTER = 0.1  # a connection's maximum age is drawn within +-10% of the flag's, as grpc-core does
MAX_STREAM_ID = (1 << 31) - 1
CLOSED_KEPT = 256  # ids of recently closed streams remembered (a frame on one is STREAM_CLOSED)
CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))


# A frame's 9-byte head (RFC 9113 4.1): the 24-bit length as its high 16 bits and low 8, type, flags,
# stream id. One pack, where to_bytes and bytes((kind, flags)) took four calls and three joins (~0.27
# against 0.09 us).
_HEAD = struct.Struct(">HBBBL")


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    length = len(payload)
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + bytes(payload)


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    """A GOAWAY frame: the last stream the sender may still answer, the error code, debug data."""
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def frame_head(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


class ConnectionError_(Exception):  # noqa: N801 - not the builtin
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamError(Exception):
    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code


def settings_payload(*entries: tuple[int, int]) -> bytes:
    return b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in entries)


def settings_entries(payload: memoryview) -> list[tuple[int, int]]:
    """A SETTINGS frame's (identifier, value) pairs, each value checked where RFC 9113 6.5.2 bounds it."""
    if len(payload) % 6:
        raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
    entries = []
    for offset in range(0, len(payload), 6):
        key = int.from_bytes(payload[offset : offset + 2], "big")
        value = int.from_bytes(payload[offset + 2 : offset + 6], "big")
        if key == S_ENABLE_PUSH and value > 1:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
        if key == S_INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
        if key == S_MAX_FRAME_SIZE and not DEFAULT_FRAME <= value <= (1 << 24) - 1:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
        entries.append((key, value))
    return entries


def unpad(flags: int, payload: memoryview) -> memoryview:
    """A DATA or HEADERS payload without its padding."""
    if not flags & PADDED:
        return payload
    if not payload:
        raise ConnectionError_(PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


def request_head(
    fields: Iterable[tuple[bytes, bytes]], headers: dict[bytes, bytes]
) -> tuple[str, str, bytes, int | None]:
    """RFC 9113 8.2-8.3: pseudo-headers first, each once; lowercase names; no connection-specific
    fields; what a request needs. Fills `headers` with the regular fields and returns the method, the
    percent-decoded path, the query and the declared content-length. A malformed list is a stream error
    (PROTOCOL_ERROR)."""
    pseudo: dict[bytes, bytes] = {}
    for name, value in fields:
        if name[:1] == b":":
            if headers or name not in PSEUDO or name in pseudo:
                raise StreamError(PROTOCOL_ERROR, "bad pseudo-header")
            pseudo[name] = value
            continue
        if name in CONNECTION_SPECIFIC or name != name.lower() or (name == b"te" and value != b"trailers"):
            raise StreamError(PROTOCOL_ERROR, "malformed header field")
        if name in headers:
            fold_header(headers, name, value)
        else:
            headers[name] = value
    raw_method = pseudo.get(b":method")
    if raw_method is None:
        raise StreamError(PROTOCOL_ERROR, "no :method")
    method = raw_method.decode("latin-1")
    if method == "CONNECT":
        raise StreamError(PROTOCOL_ERROR, "CONNECT is not served")
    target = pseudo.get(b":path")
    if not target or b":scheme" not in pseudo:
        raise StreamError(PROTOCOL_ERROR, "no :scheme or :path")
    declared = headers.get(b"content-length")
    if declared is not None and not declared.isdigit():
        raise StreamError(PROTOCOL_ERROR, "content-length is not a number")
    path, query = split_target(target)
    return method, path, query, int(declared) if declared is not None else None


class StreamReset(Exception):
    """The stream went away (client reset, connection lost) while we were answering."""


class StreamHandler(Protocol):
    """What a stream carries once its head is in: a plain request, answered when its body is whole
    (h2_request.py), or a gRPC call (grpc_call.py). The connection applies flow control and stream
    states, then hands the handler what the client sends; the handler answers through the connection's
    stream API (h2.py: send_headers, send_now / send_data, credit, close, reset)."""

    def data_in(self, data: memoryview) -> None:
        """A DATA frame's payload (padding removed; the windows already charged for it)."""

    def end_in(self) -> None:
        """The client ended its side of the stream (END_STREAM, on DATA, HEADERS or trailers)."""

    def reset(self) -> None:
        """The stream is gone (the client reset it, the connection closed): stop, answer nothing."""

    def sweep(self, now: float) -> None:
        """Once a second: the handler's own timeouts."""


class Stream:
    """What the connection keeps per stream: its state, its windows, its request head and its handler."""

    __slots__ = (
        "id",
        "remote_open",  # the client may still send (no END_STREAM yet)
        "method",
        "path",
        "query",
        "headers",
        "expected",  # the declared content-length
        "recv_window",
        "send_window",
        "window_open",
        "since",
        "reset",
        "handler",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.remote_open = True
        self.method = "GET"
        self.path = ""
        self.query = b""
        self.headers: dict[bytes, bytes] = {}
        self.expected: int | None = None
        self.recv_window = OUR_STREAM_WINDOW  # what the peer may still send on it (h2_window.py)
        self.send_window = send_window
        self.window_open: asyncio.Future | None = None  # a writer waiting for window
        self.since = 0.0  # when it last made progress (a body that stops coming times out)
        self.reset = False
        self.handler: StreamHandler | None = None
