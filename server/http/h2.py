"""HTTP/2 (RFC 9113) as our own frame layer. No `h2` state machine: its ~75 us a request was most of the
cost. Here, the connection: its read buffer cut into frames, its streams and their lifecycle, the stream
API handlers answer through, and the connection's own lifecycle. What each frame read does is
h2_receive.py; the frame vocabulary and what a stream's handler is, h2_frames.py; flow control,
h2_window.py; a plain request's body and answer, h2_request.py; HPACK, hpack_decode.py and
hpack_encode.py.

One connection: a BufferedProtocol whose read buffer holds whole frames; frames are handled in order
as they complete, and the control frames they call for (SETTINGS ACK, PING ACK, WINDOW_UPDATE,
RST_STREAM) are written once per read. A stream's head picks its handler: what the host's call opener
(the gRPC services, on ports that serve gRPC) opens, else a plain request. Handlers answer with
`send_headers`, `send_now` / `answer_now` (what fits the windows at once, with no task) and `send_data`
(waits for the peer's window and the socket), `credit` (gives the peer back the window of what was
read), `reset` and `close`.

A large DATA frame for a plain request's body of known length is read by the socket straight into the
body's buffer (as HTTP/1.1 does), so a tensor is not copied between the socket and the model.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from typing import TYPE_CHECKING

from tensorgate.server.http.h2_frames import (
    AGE_JITTER,
    BULK_READ,
    CLOSED_KEPT,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    DIRECT_READ,
    END_HEADERS,
    END_STREAM,
    FRAME_SIZE_ERROR,
    GOAWAY_DELAY,
    GOAWAY_PING,
    GOAWAY_PING_WAIT,
    HEADERS,
    KEEPALIVE_PING,
    LINGER_SECONDS,
    MAX_STREAM_ID,
    NO_ERROR,
    OUR_CONNECTION_WINDOW,
    OUR_MAX_FRAME,
    OUR_STREAM_WINDOW,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    READ_BUFFER,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SEND_BATCH,
    SETTINGS,
    SMALL_DATA,
    WINDOW_UPDATE,
    ConnectionError_,
    Stream,
    StreamReset,
    frame,
    frame_head,
    goaway,
    settings_payload,
)
from tensorgate.server.http.h2_receive import FrameReceiver
from tensorgate.server.http.h2_window import FlowControl

if TYPE_CHECKING:
    from tensorgate.server.http.connection import ConnectionHost

log = logging.getLogger("tensorgate.http")


class H2Connection(FrameReceiver):
    def __init__(self, host: ConnectionHost) -> None:
        super().__init__(host)
        self.calls = host.calls  # what opens gRPC calls on ports that serve them, else None
        self.buffer = bytearray(READ_BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.filled = False  # the last read filled the read buffer
        self.direct: memoryview | None = None  # where the socket reads the rest of a large DATA frame
        # whose body that is (h2_receive.py's FrameReceiver, which sets it, infers Stream)
        self.direct_stream: Stream | None = None  # type: ignore[assignment]
        self.preface = True
        self.streams: dict[int, Stream] = {}
        self.closed_ids: collections.deque[int] = collections.deque(maxlen=CLOSED_KEPT)
        self.reset_ids: collections.deque[int] = collections.deque(maxlen=CLOSED_KEPT)  # reset by us
        self.flow = FlowControl()
        self.peer_max_frame = DEFAULT_FRAME
        self.window_waiters: set[Stream] = set()
        self.goaway_sent = False
        self.shutting_down = False
        self.closing = False
        self.since = self.loop.time()
        # gRPC keepalive and connection age (ports that serve gRPC): one timer handle each, per connection
        self.keepalive: asyncio.TimerHandle | None = None  # the next PING, or the wait for its ACK
        self.awaiting_ack = False
        self.draining = False  # the graceful GOAWAY's first half is out
        self.age: asyncio.TimerHandle | None = None  # the maximum age, then the final GOAWAY's fallback
        self.grace: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.host.opened(self)  # handed over by H1Connection, which counted this connection already
        ours = settings_payload(
            (S_MAX_CONCURRENT_STREAMS, self.settings.h2_max_concurrent_streams),
            (S_INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW),
            (S_MAX_FRAME_SIZE, OUR_MAX_FRAME),
            (S_MAX_HEADER_LIST_SIZE, self.settings.max_head_bytes),
            (S_ENABLE_PUSH, 0),
        )
        transport.write(  # type: ignore[attr-defined]
            frame(SETTINGS, 0, 0, ours)
            + frame(WINDOW_UPDATE, 0, 0, (OUR_CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big"))
        )
        if self.calls is not None:
            self._start_timers()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for timer in (self.keepalive, self.age, self.grace):
            if timer is not None:
                timer.cancel()
        for stream in list(self.streams.values()):
            self._drop(stream)
        self.streams.clear()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.direct is not None:
            return self.direct
        if self.filled and self.end == 0 and len(self.buffer) < BULK_READ:
            # The last read filled the buffer: a client sending a lot (a large message in small frames)
            # is read in fewer, larger reads. Idle connections keep the small buffer.
            self.buffer = bytearray(2 * len(self.buffer))
            self.view = memoryview(self.buffer)
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
            self.filled = self.end == len(self.buffer)
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
                if kind == DATA and length >= DIRECT_READ:
                    self.direct = self._start_direct(flags, stream_id, length, view[pos + 9 : end])
                    if self.direct is not None:
                        pos = end
                break
            payload = view[pos + 9 : pos + 9 + length]
            pos += 9 + length
            self._frame(kind, flags, stream_id, payload)
        if pos >= end:
            self.start = self.end = 0
        else:
            self.start = pos

    def _direct_read(self, nbytes: int) -> None:
        stream: Stream = self.direct_stream  # type: ignore[assignment]  # set with self.direct
        if not stream.handler.direct_read(nbytes):  # type: ignore[union-attr]
            self.direct = self.direct[nbytes:]  # type: ignore[index]  # buffer_updated checked it
            return
        self.direct = self.direct_stream = None
        if not stream.remote_open and stream.id in self.streams:  # the frame ended the stream
            stream.handler.end_in()  # type: ignore[union-attr]

    # ------------------------------------------------------------------------------ the stream API

    def send_headers(self, stream: Stream, block: bytes, end: bool = False) -> None:
        """A header block (an answer's head, or trailers with `end`) as HEADERS and CONTINUATIONs."""
        self._write(self._block_frames(stream.id, block, END_STREAM if end else 0))

    def answer_now(self, stream: Stream, block: bytes, body: bytes | memoryview) -> bool:
        """A whole answer, head and body, in one write when the body fits the windows and one frame."""
        size = len(body)
        if size > self.peer_max_frame or not self.flow.take(stream, size):
            return False
        self._write(
            self._block_frames(stream.id, block, 0)
            + frame_head(DATA, END_STREAM, stream.id, size)
            + bytes(body)
        )
        return True

    def send_now(self, stream: Stream, data: bytes | memoryview, end: bool) -> bool:
        """Small DATA joined to this loop pass's writes, when it fits the windows, a frame and the socket."""
        size = len(data)
        if size > SMALL_DATA or size > self.peer_max_frame or not self.writable.is_set():
            return False
        if not self.flow.take(stream, size):
            return False
        self._write(frame_head(DATA, END_STREAM if end else 0, stream.id, size) + bytes(data))
        return True

    async def send_data(self, stream: Stream, data: memoryview, last: bool) -> None:
        """DATA frames within the stream's and the connection's windows and the peer's frame size.
        Small data joins the frames queued for this loop pass; large data goes out as views, up to
        SEND_BATCH bytes of frames a write (one writev, however small the peer's frames)."""
        flow = self.flow
        while True:
            if stream.reset or self.transport is None:
                raise StreamReset
            room = flow.room(stream)
            if data and room <= 0:
                await self._window(stream)
                continue
            if not self.writable.is_set():
                await self.writable.wait()
                continue
            if len(data) <= SMALL_DATA:
                size = min(len(data), room, self.peer_max_frame)
                flags = END_STREAM if last and size == len(data) else 0
                self._write(frame_head(DATA, flags, stream.id, size) + bytes(data[:size]))
                flow.spend(stream, size)
                data = data[size:]
                if not data:
                    return
                continue
            pieces: list[bytes | memoryview] = []
            batch = min(len(data), room, SEND_BATCH)
            flow.spend(stream, batch)
            for start in range(0, batch, self.peer_max_frame):
                size = min(self.peer_max_frame, batch - start)
                end_stream = last and start + size == len(data)
                pieces += (
                    frame_head(DATA, END_STREAM if end_stream else 0, stream.id, size),
                    data[start : start + size],
                )
            self._flush()
            self.transport.writelines(pieces)
            self._answered(len(pieces) // 2)
            data = data[batch:]
            if not data:
                return

    def credit(self, stream: Stream, unread: int = 0) -> None:
        """Gives the peer back the stream's window for what was received and read (`unread` bytes are
        still waiting for the handler)."""
        increment = self.flow.credit(stream, unread)
        if increment:
            self._send(frame(WINDOW_UPDATE, 0, stream.id, increment.to_bytes(4, "big")))

    def reset(self, stream: Stream, code: int) -> None:
        """RST_STREAM with `code` (the stream stays known until `close` or `refuse`)."""
        self._reset(stream.id, code)

    def refuse(self, stream: Stream, code: int) -> None:
        """RST_STREAM with `code`, and the stream forgotten (its handler told)."""
        self._refuse(stream.id, code)

    def close(self, stream: Stream) -> None:
        """The stream's exchange is over: forgotten."""
        self.streams.pop(stream.id, None)
        stream.handler = None  # the handler holds the stream: without this, a cycle for the collector
        self.closed_ids.append(stream.id)
        self._after_stream()

    def flush(self) -> None:
        self._flush()

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
        """Queues frames of an answer (see BaseConnection._send)."""
        if self.transport is None:
            raise StreamReset
        self._answered(1)
        self._send(data)

    def _block_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        """A header block as HEADERS (and CONTINUATIONs past the peer's frame size)."""
        size = self.peer_max_frame
        if len(block) <= size:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        pieces = [block[i : i + size] for i in range(0, len(block), size)]
        frames = [frame(HEADERS, flags, stream_id, pieces[0])]
        frames += [frame(CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1]]
        frames.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
        return b"".join(frames)

    # ------------------------------------------------------------------------------ streams

    def _reset(self, stream_id: int, code: int) -> None:
        self.out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        self.reset_ids.append(stream_id)

    def _refuse(self, stream_id: int, code: int) -> None:
        self._reset(stream_id, code)
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        """Forgets a stream: its handler stops, a writer waiting for window wakes and finds it gone."""
        stream.reset = True
        self.streams.pop(stream.id, None)
        self.closed_ids.append(stream.id)
        if stream.handler is not None:
            stream.handler.reset()
            stream.handler = None
        self._wake(stream)
        self._after_stream()

    def _after_stream(self) -> None:
        if not self.streams and not self.closing:
            self.since = self.loop.time()
            if self.goaway_sent:
                self._close()
            elif self.shutting_down or self.host.offline.on:
                # A moment after the last answer: a client that reads the answer and GOAWAY together
                # may fail the call it has not yet finished reading (grpclib ends every stream it has).
                self.loop.call_later(GOAWAY_DELAY, self._goaway_and_close)

    def leave_when_idle(self) -> None:
        if not self.streams and not self.closing:
            self.loop.call_later(GOAWAY_DELAY, self._goaway_and_close)

    def _goaway_and_close(self) -> None:
        # Offline, new streams are served meanwhile: GOAWAY waits for the next idle moment, if any.
        if not self.streams and (self.shutting_down or self.host.offline.on):
            self._goaway()
            self._close()

    # ------------------------------------------------------------------------------ lifecycle

    def _fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY with the code, then close."""
        log.debug("HTTP/2 connection error %d: %s", code, message)
        if self.transport is None or self.closing:
            return
        debug = message.encode()[:256]
        self.out.append(goaway(self.last_stream_id, code, debug))
        self.goaway_sent = True
        self._flush()
        # Close after a lingering read: closing with the client's bytes unread would reset the
        # connection, and the client could lose the GOAWAY that says why.
        self.closing = True
        self.direct = self.direct_stream = None
        for stream in list(self.streams.values()):
            self._drop(stream)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.abort)

    def _goaway(self, debug: bytes = b"") -> None:
        if self.goaway_sent or self.transport is None:
            return
        self.goaway_sent = True
        self._flush()
        self.transport.write(goaway(self.last_stream_id, NO_ERROR, debug))

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self._flush()  # the last answer's frames, queued for this pass
            self.transport.close()

    def sweep(self, now: float) -> None:
        for stream in list(self.streams.values()):
            stream.handler.sweep(now)  # type: ignore[union-attr]
        self._flush()
        elapsed = now - self.since
        if self.preface and elapsed > self.settings.head_timeout:
            self._close()
        elif not self.streams and elapsed > self.settings.keep_alive_timeout:
            self._goaway()
            self._close()

    # ------------------------------------------------------------------------------ gRPC keepalive, age
    # As grpc-core's chttp2 server transport does with Triton's --grpc-keepalive-* and
    # --grpc-max-connection-age* flags (its GRPC_ARG_KEEPALIVE_* and GRPC_ARG_MAX_CONNECTION_AGE_* args).

    def _start_timers(self) -> None:
        settings = self.settings
        self.keepalive = self.loop.call_later(settings.grpc_keepalive_time, self._keepalive_ping)
        if settings.grpc_max_connection_age > 0:
            age = settings.grpc_max_connection_age * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
            self.age = self.loop.call_later(age, self._max_age)

    def _keepalive_ping(self) -> None:
        """Every keepalive time: a PING, when a call is open (or pings without calls are permitted) and
        fewer than --grpc-http2-max-pings-without-data were sent since the last answer frame (else the
        next period tries again); its ACK must come within the keepalive timeout."""
        settings = self.settings
        if self.transport is None or self.closing:
            return
        most = settings.grpc_max_pings_without_data
        if (self.streams or settings.grpc_keepalive_permit_without_calls) and (
            most <= 0 or self.pings_without_data < most
        ):
            self.pings_without_data += 1
            self.awaiting_ack = True
            self._send(frame(PING, 0, 0, KEEPALIVE_PING))
            self.keepalive = self.loop.call_later(settings.grpc_keepalive_timeout, self._keepalive_timeout)
        else:
            self.keepalive = self.loop.call_later(settings.grpc_keepalive_time, self._keepalive_ping)

    def _keepalive_timeout(self) -> None:
        """The peer did not ACK our keepalive PING in time: it is gone (GOAWAY, close; its calls end)."""
        self._fail(NO_ERROR, "keepalive watchdog timeout")

    def _ping_acked(self, payload: bytes) -> None:
        """An ACK of one of our PINGs (h2_receive.py)."""
        if payload == KEEPALIVE_PING and self.awaiting_ack:
            self.awaiting_ack = False
            self.keepalive.cancel()  # type: ignore[union-attr]  # set with awaiting_ack
            self.keepalive = self.loop.call_later(self.settings.grpc_keepalive_time, self._keepalive_ping)
        elif payload == GOAWAY_PING and self.draining:
            self._final_goaway()

    def _max_age(self) -> None:
        """The connection's maximum age: grpc-core's graceful GOAWAY. First a GOAWAY with the largest
        stream id and a PING: streams the client opened meanwhile are still ours. Once the PING's ACK is
        back (the client has seen the GOAWAY), the final GOAWAY with the last stream id; the calls in
        flight finish, then the connection closes (at the latest when the grace is over)."""
        if self.transport is None or self.closing or self.goaway_sent:
            return
        peer = self.transport.get_extra_info("peername")
        log.debug("gRPC connection from %s at its maximum age: GOAWAY", peer)
        self.draining = True
        self._send(goaway(MAX_STREAM_ID, NO_ERROR) + frame(PING, 0, 0, GOAWAY_PING))
        self.age = self.loop.call_later(GOAWAY_PING_WAIT, self._final_goaway)
        if self.settings.grpc_max_connection_age_grace > 0:
            self.grace = self.loop.call_later(self.settings.grpc_max_connection_age_grace, self._grace_over)

    def _final_goaway(self) -> None:
        if self.transport is None or self.closing or self.goaway_sent:
            return
        self.age.cancel()  # type: ignore[union-attr]  # the fallback _max_age set (draining)
        self._goaway(b"max_age")
        if not self.streams:
            self._close()

    def _grace_over(self) -> None:
        if self.transport is not None and not self.closing:
            self._fail(NO_ERROR, "max_age")

    def shutdown(self) -> None:
        """New streams are refused from now on; GOAWAY and close once the open ones are answered.
        (GOAWAY goes last: some clients, httpcore among them, fail every open stream on receiving it.)"""
        self.shutting_down = True
        if not self.streams:
            self._goaway_and_close()
