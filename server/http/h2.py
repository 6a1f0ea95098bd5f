"""HTTP/2 (RFC 9113) as our own frame layer: frames read and written here, HPACK by hpack_decode.py and
hpack_encode.py. No `h2` state machine: its ~75 us a request was most of the cost.

One connection: a BufferedProtocol whose read buffer holds whole frames; frames are handled in order
as they complete, and the control frames they call for (SETTINGS ACK, PING ACK, WINDOW_UPDATE,
RST_STREAM) are written once per read. Each request runs as a task when its stream ends; its answer
goes out as HEADERS and DATA frames within the peer's flow-control windows and frame size.

A large DATA frame for a body of known length is read by the socket straight into the body's buffer
(as HTTP/1.1 does), so a tensor is not copied between the socket and the model.

Defences: concurrent streams (REFUSED_STREAM beyond), client resets per second (rapid reset, GOAWAY
ENHANCE_YOUR_CALM), control frames per second (SETTINGS / PING / PRIORITY / WINDOW_UPDATE / empty DATA
floods), the header block's size across CONTINUATIONs and the decoded header list (HPACK bombs), windows
past 2^31-1 (FLOW_CONTROL_ERROR).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np

from server.http import hpack_encode
from server.http.hpack_decode import Decoder, HeaderListTooLarge, HpackError
from server.router import BodyTooLarge, HttpRequest, HttpResponse, Route, stalled_body

if TYPE_CHECKING:
    from server.http.listener import ConnectionHost

log = logging.getLogger("tensorgate.http")

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
OUR_MAX_FRAME = 1 << 20  # what we accept (advertised); large frames move tensors in fewer pieces
OUR_STREAM_WINDOW = 16 << 20  # advertised per stream; topped up as the body arrives
OUR_CONNECTION_WINDOW = 64 << 20
READ_BUFFER = 64 << 10  # to start with; grows to hold the largest frame that comes (idle ones stay small)
DIRECT_READ = 64 << 10
SMALL_DATA = 16 << 10  # DATA up to this is copied into the queued frames; larger goes out as views
SEND_BATCH = 1 << 20  # DATA frames from this size go straight into their body's buffer
LARGE_BUFFER = 1 << 20  # bodies from this size are numpy memory (no zeroing, huge pages)
LINGER_SECONDS = 2.0  # after a connection error, how long what the client still sends is read and dropped
CLOSED_KEPT = 256  # ids of recently closed streams remembered (a frame on one is STREAM_CLOSED)
CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + bytes(payload)
    )


def frame_head(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return length.to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big")


class ConnectionError_(Exception):  # noqa: N801 - not the builtin
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamError(Exception):
    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code


class StreamReset(Exception):
    """The stream went away (client reset, connection lost) while we were answering."""


class Stream:
    __slots__ = (
        "id",
        "remote_open",  # the client may still send (no END_STREAM yet)
        "method",
        "path",
        "query",
        "headers",
        "route",
        "params",
        "expected",
        "body",
        "filled",
        "recv_window",
        "send_window",
        "window_open",
        "task",
        "answered",
        "sending",
        "since",
        "reset",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.remote_open = True
        self.method = "GET"
        self.path = ""
        self.query = b""
        self.headers: dict[bytes, bytes] = {}
        self.route: Route | None = None
        self.params: dict[str, str] = {}
        self.expected: int | None = None
        self.body: Any = b""
        self.filled = 0
        self.recv_window = OUR_STREAM_WINDOW
        self.send_window = send_window
        self.window_open: asyncio.Future | None = None  # a writer waiting for window
        self.task: asyncio.Task | None = None
        self.answered = 0.0  # when an early answer went out: what the client still sends is dropped
        self.sending = False  # its answer's body is going out
        self.since = 0.0  # when its body last made progress
        self.reset = False


class H2Connection(asyncio.BufferedProtocol):
    def __init__(self, host: ConnectionHost) -> None:
        self.host = host
        self.settings = host.settings
        self.router = host.router
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray(READ_BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.direct: memoryview | None = None  # where the socket reads the rest of a large DATA frame
        self.direct_frame: tuple[Stream, int, int] | None = None  # (stream, bytes left, flags)
        self.preface = True
        self.out: list[bytes] = []  # frames to write at the end of this pass of the event loop
        self.flush_pending = False
        self.decoder = Decoder(self.settings.max_head_bytes)
        self.streams: dict[int, Stream] = {}
        self.closed_ids: collections.deque[int] = collections.deque(maxlen=CLOSED_KEPT)
        self.reset_ids: collections.deque[int] = collections.deque(maxlen=CLOSED_KEPT)  # reset by us
        self.last_stream_id = 0
        self.continuing: tuple[int, int, bytearray] | None = None  # (stream, flags of HEADERS, block)
        self.peer_window = DEFAULT_WINDOW  # initial send window of a new stream
        self.peer_max_frame = DEFAULT_FRAME
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.window_waiters: set[Stream] = set()
        self.sending = 0  # streams whose answers are going out
        self.recv_window = OUR_CONNECTION_WINDOW
        self.writable = asyncio.Event()
        self.writable.set()
        self.goaway_sent = False
        self.shutting_down = False
        self.closing = False
        self.since = self.loop.time()
        self.budget_second = 0.0
        self.resets = 0
        self.control_frames = 0

    # ------------------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.host.opened(self)  # handed over by H1Connection, which counted this connection already
        settings = [
            (S_MAX_CONCURRENT_STREAMS, self.settings.h2_max_concurrent_streams),
            (S_INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW),
            (S_MAX_FRAME_SIZE, OUR_MAX_FRAME),
            (S_MAX_HEADER_LIST_SIZE, self.settings.max_head_bytes),
            (S_ENABLE_PUSH, 0),
        ]
        payload = b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in settings)
        transport.write(  # type: ignore[attr-defined]
            frame(SETTINGS, 0, 0, payload)
            + frame(WINDOW_UPDATE, 0, 0, (OUR_CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big"))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(self)
        self.transport = None
        self.writable.set()
        for stream in list(self.streams.values()):
            self._drop(stream)
        self.streams.clear()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.direct is not None:
            return self.direct
        if self.end == len(self.buffer):  # full: move the incomplete frame to the front, or grow
            size = self.end - self.start
            if self.start == 0:
                self.buffer = bytearray(min(2 * len(self.buffer), OUR_MAX_FRAME + 9 + (256 << 10)))
                self.buffer[:size] = self.view[:size]
                self.view = memoryview(self.buffer)
            else:
                self.view[:size] = self.view[self.start : self.end]
                self.start, self.end = 0, size
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing:
            self.start = self.end = 0  # after a connection error: read and dropped
            return
        if self.direct is not None:
            self._direct_read(nbytes)
        else:
            self.end += nbytes
        self._process()

    def data_in(self, data: bytes) -> None:
        """Bytes read before this protocol took over the connection (the HTTP/1.1 side saw the preface)."""
        if len(data) > len(self.buffer):
            self.buffer = bytearray(len(data))
            self.view = memoryview(self.buffer)
        self.view[: len(data)] = data
        self.end = len(data)
        self._process()

    # ------------------------------------------------------------------------------ frames in

    def _process(self) -> None:
        try:
            self._frames()
        except ConnectionError_ as e:
            self._fail(e.code, str(e))
        self._flush()  # the control frames this read called for (answers go out at the pass's end)

    def _frames(self) -> None:
        view = self.view
        pos, end = self.start, self.end
        if self.preface:
            have = min(end - pos, len(PREFACE))
            if view[pos : pos + have] != PREFACE[:have]:
                raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
            if have < len(PREFACE):
                return
            pos += len(PREFACE)
            self.preface = False
            self.since = self.loop.time()
        while end - pos >= 9 and not self.closing and self.direct is None:
            length = (view[pos] << 16) | (view[pos + 1] << 8) | view[pos + 2]
            kind, flags = view[pos + 3], view[pos + 4]
            stream_id = int.from_bytes(view[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            if length > OUR_MAX_FRAME:
                raise ConnectionError_(
                    FRAME_SIZE_ERROR, f"frame of {length} bytes exceeds SETTINGS_MAX_FRAME_SIZE"
                )
            available = end - pos - 9
            if available < length:
                if (
                    kind == DATA
                    and length >= DIRECT_READ
                    and self._start_direct(flags, stream_id, length, pos)
                ):
                    pos = end
                break
            payload = view[pos + 9 : pos + 9 + length]
            pos += 9 + length
            self._frame(kind, flags, stream_id, payload)
        if pos >= end:
            self.start = self.end = 0
        else:
            self.start = pos

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self.continuing is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionError_(FRAME_SIZE_ERROR, "PING of a length other than 8")
            if not flags & ACK:
                self._calm()
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == PRIORITY:
            self._priority(stream_id, payload)
        elif kind == GOAWAY:
            if stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
            # The client opens no new streams; the connection stays until it closes it (or idles out).
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client cannot push")
        # unknown frame types are ignored (RFC 9113 4.1)

    @staticmethod
    def _unpad(flags: int, payload: memoryview) -> memoryview:
        if not flags & PADDED:
            return payload
        if not payload:
            raise ConnectionError_(PROTOCOL_ERROR, "padded frame without a pad length")
        pad = payload[0]
        if pad >= len(payload):
            raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - pad]

    # ---- DATA

    def _data_stream(self, flags: int, stream_id: int, length: int) -> Stream | None:
        """Flow control and stream state of a DATA frame: the stream it feeds, or None to drop it."""
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        if length > self.recv_window:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self.recv_window -= length
        if self.recv_window < OUR_CONNECTION_WINDOW // 2:
            self.out.append(
                frame(WINDOW_UPDATE, 0, 0, (OUR_CONNECTION_WINDOW - self.recv_window).to_bytes(4, "big"))
            )
            self.recv_window = OUR_CONNECTION_WINDOW
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id in self.reset_ids:
                return None  # we reset it; the client may not know yet
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            self._reset(stream_id, STREAM_CLOSED)
            return None
        if not stream.remote_open:
            self._refuse(stream_id, STREAM_CLOSED)
            return None
        if length > stream.recv_window:
            self._refuse(stream_id, FLOW_CONTROL_ERROR)
            return None
        stream.recv_window -= length
        stream.since = self.loop.time()
        if stream.recv_window < OUR_STREAM_WINDOW // 2 and not flags & END_STREAM:
            self.out.append(
                frame(
                    WINDOW_UPDATE, 0, stream_id, (OUR_STREAM_WINDOW - stream.recv_window).to_bytes(4, "big")
                )
            )
            stream.recv_window = OUR_STREAM_WINDOW
        if length == 0 and not flags & END_STREAM:
            self._calm()
        return stream

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        stream = self._data_stream(flags, stream_id, len(payload))
        if stream is None:
            return
        data = self._unpad(flags, payload)
        if not stream.answered and data:
            self._body_in(stream, data)
        if flags & END_STREAM:
            self._remote_end(stream)

    def _body_in(self, stream: Stream, data: memoryview) -> None:
        end = stream.filled + len(data)
        limit = self.settings.max_request_bytes
        if stream.expected is not None:
            if end > stream.expected:
                return self._refuse(stream.id, PROTOCOL_ERROR)
            if stream.filled == 0 and end == stream.expected:
                stream.body = bytes(data)
            else:
                self._buffer_body(stream)
                stream.body[stream.filled : end] = data
        else:
            if end > limit:
                return self._answer_early(stream, stream.route.errors(BodyTooLarge(limit)))
            if not stream.body:
                stream.body = bytearray()
            stream.body += data
        stream.filled = end

    @staticmethod
    def _buffer_body(stream: Stream) -> None:
        if isinstance(stream.body, memoryview):
            return
        first = stream.body
        size = stream.expected
        stream.body = memoryview(np.empty(size, dtype=np.uint8) if size >= LARGE_BUFFER else bytearray(size))
        stream.body[: len(first)] = first

    def _start_direct(self, flags: int, stream_id: int, length: int, pos: int) -> bool:
        """A DATA frame whose payload is still coming: when it fills part of a known-length body, the
        socket reads the rest of it straight into that body. False: read it the usual way."""
        stream = self.streams.get(stream_id)
        if (
            flags & PADDED
            or stream is None
            or stream.expected is None
            or stream.answered
            or not stream.remote_open
            or stream.filled + length > stream.expected
            or length > stream.recv_window
            or length > self.recv_window
        ):
            return False
        self._data_stream(flags, stream_id, length)  # flow control; the checks above mean it accepts
        self._buffer_body(stream)
        have = self.end - pos - 9
        stream.body[stream.filled : stream.filled + have] = self.view[pos + 9 : self.end]
        stream.filled += have
        self.direct = stream.body[stream.filled : stream.filled + length - have]
        self.direct_frame = (stream, length - have, flags)
        return True

    def _direct_read(self, nbytes: int) -> None:
        stream, left, flags = self.direct_frame
        stream.filled += nbytes
        left -= nbytes
        if left:
            self.direct = self.direct[nbytes:]
            self.direct_frame = (stream, left, flags)
            return
        self.direct = self.direct_frame = None
        if flags & END_STREAM and stream.id in self.streams:
            self._remote_end(stream)

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_open = False
        if stream.answered:
            self._close_stream(stream)
            return
        if stream.expected is not None and stream.filled != stream.expected:
            return self._refuse(stream.id, PROTOCOL_ERROR)
        if isinstance(stream.body, memoryview) and stream.filled != len(stream.body):
            stream.body = stream.body[: stream.filled]
        stream.task = self.loop.create_task(self._serve(stream))

    # ---- HEADERS, CONTINUATION

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if int.from_bytes(block[:4], "big") & 0x7FFFFFFF == stream_id:
                self._decode(bytes(block[5:]))  # keep the HPACK state, then refuse the stream
                self._reset(stream_id, PROTOCOL_ERROR)
                return
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, bytes(block))
        else:
            self.continuing = (stream_id, flags, bytearray(block))
            self._check_block_size(len(block))

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if self.continuing is None or self.continuing[0] != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without HEADERS before it")
        _, first_flags, block = self.continuing
        block += payload
        self._check_block_size(len(block))
        if flags & END_HEADERS:
            self.continuing = None
            self._header_block(stream_id, first_flags, bytes(block))

    def _check_block_size(self, size: int) -> None:
        # The compressed block cannot be larger than the list it decodes to by much; endless
        # CONTINUATIONs (CVE-2024-27316) end here.
        if size > self.settings.max_head_bytes + 1024:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block exceeds the header list limit")

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        try:
            return self.decoder.decode(block)
        except HeaderListTooLarge as e:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"{e} (raise it with --http-max-head-bytes)") from e
        except HpackError as e:
            raise ConnectionError_(COMPRESSION_ERROR, f"HPACK: {e}") from e

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        fields = self._decode(block)  # always: the HPACK state must follow every block
        stream = self.streams.get(stream_id)
        if stream is not None:
            return self._trailers(stream, flags, fields)
        if stream_id % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "a client stream with an even id")
        if stream_id <= self.last_stream_id:
            if stream_id in self.closed_ids or stream_id in self.reset_ids:
                raise ConnectionError_(STREAM_CLOSED, "HEADERS on a closed stream")
            raise ConnectionError_(PROTOCOL_ERROR, "stream id lower than one used before")
        self.last_stream_id = stream_id
        if self.goaway_sent:
            return  # past our GOAWAY: ignored, as the client was told
        if self.shutting_down or len(self.streams) >= self.settings.h2_max_concurrent_streams:
            self._reset(stream_id, REFUSED_STREAM)
            return
        stream = Stream(stream_id, self.peer_window)
        self.streams[stream_id] = stream
        self.since = stream.since = self.loop.time()
        try:
            self._request_head(stream, fields)
        except StreamError as e:
            return self._refuse(stream.id, e.code)
        found = self.router.find(stream.method, stream.path)
        if flags & END_STREAM:
            stream.remote_open = False
        if isinstance(found, HttpResponse):
            return self._answer_early(stream, found)
        stream.route, stream.params = found
        if stream.expected is not None and stream.expected > self.settings.max_request_bytes:
            return self._answer_early(
                stream, stream.route.errors(BodyTooLarge(self.settings.max_request_bytes))
            )
        if not stream.remote_open:
            self._remote_end(stream)

    @staticmethod
    def _request_head(stream: Stream, fields: list[tuple[bytes, bytes]]) -> None:
        """RFC 9113 8.2-8.3: pseudo-headers first, each once; lowercase names; no connection-specific
        fields; what a request needs. A malformed one is a stream error (PROTOCOL_ERROR)."""
        pseudo: dict[bytes, bytes] = {}
        headers = stream.headers
        for name, value in fields:
            if name[:1] == b":":
                if headers or name not in PSEUDO or name in pseudo:
                    raise StreamError(PROTOCOL_ERROR, "bad pseudo-header")
                pseudo[name] = value
                continue
            if (
                name in CONNECTION_SPECIFIC
                or name != name.lower()
                or (name == b"te" and value != b"trailers")
            ):
                raise StreamError(PROTOCOL_ERROR, "malformed header field")
            headers[name] = headers[name] + b", " + value if name in headers else value
        method = pseudo.get(b":method")
        if method is None:
            raise StreamError(PROTOCOL_ERROR, "no :method")
        stream.method = method.decode("latin-1")
        if stream.method == "CONNECT":
            raise StreamError(PROTOCOL_ERROR, "CONNECT is not served")
        target = pseudo.get(b":path")
        if not target or b":scheme" not in pseudo:
            raise StreamError(PROTOCOL_ERROR, "no :scheme or :path")
        path, _, stream.query = target.partition(b"?")
        text = path.decode("latin-1")
        stream.path = unquote(text, encoding="latin-1") if "%" in text else text
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise StreamError(PROTOCOL_ERROR, "content-length is not a number")
            stream.expected = int(declared)

    def _trailers(self, stream: Stream, flags: int, fields: list[tuple[bytes, bytes]]) -> None:
        if not stream.remote_open:
            return self._refuse(stream.id, STREAM_CLOSED)
        if not flags & END_STREAM or any(name[:1] == b":" for name, _ in fields):
            return self._refuse(stream.id, PROTOCOL_ERROR)
        self._remote_end(stream)

    # ---- control frames

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        self._calm()
        for offset in range(0, len(payload), 6):
            key = int.from_bytes(payload[offset : offset + 2], "big")
            value = int.from_bytes(payload[offset + 2 : offset + 6], "big")
            if key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self.peer_window
                self.peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
                    self._wake(stream)
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            # HEADER_TABLE_SIZE: our encoder never uses the peer's table; the rest only inform
        self.out.append(frame(SETTINGS, ACK, 0))

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        stream = self.streams.get(stream_id)
        if not (self.sending if stream_id == 0 else stream is not None and stream.sending):
            self._calm()  # an update while an answer is going out is the client reading it: not counted
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            for waiting in list(self.window_waiters):
                self._wake(waiting)
            return
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # closed: allowed, ignored
        if increment == 0:
            return self._refuse(stream.id, PROTOCOL_ERROR)
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            return self._refuse(stream.id, FLOW_CONTROL_ERROR)
        self._wake(stream)

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM of a length other than 4")
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            return
        self._drop(stream)
        self._new_second()
        self.resets += 1
        if self.resets > self.settings.h2_max_resets_per_second:
            raise ConnectionError_(
                ENHANCE_YOUR_CALM, "too many streams reset (raise it with --http2-max-resets-per-second)"
            )

    def _priority(self, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            return self._refuse(stream_id, FRAME_SIZE_ERROR)
        self._calm()
        if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
            self._refuse(stream_id, PROTOCOL_ERROR)

    def _new_second(self) -> None:
        """Starts the counts of resets and control frames anew once a second has passed."""
        now = self.loop.time()
        if now - self.budget_second >= 1.0:
            self.budget_second, self.resets, self.control_frames = now, 0, 0

    def _calm(self) -> None:
        """Counts a frame that costs us work without carrying a request; past the limit, GOAWAY."""
        self._new_second()
        self.control_frames += 1
        if self.control_frames > self.settings.h2_max_control_frames_per_second:
            raise ConnectionError_(
                ENHANCE_YOUR_CALM,
                "too many control frames (raise it with --http2-max-control-frames-per-second)",
            )

    # ------------------------------------------------------------------------------ streams

    def _reset(self, stream_id: int, code: int) -> None:
        self.out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        self.reset_ids.append(stream_id)

    def _refuse(self, stream_id: int, code: int) -> None:
        """RST_STREAM with `code`; the stream, if open, is forgotten."""
        self._reset(stream_id, code)
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        """Forgets a stream: its task is cancelled, a writer waiting for window wakes and finds it gone."""
        stream.reset = True
        self.streams.pop(stream.id, None)
        self.closed_ids.append(stream.id)
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        self._wake(stream)
        self._after_stream()

    def _close_stream(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        self.closed_ids.append(stream.id)
        self._after_stream()

    def _after_stream(self) -> None:
        if not self.streams and not self.closing:
            self.since = self.loop.time()
            if self.goaway_sent or self.shutting_down:
                self._goaway()
                self._close()

    def _answer_early(self, stream: Stream, response: HttpResponse) -> None:
        """An answer from the head (or a body past the limit) while the body may still come: sent now.
        What the client still sends is read and dropped until it ends the stream; a stream still open
        LINGER_SECONDS later is reset with NO_ERROR (RFC 9113 8.1). Resetting at once is what the RFC
        allows, but clients such as httpx then fail the request they are still sending."""
        stream.answered = self.loop.time()
        self.out.append(self._head_frames(stream.id, response, stream.method, last=False))
        body = b"" if stream.method == "HEAD" else b"".join(response.chunks)
        self.out.append(frame(DATA, END_STREAM, stream.id, body))  # error bodies fit any window
        stream.send_window -= len(body)
        self.send_window -= len(body)
        if not stream.remote_open:
            self._close_stream(stream)

    async def _serve(self, stream: Stream) -> None:
        request = HttpRequest(
            stream.method, stream.path, stream.query, stream.headers, stream.body, stream.params
        )
        try:
            response = await self.router.call(stream.route, request)
            stream.sending = True
            self.sending += 1
            try:
                await self._respond(stream, response)
            finally:
                self.sending -= 1
        except StreamReset:
            return
        except Exception:  # a streamed answer that failed midway: the stream ends in an error
            log.exception("unexpected error answering %s %s", stream.method, stream.path)
            if not stream.reset:
                self._refuse(stream.id, INTERNAL_ERROR)
                self._flush()
            return
        if not stream.reset:
            self._close_stream(stream)

    # ------------------------------------------------------------------------------ frames out

    def _head_frames(self, stream_id: int, response: HttpResponse, method: str, last: bool) -> bytes:
        headers = [(n, v) for n, v in response.headers if n not in CONNECTION_SPECIFIC]
        block = hpack_encode.encode(response.status, headers)
        flags = END_STREAM if last else 0
        size = self.peer_max_frame
        if len(block) <= size:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        pieces = [block[i : i + size] for i in range(0, len(block), size)]
        frames = [frame(HEADERS, flags, stream_id, pieces[0])]
        frames += [frame(CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1]]
        frames.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
        return b"".join(frames)

    async def _respond(self, stream: Stream, response: HttpResponse) -> None:
        chunks = response.chunks
        if stream.method == "HEAD":
            if not isinstance(chunks, list):
                await chunks.aclose()
            self._write(self._head_frames(stream.id, response, "HEAD", last=True))
            return
        trailers = response.trailers
        if isinstance(chunks, list):
            if len(chunks) == 1 and trailers is None:
                body = chunks[0]
                size = len(body)
                if size <= self.peer_max_frame and size <= stream.send_window and size <= self.send_window:
                    # The usual answer: HEADERS and one DATA frame in one write.
                    stream.send_window -= size
                    self.send_window -= size
                    self._write(
                        self._head_frames(stream.id, response, stream.method, last=False)
                        + frame_head(DATA, END_STREAM, stream.id, size)
                        + bytes(body)
                    )
                    return
            final = len(chunks) - 1 if trailers is None else None  # the chunk whose frame ends the stream
            self._write(
                self._head_frames(stream.id, response, stream.method, last=not chunks and final is not None)
            )
            for index, chunk in enumerate(chunks):
                await self._send_data(stream, memoryview(chunk).cast("B"), index == final)
        else:
            self._write(self._head_frames(stream.id, response, stream.method, last=False))
            try:
                async for chunk in chunks:
                    if chunk:
                        await self._send_data(stream, memoryview(chunk).cast("B"), False)
                if response.trailers is None:
                    await self._send_data(stream, memoryview(b""), True)
            finally:
                await chunks.aclose()
        if response.trailers is not None:  # read now: a stream may have filled it as it ended
            block = hpack_encode.encode(
                None, [(n, v) for n, v in response.trailers if n not in CONNECTION_SPECIFIC]
            )
            self._write(frame(HEADERS, END_STREAM | END_HEADERS, stream.id, block))

    async def _send_data(self, stream: Stream, data: memoryview, last: bool) -> None:
        """DATA frames within the stream's and the connection's windows and the peer's frame size.
        Small data joins the frames queued for this loop pass; large data goes out as views, up to
        SEND_BATCH bytes of frames a write (one writev, however small the peer's frames)."""
        while True:
            if stream.reset or self.transport is None:
                raise StreamReset
            if data and min(stream.send_window, self.send_window) <= 0:
                await self._window(stream)
                continue
            if not self.writable.is_set():
                await self.writable.wait()
                continue
            if len(data) <= SMALL_DATA:
                size = len(data)  # within the window (checked above only for > 0): trim below
                size = min(size, stream.send_window, self.send_window)
                flags = END_STREAM if last and size == len(data) else 0
                self._write(frame_head(DATA, flags, stream.id, size) + bytes(data[:size]))
                stream.send_window -= size
                self.send_window -= size
                data = data[size:]
                if not data:
                    return
                continue
            pieces: list[bytes | memoryview] = []
            batch = min(len(data), stream.send_window, self.send_window, SEND_BATCH)
            stream.send_window -= batch
            self.send_window -= batch
            for start in range(0, batch, self.peer_max_frame):
                size = min(self.peer_max_frame, batch - start)
                end_stream = last and start + size == len(data)
                pieces += (
                    frame_head(DATA, END_STREAM if end_stream else 0, stream.id, size),
                    data[start : start + size],
                )
            self._flush()
            self.transport.writelines(pieces)
            data = data[batch:]
            if not data:
                return

    async def _window(self, stream: Stream) -> None:
        stream.window_open = self.loop.create_future()
        self.window_waiters.add(stream)
        try:
            await stream.window_open
        finally:
            self.window_waiters.discard(stream)
            stream.window_open = None

    @staticmethod
    def _wake(stream: Stream) -> None:
        waiter = stream.window_open
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _write(self, data: bytes) -> None:
        """Queues frames of an answer; the answers of one pass of the event loop go out in one write."""
        if self.transport is None:
            raise StreamReset
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        self.flush_pending = False
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    # ------------------------------------------------------------------------------ lifecycle

    def _fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY with the code, then close."""
        log.debug("HTTP/2 connection error %d: %s", code, message)
        if self.transport is None or self.closing:
            return
        debug = message.encode()[:256]
        self.out.append(
            frame(GOAWAY, 0, 0, self.last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)
        )
        self.goaway_sent = True
        self._flush()
        # Close after a lingering read: closing with the client's bytes unread would reset the
        # connection, and the client could lose the GOAWAY that says why.
        self.closing = True
        self.direct = self.direct_frame = None
        for stream in list(self.streams.values()):
            self._drop(stream)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.abort)

    def _goaway(self) -> None:
        if self.goaway_sent or self.transport is None:
            return
        self.goaway_sent = True
        self._flush()
        self.transport.write(
            frame(GOAWAY, 0, 0, self.last_stream_id.to_bytes(4, "big") + NO_ERROR.to_bytes(4, "big"))
        )

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def sweep(self, now: float) -> None:
        for stream in list(self.streams.values()):
            if stream.answered and now - stream.answered > LINGER_SECONDS:
                self._reset(stream.id, NO_ERROR)
                self._close_stream(stream)
            elif (
                stream.remote_open and not stream.answered and now - stream.since > self.settings.body_timeout
            ):
                # A body the app awaits whole that stopped coming (gRPC streams, idle by nature, will need
                # their own rule).
                errors = stream.route.errors if stream.route is not None else self.router.fallback_errors
                self._answer_early(stream, stalled_body(errors, self.settings.body_timeout))
        self._flush()
        elapsed = now - self.since
        if self.preface and elapsed > self.settings.head_timeout:
            self._close()
        elif not self.streams and elapsed > self.settings.keep_alive_timeout:
            self._goaway()
            self._close()

    def shutdown(self) -> None:
        """New streams are refused from now on; GOAWAY and close once the open ones are answered.
        (GOAWAY goes last: some clients, httpcore among them, fail every open stream on receiving it.)"""
        self.shutting_down = True
        if not self.streams:
            self._goaway()
            self._close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
