"""HTTP/2's receiving half: what each frame read does to a connection (RFC 9113 sections 5 and 6).

`FrameReceiver` is the base of `H2Connection` (h2.py), on the connections' base. It owns the state of
what was received (the HPACK decoder, a header block in CONTINUATIONs, the highest stream id, the
per-second counts of the defences, keepalive strikes); what it needs of the connection is written down
at the top of the class. A frame for
a stream goes to the stream's handler (h2_frames.StreamHandler) once flow control and stream states are
applied. A connection error is raised as `ConnectionError_`; the connection turns it into GOAWAY.

Defences: concurrent streams (REFUSED_STREAM beyond), client resets per second (rapid reset, GOAWAY
ENHANCE_YOUR_CALM), control frames per second in proportion to the answers sent (`_calm`), keepalive
PING strikes, the header block's size across CONTINUATIONs and the decoded header list (HPACK bombs),
windows past 2^31-1 (FLOW_CONTROL_ERROR).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from tensorgate.server.http.connection import BaseConnection
from tensorgate.server.http.h2_frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ConnectionError_,
    Stream,
    StreamError,
    frame,
    request_head,
    settings_entries,
    unpad,
)
from tensorgate.server.http.h2_request import BufferedRequest
from tensorgate.server.http.hpack_decode import (
    BLOCK_KEPT_BYTES,
    BLOCKS_KEPT,
    Decoder,
    HeaderListTooLarge,
    HpackError,
)

if TYPE_CHECKING:
    from tensorgate.server.http.connection import CallOpener, ConnectionHost
    from tensorgate.server.http.h2_window import FlowControl

CONTROL_FRAMES_PER_ANSWER_WRITE = 10


class FrameReceiver(BaseConnection):
    # ---- what it needs of the connection (h2.py sets them; its base's `out` holds the control frames to
    # write at the end of this read)
    calls: CallOpener | None
    streams: dict[int, Stream]
    closed_ids: collections.deque[int]
    reset_ids: collections.deque[int]  # streams we reset
    flow: FlowControl
    peer_max_frame: int
    window_waiters: set[Stream]
    goaway_sent: bool
    shutting_down: bool
    since: float

    def _reset(self, stream_id: int, code: int) -> None: ...  # RST_STREAM
    def _refuse(self, stream_id: int, code: int) -> None: ...  # RST_STREAM, the stream forgotten
    def _drop(self, stream: Stream) -> None: ...  # the stream forgotten, its handler told
    def _wake(self, stream: Stream) -> None: ...  # a writer waiting for the stream's window
    def close(self, stream: Stream) -> None: ...  # the stream's exchange is over
    def _ping_acked(self, payload: bytes) -> None: ...  # an ACK of one of our PINGs (gRPC keepalive)

    def __init__(self, host: ConnectionHost) -> None:
        super().__init__(host)
        self.decoder = Decoder(self.settings.max_head_bytes)
        # block -> (its fields, their request head): a client sends the same block for each call to a
        # method, and the decoder then hands back the same list of fields (hpack_decode.py)
        self.heads: dict[bytes, tuple[list, tuple[str, str, bytes, int | None, dict[bytes, bytes]]]] = {}
        self.continuing: tuple[int, int, bytearray] | None = None  # (stream, flags of HEADERS, block)
        self.last_stream_id = 0
        self.budget_second = 0.0
        self.resets = 0
        self.control_frames = 0
        self.answer_writes = 0  # this second's writes of answer frames (HEADERS, DATA, trailers)
        self.last_ping = float("-inf")
        self.ping_strikes = 0
        self.pings_without_data = 0  # our keepalive PINGs since the last answer frame

    def _answered(self, writes: int) -> None:
        """Frames of answers went out: they forgive PINGs (as grpc-core servers do) and allow the control
        frames a client sends as it reads them (`_calm`)."""
        self.answer_writes += writes
        self.ping_strikes = 0
        self.last_ping = float("-inf")
        self.pings_without_data = 0

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
                self._ping_strike()
                self.out.append(frame(PING, ACK, 0, payload))
            else:
                self._ping_acked(bytes(payload))
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

    # ---- DATA

    def _data_stream(self, flags: int, stream_id: int, length: int) -> Stream | None:
        """Flow control and stream state of a DATA frame: the stream it feeds, or None to drop it."""
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        increment = self.flow.received(length)
        if increment:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big")))
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
        if length > stream.recv_window:  # the stream's window (h2_window.py gives it back)
            self._refuse(stream_id, FLOW_CONTROL_ERROR)
            return None
        stream.recv_window -= length
        stream.since = self.loop.time()
        if length == 0 and not flags & END_STREAM:
            self._calm()
        if flags & END_STREAM:
            stream.remote_open = False
        return stream

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        stream = self._data_stream(flags, stream_id, len(payload))
        if stream is None:
            return
        data = unpad(flags, payload)
        if data:
            stream.handler.data_in(data)  # type: ignore[union-attr]
        if flags & END_STREAM and stream.id in self.streams:
            stream.handler.end_in()  # type: ignore[union-attr]

    def _start_direct(self, flags: int, stream_id: int, length: int, have: memoryview) -> memoryview | None:
        """A DATA frame whose payload is still coming: when it fills part of a plain request's body of
        known length, where the socket reads the rest of it straight into that body. None: read it the
        usual way."""
        stream = self.streams.get(stream_id)
        if (
            flags & PADDED
            or stream is None
            or not isinstance(stream.handler, BufferedRequest)
            or not stream.handler.takes_direct(length)
            or not stream.remote_open
            or length > stream.recv_window
            or length > self.flow.receive
        ):
            return None
        self._data_stream(flags, stream_id, length)  # flow control; the checks above mean it accepts
        self.direct_stream = stream
        return stream.handler.start_direct(have, length)

    # ---- HEADERS, CONTINUATION

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = unpad(flags, payload)
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
        stream = Stream(stream_id, self.flow.peer_initial)
        self.streams[stream_id] = stream
        self.since = stream.since = self.loop.time()
        try:
            stream.method, stream.path, stream.query, stream.expected, headers = self._head(block, fields)
        except StreamError as e:
            return self._refuse(stream.id, e.code)
        stream.headers = dict(headers)  # the stream's own: the kept head is shared
        if flags & END_STREAM:
            stream.remote_open = False
        handler = self.calls.open(self, stream) if self.calls is not None else None  # type: ignore[arg-type]
        if handler is not None:
            stream.handler = handler
            if not stream.remote_open:
                handler.end_in()
            return
        request = stream.handler = BufferedRequest(self, stream)  # type: ignore[arg-type]
        request.start()

    def _head(
        self, block: bytes, fields: list[tuple[bytes, bytes]]
    ) -> tuple[str, str, bytes, int | None, dict[bytes, bytes]]:
        """request_head of `fields`, read once for as long as the decoder gives the same list for `block`
        (the same list object: held here, so its identity cannot pass to another)."""
        kept = self.heads.get(block)
        if kept is not None and kept[0] is fields:
            return kept[1]
        headers: dict[bytes, bytes] = {}
        head = (*request_head(fields, headers), headers)
        if len(block) <= BLOCK_KEPT_BYTES:
            if len(self.heads) >= BLOCKS_KEPT:
                self.heads.clear()
            self.heads[block] = (fields, head)
        return head

    def _trailers(self, stream: Stream, flags: int, fields: list[tuple[bytes, bytes]]) -> None:
        if not stream.remote_open:
            return self._refuse(stream.id, STREAM_CLOSED)
        if not flags & END_STREAM or any(name[:1] == b":" for name, _ in fields):
            return self._refuse(stream.id, PROTOCOL_ERROR)
        stream.remote_open = False
        stream.handler.end_in()  # type: ignore[union-attr]

    # ---- control frames

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        entries = settings_entries(payload)
        self._calm()
        for key, value in entries:
            if key == S_INITIAL_WINDOW_SIZE:
                self.flow.initial_changed(value, self.streams.values())
                for stream in self.streams.values():
                    self._wake(stream)
            elif key == S_MAX_FRAME_SIZE:
                self.peer_max_frame = value
            # HEADER_TABLE_SIZE: our encoder never uses the peer's table; the rest only inform
        self.out.append(frame(SETTINGS, ACK, 0))

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        self._calm()
        if stream_id == 0:
            self.flow.connection_opened(increment)
            for waiting in list(self.window_waiters):
                self._wake(waiting)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # closed: allowed, ignored
        error = self.flow.stream_opened(stream, increment)
        if error is not None:
            return self._refuse(stream.id, error)
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
        """Starts the counts of resets, control frames and answer writes anew once a second has passed."""
        now = self.loop.time()
        if now - self.budget_second >= 1.0:
            self.budget_second, self.resets, self.control_frames, self.answer_writes = now, 0, 0, 0

    def _ping_strike(self) -> None:
        """A keepalive PING sooner than the minimum interval after the last one, with no answer sent in
        between, is a strike; more than the strikes allowed end the connection as grpc-core's servers
        do, with the debug data its clients read (they then ping less often)."""
        now = self.loop.time()
        if now - self.last_ping < self.settings.h2_min_ping_interval:
            self.ping_strikes += 1
            if self.ping_strikes > self.settings.h2_max_ping_strikes:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "too_many_pings")
        self.last_ping = now

    def _calm(self) -> None:
        """Counts a frame that costs us work without carrying a request (SETTINGS, PING, PRIORITY,
        WINDOW_UPDATE, empty DATA). A client reading answers sends some in proportion to them: gRPC's
        C core a connection WINDOW_UPDATE and a stream one for each answer it reads, and BDP PINGs with
        them (bench/results/2026-11-27-real-clients.md). So a second allows the limit plus
        CONTROL_FRAMES_PER_ANSWER_WRITE for each write of an answer's frames this second (Envoy's
        max_inbound_window_update_frames_per_data_frame_sent is the same idea); past that, GOAWAY."""
        self._new_second()
        self.control_frames += 1
        if (
            self.control_frames > self.settings.h2_max_control_frames_per_second
            and self.control_frames
            > self.settings.h2_max_control_frames_per_second
            + CONTROL_FRAMES_PER_ANSWER_WRITE * self.answer_writes
        ):
            raise ConnectionError_(
                ENHANCE_YOUR_CALM,
                "too many control frames (raise it with --http2-max-control-frames-per-second)",
            )
