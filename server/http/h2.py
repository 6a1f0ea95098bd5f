"""HTTP/2 (RFC 9113) as our own frame layer. No `h2` state machine: its ~75 us a request was most of the
cost. Here, the connection: its read buffer cut into frames, its streams, the answers it writes and its
lifecycle; what each frame read does is h2_receive.py, the frame vocabulary h2_frames.py, HPACK
hpack_decode.py and hpack_encode.py.

One connection: a BufferedProtocol whose read buffer holds whole frames; frames are handled in order
as they complete, and the control frames they call for (SETTINGS ACK, PING ACK, WINDOW_UPDATE,
RST_STREAM) are written once per read. Each request runs as a task when its stream ends; its answer
goes out as HEADERS and DATA frames within the peer's flow-control windows and frame size. A request
with content-type application/grpc, on a port that serves gRPC, is a gRPC call instead: it starts with
its HEADERS and its messages reach it as they come (grpc_call.py).

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
from typing import TYPE_CHECKING

from server.http import hpack_encode
from server.http.grpc_call import GrpcCall
from server.http.h2_frames import (
    BULK_READ,
    CLOSED_KEPT,
    CONNECTION_SPECIFIC,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    DIRECT_READ,
    END_HEADERS,
    END_STREAM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    GOAWAY_DELAY,
    HEADERS,
    INTERNAL_ERROR,
    LINGER_SECONDS,
    NO_ERROR,
    OUR_CONNECTION_WINDOW,
    OUR_MAX_FRAME,
    OUR_STREAM_WINDOW,
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
    settings_payload,
)
from server.http.h2_receive import FrameReceiver
from server.http.hpack_decode import Decoder
from server.http.listener import BaseConnection
from server.router import HttpRequest, HttpResponse, stalled_body

if TYPE_CHECKING:
    from server.http.listener import ConnectionHost

log = logging.getLogger("tensorgate.http")


class H2Connection(FrameReceiver, BaseConnection):
    def __init__(self, host: ConnectionHost) -> None:
        super().__init__(host)
        self.router = host.router
        self.grpc = host.grpc  # GrpcServices on ports that serve gRPC, else None
        self.buffer = bytearray(READ_BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.filled = False  # the last read filled the read buffer
        self.direct: memoryview | None = None  # where the socket reads the rest of a large DATA frame
        self.direct_frame: tuple[Stream, int, int] | None = None  # (stream, bytes left, flags)
        self.preface = True
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
        self.recv_window = OUR_CONNECTION_WINDOW
        self.goaway_sent = False
        self.shutting_down = False
        self.closing = False
        self.since = self.loop.time()
        self.budget_second = 0.0
        self.resets = 0
        self.control_frames = 0
        self.answer_writes = 0  # this second's writes of answer frames (HEADERS, DATA, trailers)
        self.last_ping = float("-inf")
        self.ping_strikes = 0

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

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
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

    def _answer_early(self, stream: Stream, response: HttpResponse) -> None:
        """An answer from the head (or a body past the limit) while the body may still come: sent now.
        What the client still sends is read and dropped until it ends the stream; a stream still open
        LINGER_SECONDS later is reset with NO_ERROR (RFC 9113 8.1). Resetting at once is what the RFC
        allows, but clients such as httpx then fail the request they are still sending."""
        stream.answered = self.loop.time()
        self._answered(1)
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
            await self._respond(stream, response)
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

    # ------------------------------------------------------------------------------ gRPC calls

    def _start_grpc(self, stream: Stream) -> None:
        """A gRPC call starts with its HEADERS; its messages follow it as they come (grpc_call.py)."""
        stream.grpc = GrpcCall(self, stream, self.grpc)
        stream.task = self.loop.create_task(stream.grpc.run())
        if not stream.remote_open:
            stream.grpc.end_in()

    def grpc_credit(self, stream: Stream, queued: int) -> None:
        """Gives the client back the window of what the call has read (`queued` bytes are still unread)."""
        owed = OUR_STREAM_WINDOW - stream.recv_window - queued
        if owed >= OUR_STREAM_WINDOW // 2 or (owed > 0 and stream.recv_window < OUR_STREAM_WINDOW // 2):
            stream.recv_window += owed
            self._send(frame(WINDOW_UPDATE, 0, stream.id, owed.to_bytes(4, "big")))

    def grpc_done(self, stream: Stream) -> None:
        """The call's trailers are out. A client still sending is told to stop (RST_STREAM NO_ERROR, as
        grpc-core servers do); what it sent meanwhile is dropped."""
        if stream.remote_open:
            self._reset(stream.id, NO_ERROR)
        self._close_stream(stream)

    # ------------------------------------------------------------------------------ frames out

    def _head_frames(self, stream_id: int, response: HttpResponse, method: str, last: bool) -> bytes:
        headers = [(n, v) for n, v in response.headers if n not in CONNECTION_SPECIFIC]
        block = hpack_encode.encode(response.status, headers)
        return self._block_frames(stream_id, block, END_STREAM if last else 0)

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
            self._write(self._block_frames(stream.id, block, END_STREAM))

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
            self._answered(len(pieces) // 2)
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
        """Queues frames of an answer (see BaseConnection._send)."""
        if self.transport is None:
            raise StreamReset
        self._answered(1)
        self._send(data)

    def _answered(self, writes: int) -> None:
        """Frames of answers went out: they forgive PINGs (as grpc-core servers do) and allow the control
        frames a client sends as it reads them (h2_receive.py, _calm)."""
        self.answer_writes += writes
        self.ping_strikes = 0
        self.last_ping = float("-inf")

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
                stream.remote_open
                and not stream.answered
                and stream.grpc is None  # a gRPC stream may idle as long as its call lasts
                and now - stream.since > self.settings.body_timeout
            ):
                # A body the app awaits whole that stopped coming.
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
            self._goaway_and_close()
