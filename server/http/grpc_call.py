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

While tracing is on (frontend.Timing) a call reads the clock when it opens and when a request message is
in: a traced ModelInfer's GRPC_WAITREAD_START and GRPC_WAITREAD_END. A call its handler traced (`answer`)
stamps GRPC_SEND_START at its first message (else at its status) and GRPC_SEND_END once its status is
out, then its trace is written (server/tracing/frontend.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, Any, cast

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from tensorgate.server import restricted
from tensorgate.server.http import hpack_encode
from tensorgate.server.http.grpc_wire import (
    ACCEPT_ENCODING,
    CONTENT_TYPE,
    ENCODINGS,
    MessageReader,
    compress,
    content_subtype,
    decompress,
    encoding_for_level,
    is_grpc,
    metadata,
    parse_timeout,
    prefix,
    status_fields,
    too_large,
)
from tensorgate.server.http.h2_frames import NO_ERROR, StreamReset
from tensorgate.server.tracing.frontend import Answer, Timing

if TYPE_CHECKING:
    from tensorgate.server.http.h2 import H2Connection
    from tensorgate.server.http.h2_frames import Stream

log = logging.getLogger("tensorgate.grpc")

# The calls --grpc-infer-response-compression-level compresses the answers of (as Triton: its infer handlers)
INFER_PATHS = frozenset(
    ("/inference.GRPCInferenceService/ModelInfer", "/inference.GRPCInferenceService/ModelStreamInfer")
)
NO_REQUEST = "the call ended without its request message"
SMALL_MESSAGE = 16 << 10  # messages up to this go out as one DATA frame with no task, when they fit

ANSWER_HEAD = [(b"content-type", CONTENT_TYPE), (b"grpc-accept-encoding", ACCEPT_ENCODING)]
_HEAD_BLOCKS = {
    encoding: hpack_encode.encode(200, ANSWER_HEAD + ([(b"grpc-encoding", encoding)] if encoding else []))
    for encoding in (None, *ENCODINGS)
}
_OK_TRAILERS = hpack_encode.encode(None, status_fields(Status.OK, None))


class GrpcServices:
    """Every method of the servicers (betterproto2 service bases, or anything with grpclib's
    `__mapping__`), by path; the message size limit; what shutdown tells the services. What opens an
    HTTP/2 stream as a call (connection.CallOpener): a POST with content-type application/grpc.

    With `forward` (a front-end worker's, server/frontend.py), a method no servicer here has is answered
    by the handler `forward(path)` gives (the engine's, its messages relayed whole)."""

    def __init__(
        self,
        servicers: list[Any],
        max_message_bytes: int,
        restrictions: restricted.Restrictions | None = None,
        forward: Callable[[str], Handler] | None = None,
    ) -> None:
        self.servicers = servicers
        self.forward = forward
        self.handlers: dict[str, Handler] = {}
        for servicer in servicers:
            self.handlers.update(servicer.__mapping__())
        self.max_message_bytes = max_message_bytes
        # --grpc-restricted-protocol: method path -> (its metadata key and value, the refusal's text)
        self.restricted: dict[str, tuple[bytes, bytes, str]] = {}
        for path, group in restricted.GRPC_GROUPS.items():
            if restrictions and group in restrictions:
                key, value = restrictions[group]
                text = restricted.grpc_message(key)
                self.restricted[path] = (key.lower().encode("latin-1"), value.encode(), text)
        # "inference.GRPCInferenceService", ...: what reflection lists and health knows
        self.names = sorted({path.split("/")[1] for path in self.handlers})

    def open(self, connection: H2Connection, stream: Stream) -> GrpcCall | None:
        if stream.method != "POST" or not is_grpc(stream.headers.get(b"content-type")):
            return None
        call = GrpcCall(connection, stream, self)
        call.task = connection.loop.create_task(call.run())
        return call

    def handler(self, path: str) -> Handler | None:
        """The method `path` names; None when it is not served (UNIMPLEMENTED)."""
        found = self.handlers.get(path)
        if found is None and self.forward is not None:
            return self.forward(path)
        return found

    def begin_shutdown(self) -> None:
        for servicer in self.servicers:
            if hasattr(servicer, "begin_shutdown"):
                servicer.begin_shutdown()


class GrpcCall:
    __slots__ = (
        "connection",
        "stream",
        "handler",
        "restriction",
        "max_bytes",
        "reader",
        "messages",
        "queued",
        "received",
        "ended",
        "failure",
        "waiter",
        "consumer",
        "held",
        "told_end",
        "headers_sent",
        "encoding",
        "answer_encoding",
        "metadata",
        "task",
        "started",
        "read",
        "answer",
    )

    def __init__(self, connection: H2Connection, stream: Stream, services: GrpcServices) -> None:
        self.connection = connection
        self.stream = stream
        self.handler = services.handler(stream.path)
        self.restriction = services.restricted.get(stream.path) if services.restricted else None
        self.max_bytes = services.max_message_bytes
        self.reader = MessageReader(self.max_bytes)
        self.messages: collections.deque[tuple[bool, bytes | memoryview]] = collections.deque()
        self.queued = 0  # bytes of messages in, not yet read by the handler: kept out of the window
        self.received = 0  # messages the handler has read
        self.ended = False  # the client has sent END_STREAM
        # The input broke here: what follows is dropped unread; the handler reads the messages before it,
        # then gets this error (its call ends with that status).
        self.failure: GRPCError | None = None
        self.waiter: asyncio.Future | None = None
        self.consumer: tuple[Callable[[Any], bool], Callable[[GRPCError | None], None]] | None = None
        self.held = False  # the consumer wants no more messages for now
        self.told_end = False
        self.headers_sent = False
        self.encoding: bytes | None = None  # the request's grpc-encoding
        self.answer_encoding: bytes | None = None  # the answer's: the request's, or the compression level's
        self.metadata: dict[str, str | bytes] = {}
        self.task: asyncio.Task | None = None  # the handler's
        self.started = monotonic() if Timing.on else 0.0  # opened (time.monotonic(), while timed)
        self.read = 0.0  # its last request message in (while timed)
        self.answer: Answer | None = None  # set by a handler that traces the call

    # ------------------------------------------------------------------------------ from the connection
    # (h2_frames.StreamHandler)

    def data_in(self, data: memoryview) -> None:
        if self.failure is not None:
            return
        found: list[tuple[bool, bytes | memoryview]] = []
        try:
            self.reader.feed(data, found)
        except GRPCError as e:
            self.failure = e
        for message in found:
            self.messages.append(message)
            self.queued += 5 + len(message[1])
        if self.started and found:
            self.read = monotonic()
        if self.stream.remote_open:
            self.connection.credit(self.stream, self.queued)
        self._wake()

    def end_in(self) -> None:
        self.ended = True
        if self.reader.partial and self.failure is None:
            self.failure = GRPCError(Status.INTERNAL, "the request stream ended inside a message")
        self._wake()

    def reset(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def sweep(self, now: float) -> None:
        pass  # a call may idle as long as it lasts (its deadline is its own)

    def _wake(self) -> None:
        if self.consumer is not None:
            self._deliver()
        elif self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # ------------------------------------------------------------------------------ a consumer's side

    def consume(self, on_message: Callable[[Any], bool], on_end: Callable[[GRPCError | None], None]) -> None:
        """Instead of recv_message: from now on each message is handed to `on_message` (as the method's
        request type) as it arrives, in the transport's read callback, with no task to wake. While it
        returns False the rest is held (unread, so out of the client's window) until `resume()`.
        `on_end` hears once that the input ended: None, or the error it broke with."""
        self.consumer = (on_message, on_end)
        self._deliver()

    def hold(self) -> None:
        self.held = True

    def resume(self) -> None:
        self.held = False
        if self.consumer is not None:
            self._deliver()

    def _deliver(self) -> None:
        on_message, on_end = self.consumer  # type: ignore[misc]  # its callers checked it
        taken = False
        while self.messages and not self.held:
            try:
                message = self._take()
            except GRPCError as e:
                self.failure = e
                self.messages.clear()
                self.queued = 0
                break
            taken = True
            if not on_message(message):
                self.held = True
        if taken and self.stream.remote_open:
            self.connection.credit(self.stream, self.queued)
        if not self.messages and not self.told_end and (self.ended or self.failure is not None):
            self.told_end = True
            on_end(self.failure)

    def _take(self) -> Any:
        """The next message, decoded as the method's request type."""
        compressed, data = self.messages.popleft()
        self.queued -= 5 + len(data)
        self.received += 1
        if compressed:
            data = decompress(self.encoding, data, self.max_bytes)
        try:
            return self.handler.request_type.FromString(data)  # type: ignore[union-attr]  # _start checked it
        except Exception as e:
            message = f"the request is not a valid {cast(Handler, self.handler).request_type.__name__}: {e}"
            raise GRPCError(Status.INTERNAL, message) from None

    # ------------------------------------------------------------------------------ the handler's side

    async def recv_message(self) -> Any:
        """The next request message, decoded as the method's request type; None after the last."""
        while not self.messages:
            if self.failure is not None:
                raise self.failure
            if self.ended:
                if self.received == 0 and not cast(Handler, self.handler).cardinality.value.client_streaming:
                    raise GRPCError(Status.INTERNAL, NO_REQUEST)
                return None
            self.waiter = self.connection.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        message = self._take()
        if self.stream.remote_open:
            self.connection.credit(self.stream, self.queued)
        return message

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
        if self.answer is not None:
            self.answer.sending()
        head, parts, size = self._framed(message)
        connection, stream = self.connection, self.stream
        if size <= SMALL_MESSAGE and connection.send_now(stream, b"".join((head, *parts)), False):
            return  # the usual message: one DATA frame joined to this loop pass's writes
        await connection.send_data(stream, memoryview(head), False)
        for part in parts:
            await connection.send_data(stream, memoryview(part).cast("B"), False)

    def _framed(self, message: Any) -> tuple[bytes, list, int]:
        """The message's prefix, its pieces (compressed if the call is), and its size after the prefix."""
        parts = getattr(message, "parts", None)
        if parts is None:
            parts = [message.SerializeToString()]
        size = len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        if size > self.max_bytes:
            raise too_large("response", size, self.max_bytes)
        encoding = self.answer_encoding
        if encoding is not None:
            parts = [compress(encoding, b"".join(parts))]
            size = len(parts[0])
        if self.stream.reset:
            raise StreamReset
        if not self.headers_sent:
            self.headers_sent = True
            self.connection.send_headers(self.stream, _HEAD_BLOCKS[encoding])
        return prefix(encoding is not None, size), parts, size

    # ------------------------------------------------------------------------------ the call's life

    def _start(self) -> tuple[Any, float | None]:
        """The handler and the deadline's seconds, from the request head; a GRPCError when it cannot run."""
        headers = self.stream.headers
        if self.handler is None:
            raise GRPCError(Status.UNIMPLEMENTED, f"method {self.stream.path} is not served here")
        if self.restriction is not None and headers.get(self.restriction[0]) != self.restriction[1]:
            raise GRPCError(Status.UNAVAILABLE, self.restriction[2])
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
            self.encoding = self.answer_encoding = encoding
        level = self.connection.settings.grpc_infer_compression_level
        if level != "none" and self.stream.path in INFER_PATHS:
            self.answer_encoding = encoding_for_level(level, headers.get(b"grpc-accept-encoding"))
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
        except (StreamReset, asyncio.CancelledError):
            # The stream is gone (reset() cancels this task): nothing to answer. Ending here rather than
            # cancelled leaves no CancelledError whose frames and the task would hold each other.
            if self.answer is not None:
                self.answer.dropped()
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
            self.consumer = None
        answer = self.answer
        if answer is None:
            self._finish(status, message)
        else:
            answer.sending()
            self._finish(status, message)
            answer.sent()

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
        connection.send_headers(stream, block, end=True)
        if stream.remote_open:  # a client still sending is told to stop, as grpc-core servers do
            connection.reset(stream, NO_ERROR)
        connection.close(stream)
