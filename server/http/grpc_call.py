"""gRPC calls on our HTTP/2 streams: the table of methods every service offers, and one call's life.

A request whose content-type is application/grpc (h2_receive.py) becomes a `GrpcCall`, started as soon
as its HEADERS are in: a stream's messages reach the handler one by one as their DATA frames come. To
the handler the call is what grpclib's server Stream is (`recv_message`, `send_message`, async
iteration, `metadata`), so the generated betterproto2 service bases serve unchanged.

Flow control both ways: a message the handler has not read yet keeps its bytes out of the stream's
receive window (a client sending faster than the handler reads is stopped by its window, not buffered),
and `send_message` waits for the client's window (a slow reader slows the producer).

The call ends with its status in trailers (or, before any message, in a trailers-only answer). A
`grpc-timeout` cancels the handler (DEADLINE_EXCEEDED), and so does a client's RST_STREAM; a cancelled
handler's request leaves the batcher's queue (batcher/dynamic.py). A message that breaks the stream's
framing or size limit is refused at its prefix: the handler reads the messages before it, then gets the
error as its status; the connection lives on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from server.http import hpack_encode
from server.http.grpc_wire import (
    ACCEPT_ENCODING,
    CONTENT_TYPE,
    ENCODINGS,
    MessageReader,
    compress,
    content_subtype,
    decompress,
    metadata,
    parse_timeout,
    prefix,
    status_fields,
    too_large,
)
from server.http.h2_frames import DATA, END_STREAM, SMALL_DATA, StreamReset, frame_head

if TYPE_CHECKING:
    from server.http.h2 import H2Connection
    from server.http.h2_frames import Stream

log = logging.getLogger("tensorgate.grpc")

ANSWER_HEAD = [(b"content-type", CONTENT_TYPE), (b"grpc-accept-encoding", ACCEPT_ENCODING)]
_HEAD_BLOCKS = {
    encoding: hpack_encode.encode(200, ANSWER_HEAD + ([(b"grpc-encoding", encoding)] if encoding else []))
    for encoding in (None, *ENCODINGS)
}
_OK_TRAILERS = hpack_encode.encode(None, status_fields(Status.OK, None))


class GrpcServices:
    """Every method of the servicers (betterproto2 service bases, or anything with grpclib's
    `__mapping__`), by path; the message size limit; what shutdown tells the services."""

    def __init__(self, servicers: list[Any], max_message_bytes: int) -> None:
        self.servicers = servicers
        self.handlers: dict[str, Handler] = {}
        for servicer in servicers:
            self.handlers.update(servicer.__mapping__())
        self.max_message_bytes = max_message_bytes
        # "inference.GRPCInferenceService", ...: what reflection lists and health knows
        self.names = sorted({path.split("/")[1] for path in self.handlers})

    def begin_shutdown(self) -> None:
        for servicer in self.servicers:
            if hasattr(servicer, "begin_shutdown"):
                servicer.begin_shutdown()


class GrpcCall:
    __slots__ = (
        "connection",
        "stream",
        "handler",
        "max_bytes",
        "reader",
        "messages",
        "queued",
        "received",
        "ended",
        "failure",
        "waiter",
        "headers_sent",
        "encoding",
        "metadata",
    )

    def __init__(self, connection: H2Connection, stream: Stream, services: GrpcServices) -> None:
        self.connection = connection
        self.stream = stream
        self.handler = services.handlers.get(stream.path)
        self.max_bytes = services.max_message_bytes
        self.reader = MessageReader(self.max_bytes)
        self.messages: collections.deque[tuple[bool, bytes | memoryview]] = collections.deque()
        self.queued = 0  # bytes of messages in, not yet read by the handler: kept out of the window
        self.received = 0  # messages the handler has read
        self.ended = False  # the client has sent END_STREAM
        self.failure: GRPCError | None = None  # the input broke here: reading past it raises this
        self.waiter: asyncio.Future | None = None
        self.headers_sent = False
        self.encoding: bytes | None = None  # the request's grpc-encoding, and so the answer's
        self.metadata: dict[str, str | bytes] = {}

    # ------------------------------------------------------------------------------ from the connection

    def data_in(self, data: memoryview) -> None:
        if self.failure is not None:
            return
        try:
            for message in self.reader.feed(data):
                self.messages.append(message)
                self.queued += 5 + len(message[1])
        except GRPCError as e:
            return self.fail(e)
        self._wake()

    def end_in(self) -> None:
        self.ended = True
        if self.reader.partial:
            return self.fail(GRPCError(Status.INTERNAL, "the request stream ended inside a message"))
        self._wake()

    def fail(self, error: GRPCError) -> None:
        """The stream's input is unusable from here: what follows is dropped unread; the handler reads the
        messages before it, then gets `error` (its call ends with that status)."""
        if self.failure is None:
            self.failure = error
            self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # ------------------------------------------------------------------------------ the handler's side

    async def recv_message(self) -> Any:
        """The next request message, decoded as the method's request type; None after the last."""
        while not self.messages:
            if self.failure is not None:
                raise self.failure
            if self.ended:
                if self.received == 0 and not self.handler.cardinality.value.client_streaming:
                    raise GRPCError(Status.INTERNAL, "the call ended without its request message")
                return None
            self.waiter = self.connection.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        compressed, data = self.messages.popleft()
        self.queued -= 5 + len(data)
        self.received += 1
        if self.stream.remote_open:
            self.connection.grpc_credit(self.stream, self.queued)
        if compressed:
            data = decompress(self.encoding, data, self.max_bytes)
        try:
            return self.handler.request_type.FromString(data)
        except Exception as e:
            message = f"the request is not a valid {self.handler.request_type.__name__}: {e}"
            raise GRPCError(Status.INTERNAL, message) from None

    def __aiter__(self) -> GrpcCall:
        return self

    async def __anext__(self) -> Any:
        message = await self.recv_message()
        if message is None:
            raise StopAsyncIteration
        return message

    async def send_message(self, message: Any) -> None:
        """Sends a message: its SerializeToString(), or its `parts` (bytes-like pieces, sent as they are:
        a large tensor is not copied into one message)."""
        parts = getattr(message, "parts", None)
        if parts is None:
            parts = [message.SerializeToString()]
        size = sum(len(part) for part in parts)
        if size > self.max_bytes:
            raise too_large("response", size, self.max_bytes)
        if self.encoding is not None:
            parts = [compress(self.encoding, b"".join(parts))]
            size = len(parts[0])
        connection, stream = self.connection, self.stream
        if stream.reset:
            raise StreamReset
        if not self.headers_sent:
            self.headers_sent = stream.sending = True
            connection.sending += 1
            connection._write(connection._block_frames(stream.id, _HEAD_BLOCKS[self.encoding], 0))
        head = prefix(self.encoding is not None, size)
        size += 5
        if (
            size <= SMALL_DATA
            and size <= stream.send_window
            and size <= connection.send_window
            and connection.writable.is_set()
        ):  # the usual message: one DATA frame, joined to this loop pass's writes
            stream.send_window -= size
            connection.send_window -= size
            connection._write(b"".join((frame_head(DATA, 0, stream.id, size), head, *parts)))
            return
        await connection._send_data(stream, memoryview(head), False)
        for part in parts:
            await connection._send_data(stream, memoryview(part).cast("B"), False)

    # ------------------------------------------------------------------------------ the call's life

    def _start(self) -> tuple[Any, float | None]:
        """The handler and the deadline's seconds, from the request head; a GRPCError when it cannot run."""
        headers = self.stream.headers
        if self.handler is None:
            raise GRPCError(Status.UNIMPLEMENTED, f"method {self.stream.path} is not served here")
        subtype = content_subtype(headers[b"content-type"])
        if subtype not in (b"", b"proto"):
            raise GRPCError(
                Status.UNIMPLEMENTED,
                f"content-type application/grpc+{subtype.decode('latin-1')}: this server's messages are "
                "protobuf (application/grpc or application/grpc+proto)",
            )
        encoding = headers.get(b"grpc-encoding", b"identity")
        if encoding != b"identity":
            if encoding not in ENCODINGS:
                raise GRPCError(
                    Status.UNIMPLEMENTED,
                    f"grpc-encoding {encoding.decode('latin-1')} is not supported "
                    f"(grpc-accept-encoding: {ACCEPT_ENCODING.decode()})",
                )
            self.encoding = encoding
        try:
            self.metadata = metadata(headers)
            timeout = headers.get(b"grpc-timeout")
            return self.handler.func, parse_timeout(timeout) if timeout is not None else None
        except ValueError as e:  # a malformed timeout, or -bin metadata that is not base64
            raise GRPCError(Status.INTERNAL, f"malformed request metadata: {e}") from None

    async def run(self) -> None:
        seconds = None
        try:
            handler, seconds = self._start()
            if seconds is None:
                await handler(self)
            else:
                async with asyncio.timeout(seconds) as deadline:
                    await handler(self)
            status, message = Status.OK, None
        except GRPCError as e:
            status, message = e.status, e.message
        except StreamReset:
            return
        except TimeoutError:
            if seconds is None or not deadline.expired():
                log.exception("unexpected timeout serving %s", self.stream.path)
                status, message = Status.INTERNAL, f"internal error serving {self.stream.path}"
            else:
                status, message = Status.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except Exception:
            log.exception("unexpected error serving %s", self.stream.path)
            status, message = Status.INTERNAL, f"internal error serving {self.stream.path}"
        finally:
            if self.stream.sending:
                self.connection.sending -= 1
                self.stream.sending = False
        self._finish(status, message)

    def _finish(self, status: Status, message: str | None) -> None:
        """Trailers with the status (HEADERS, END_STREAM); before any message, a trailers-only answer."""
        connection, stream = self.connection, self.stream
        if stream.reset or connection.transport is None:
            return
        if status is Status.OK and self.headers_sent:
            block = _OK_TRAILERS
        elif self.headers_sent:
            block = hpack_encode.encode(None, status_fields(status, message))
        else:
            block = hpack_encode.encode(200, ANSWER_HEAD + status_fields(status, message))
        connection._write(connection._block_frames(stream.id, block, END_STREAM))
        connection.grpc_done(stream)
