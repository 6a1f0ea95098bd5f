"""HTTP/2's receiving half: what each frame read does to a connection (RFC 9113 sections 5 and 6).

`FrameReceiver` is a part of `H2Connection` (h2.py), which holds the state these methods read and write
(streams, windows, the frames to write in `out`, the per-second counts of the defences) and the stream
actions they call (`_reset`, `_refuse`, `_drop`, `_remote_end`, `_answer_early`, `_wake`). A connection
error is raised as `ConnectionError_`; the connection turns it into GOAWAY.
"""

from __future__ import annotations

from server.http.grpc_wire import is_grpc
from server.http.h2_frames import (
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
    MAX_WINDOW,
    OUR_CONNECTION_WINDOW,
    OUR_STREAM_WINDOW,
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
from server.http.hpack_decode import HeaderListTooLarge, HpackError
from server.http.listener import body_buffer
from server.router import BodyTooLarge, HttpResponse

CONTROL_FRAMES_PER_ANSWER_WRITE = 10


class FrameReceiver:
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
        if stream.recv_window < OUR_STREAM_WINDOW // 2 and not flags & END_STREAM and stream.grpc is None:
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
        data = unpad(flags, payload)
        if stream.grpc is not None:
            if data:
                stream.grpc.data_in(data)
                self.grpc_credit(stream, stream.grpc.queued)
            if flags & END_STREAM:
                stream.remote_open = False
                stream.grpc.end_in()
            return
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
        if not isinstance(stream.body, memoryview):
            stream.body = body_buffer(stream.expected, stream.body)

    def _start_direct(self, flags: int, stream_id: int, length: int, pos: int) -> bool:
        """A DATA frame whose payload is still coming: when it fills part of a known-length body, the
        socket reads the rest of it straight into that body. False: read it the usual way."""
        stream = self.streams.get(stream_id)
        if (
            flags & PADDED
            or stream is None
            or stream.grpc is not None
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
        if stream.grpc is not None:
            return stream.grpc.end_in()
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
        stream = Stream(stream_id, self.peer_window, OUR_STREAM_WINDOW)
        self.streams[stream_id] = stream
        self.since = stream.since = self.loop.time()
        try:
            stream.method, stream.path, stream.query, stream.expected = request_head(fields, stream.headers)
        except StreamError as e:
            return self._refuse(stream.id, e.code)
        if flags & END_STREAM:
            stream.remote_open = False
        if self.grpc is not None and stream.method == "POST" and is_grpc(stream.headers.get(b"content-type")):
            return self._start_grpc(stream)
        found = self.router.find(stream.method, stream.path)
        if isinstance(found, HttpResponse):
            return self._answer_early(stream, found)
        stream.route, stream.params = found
        if stream.expected is not None and stream.expected > self.settings.max_request_bytes:
            return self._answer_early(
                stream, stream.route.errors(BodyTooLarge(self.settings.max_request_bytes))
            )
        if not stream.remote_open:
            self._remote_end(stream)

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
        entries = settings_entries(payload)
        self._calm()
        for key, value in entries:
            if key == S_INITIAL_WINDOW_SIZE:
                delta = value - self.peer_window
                self.peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
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
        stream = self.streams.get(stream_id)
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
