"""ModelStreamInfer (KServe v2 / Triton's bidirectional stream): one `StreamInfer` per call.

Requests start as their messages arrive, handed over by the transport in its read callback
(GrpcCall.consume), and one answering task sends their answers in request order: one per request, or
one per yield of a model with `execute_stream`. No task per request and no queue between a reading and
an answering task: on the 2-core VM a streamed `simple` request went from ~22 to ~20 us of server CPU
(bench.grpc_bench). Answers are sent from the task rather than from the read callback, which measured
~4 us a message slower. Up to STREAM_WINDOW requests run ahead of their answers; past that the call
holds the rest unread, and the client's flow-control window stops it.

An error answers its request with `error_message` and the stream goes on. As in Triton, every answer
carries the parameter `triton_final_response`: true on a request's one answer, false on each yield of a
streaming model, and, with the request parameter `triton_enable_empty_final_response: true` (as
Triton's clients send it for decoupled models), true on an answer with no outputs after the last yield.
Triton's C++ client takes an answer without it as final. At shutdown a stream takes no more requests,
answers those it has, and ends UNAVAILABLE.

A traced request's trace gets Triton's stream timestamps (its stream_infer_handler.cc): GRPC_WAITREAD_START
(the stream began waiting for its message: the call opened, or the message before it was in) and
GRPC_WAITREAD_END (its message in), INFER_RESPONSE_COMPLETE (its first answer encoded), GRPC_SEND_START
and GRPC_SEND_END around each of its answers' sending; it is written once answered. The call reads the
clock for what it receives only while tracing is on (server/tracing/frontend.py Timing).
"""

import asyncio
import collections
import logging
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from time import perf_counter_ns
from typing import Any

from grpclib import GRPCError
from grpclib.const import Status

from tensorgate.codec import v2_grpc, v2_grpc_request
from tensorgate.codec.errors import InferError, parse_version
from tensorgate.codec.tensor import InferResponse
from tensorgate.codec.trace import Trace
from tensorgate.server import header_forwarding
from tensorgate.server.engine_client import EngineClient
from tensorgate.server.http import eager
from tensorgate.server.http.grpc_call import GrpcCall
from tensorgate.server.tracing.frontend import (
    GRPC_SEND_END,
    GRPC_SEND_START,
    GRPC_WAITREAD_END,
    GRPC_WAITREAD_START,
    INFER_RESPONSE_COMPLETE,
    Sampler,
    ns,
)
from tensorgate.server.tracing.tracer import sample_grpc

log = logging.getLogger("tensorgate.grpc")

STREAM_WINDOW = 64  # requests of one stream started ahead of their answers
FINAL_FLAG = "triton_final_response"
ENABLE_FINAL = "triton_enable_empty_final_response"
SHUTTING_DOWN = "the server is shutting down: this stream takes no more requests"


class StreamInfer:
    def __init__(
        self,
        engine: EngineClient,
        call: GrpcCall,
        raw_message: type,
        tracer: Sampler,
        forward: re.Pattern | None = None,
    ) -> None:
        self.forward = forward  # --grpc-header-forward-pattern: the call's metadata into each request
        self.engine = engine
        self.tracer = tracer  # a request it samples is finished once answered
        self.call = call
        self.raw_message = raw_message  # the handler's message type: bytes to send
        self.pending: collections.deque[_Pending] = collections.deque()  # started, not yet answered
        self.answering: asyncio.Task | None = None
        self.ended = False  # no more requests are taken
        self.end_error: GRPCError | None = None  # the status the call ends with, once answered
        # while the call is timed (tracing on): when the stream began waiting for the next message
        self.waiting = call.started
        # Kept: asyncio.get_running_loop() costs a getpid() system call a time on Python 3.11.
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()  # the call's end: None, or its error

    async def run(self) -> None:
        self.call.consume(self._message, self._end)
        try:
            error = await self.done
        finally:
            if self.answering is not None:
                self.answering.cancel()
            self.ended = True
            while self.pending:
                item = self.pending.popleft()
                await item.discard()
                self.tracer.finish(item.trace)
        if error is not None:
            raise error

    def stop(self) -> None:
        """Shutdown: no more requests; those started are answered, then the call ends UNAVAILABLE."""
        self.call.hold()
        self._end(GRPCError(Status.UNAVAILABLE, SHUTTING_DOWN))

    def _message(self, message: Any) -> bool:
        """A request as it arrives: started, its answer queued. False: hold the rest."""
        if self.ended:
            return False
        since = self.waiting
        if since:  # timed: the next message's wait begins as this one is in
            self.waiting = self.call.read
        self.pending.append(self._start(message.data, since))
        if self.answering is None:
            self.answering = self.loop.create_task(self._answer_pending())
        return len(self.pending) < STREAM_WINDOW

    def _end(self, error: GRPCError | None) -> None:
        """No more requests (the client's END_STREAM, a broken input, shutdown): once those started are
        answered, the call ends, with `error` as its status if any."""
        if self.ended:
            return
        self.ended = True
        self.end_error = error
        if self.answering is None and not self.done.done():
            self.done.set_result(error)

    async def _answer_pending(self) -> None:
        try:
            while self.pending:
                item = self.pending[0]
                if item.response is not None or item.error is not None:  # the usual: known already
                    if item.trace is None:
                        await self.call.send_message(self.raw_message(item.answer()))
                    else:
                        await self._send_traced(item, item.answer(), True)
                else:
                    await self._answer(item)
                self.pending.popleft()
                if item.trace is not None:
                    self.tracer.finish(item.trace)
                if self.call.held:
                    self.call.resume()  # may start more requests, queued behind those here
        except Exception as e:  # StreamReset, or a bug: the call ends with it
            if not self.done.done():
                self.done.set_exception(e)
            return
        self.answering = None
        if self.ended and not self.done.done():
            self.done.set_result(self.end_error)

    async def _send_traced(self, item: "_Pending", body: bytes, first: bool) -> None:
        """One answer of a traced request, its sending stamped (its first answer's encoding too)."""
        trace = item.trace
        now = perf_counter_ns()
        if first:
            trace.stamp_front(INFER_RESPONSE_COMPLETE, now)  # type: ignore[union-attr]  # traced
        trace.stamp_front(GRPC_SEND_START, now)  # type: ignore[union-attr]
        await self.call.send_message(self.raw_message(body))
        trace.stamp_front(GRPC_SEND_END, perf_counter_ns())  # type: ignore[union-attr]

    def _start(self, data: bytes, since: float = 0.0) -> "_Pending":
        """Starts one request: its answer in the making (a future for a plain infer, already done when
        the model ran inline), an iterator (started when its turn to answer comes) for a streaming model,
        or the error that answers it."""
        request_id = None
        try:
            request = v2_grpc_request.decode_request(data)
            request_id = request.id
            if self.forward is not None:
                request.parameters.update(header_forwarding.from_metadata(self.forward, self.call.metadata))
            final = request.parameters.pop(ENABLE_FINAL, False) is True
            version = self.engine.resolve(request.model_name, parse_version(request.model_version))
            if self.tracer.on:
                request.trace = sample_grpc(self.tracer, request.model_name, self.call.metadata)
                if request.trace is not None and since:
                    request.trace.stamp_front(GRPC_WAITREAD_START, ns(since))
                    request.trace.stamp_front(GRPC_WAITREAD_END, ns(self.call.read))
            if version.streams:
                iterator = self.engine.infer_stream(version, request)
                return _Pending(request_id, final, iterator=iterator, trace=request.trace)
            running = self.engine.infer(version, request)
            finished, outcome = eager.step(running, self.loop)
            if finished:  # a model executed inline: no task, no future
                return _Pending(request_id, final, response=outcome, trace=request.trace)
            return _Pending(request_id, final, task=outcome, trace=request.trace)
        except InferError as e:
            return _Pending(request_id, False, error=e.message)
        except Exception:
            log.exception("unexpected error starting a ModelStreamInfer request")
            return _Pending(request_id, False, error="internal error serving ModelStreamInfer")

    async def _answer(self, item: "_Pending") -> None:
        if item.iterator is None:
            if item.task is not None and not item.task.done():
                await asyncio.wait((item.task,))
            if item.trace is None:
                await self.call.send_message(self.raw_message(item.answer()))  # rarely waits
            else:
                await self._send_traced(item, item.answer(), True)
            return
        first = True
        async with aclosing(_streamed_answers(item)) as answers:
            async for body in answers:
                if item.trace is None:
                    await self.call.send_message(self.raw_message(body))
                else:
                    await self._send_traced(item, body, first)
                    first = False


async def _streamed_answers(item: "_Pending") -> AsyncIterator[bytes]:
    """The ModelStreamInferResponse messages answering a request to a streaming model: one per yield, an
    empty final one when asked for, or an error_message after the answers already given."""
    try:
        async with aclosing(item.iterator) as responses:
            async for response in responses:
                response.parameters[FINAL_FLAG] = False
                yield v2_grpc.encode_stream_response(v2_grpc.encode_response(response))
        if item.final:
            empty = InferResponse("", "", [], item.request_id, {FINAL_FLAG: True})
            yield v2_grpc.encode_stream_response(v2_grpc.encode_response(empty))
    except Exception as e:
        yield v2_grpc.encode_stream_error(_message_of(e), item.request_id)


def _message_of(error: BaseException) -> str:
    """An InferError's message (a model's failure among them, server/model.py); anything else is logged."""
    if isinstance(error, InferError):
        return error.message
    log.error("unexpected error answering a ModelStreamInfer request", exc_info=error)
    return "internal error serving ModelStreamInfer"


class _Pending:
    """One stream request on its way to its answer(s)."""

    __slots__ = ("request_id", "final", "response", "task", "iterator", "error", "trace")

    def __init__(
        self,
        request_id: str | None,
        final: bool,
        *,
        response: InferResponse | None = None,
        task: asyncio.Task | None = None,
        iterator: AsyncIterator | None = None,
        error: str | None = None,
        trace: Trace | None = None,
    ) -> None:
        self.request_id = request_id
        self.final = final
        self.response = response  # the answer, when the model answered at once
        self.task = task
        self.iterator = iterator
        self.error = error
        self.trace = trace  # finished (written) once the request is answered

    def answer(self) -> bytes:
        """The ModelStreamInferResponse of a request with one answer, once known: the answer, or its
        error_message."""
        if self.error is not None:
            return v2_grpc.encode_stream_error(self.error, self.request_id)
        response = self.response
        if response is None:
            if self.task.cancelled():
                return v2_grpc.encode_stream_error("the request was cancelled", self.request_id)
            error = self.task.exception()
            if error is not None:
                return v2_grpc.encode_stream_error(_message_of(error), self.request_id)
            response = self.task.result()
        response.parameters[FINAL_FLAG] = True
        return v2_grpc.encode_stream_response(v2_grpc.encode_response(response))

    async def discard(self) -> None:
        if self.task is not None:
            if self.task.done() and not self.task.cancelled():
                self.task.exception()  # retrieved: no "exception was never retrieved" warning
            self.task.cancel()
        if self.iterator is not None:
            await self.iterator.aclose()  # type: ignore[attr-defined]
