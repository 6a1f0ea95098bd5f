"""Triton's front-end timestamps for traced requests (its http_server.cc and grpc/infer_handler.cc): when
the front end received a request and when it sent the answer, in the request's own trace.

- REST (our HTTP/1.1 and HTTP/2 transports, the ASGI adapter): HTTP_RECV_START (the request's first bytes
  read), HTTP_RECV_END (its last), INFER_RESPONSE_COMPLETE (the answer encoded), HTTP_SEND_START and
  HTTP_SEND_END (around the transport handing the answer to the socket).
- gRPC ModelInfer: GRPC_WAITREAD_START (the call opened), GRPC_WAITREAD_END (its request message in),
  INFER_RESPONSE_COMPLETE, GRPC_SEND_START and GRPC_SEND_END (the answer and its status).

An endpoint decides whether a request is traced once its model is known (Tracer.sample), after the
request was received, so the transports keep when they received each one, in time.monotonic() seconds
(CLOCK_MONOTONIC, the clock of the other timestamps): HTTP/1.1 in the readings it takes anyway for its
timeouts; HTTP/2 and gRPC only while `Timing.on`. A traced request's endpoint stamps them and hands its
trace to the transport as an `Answer`; the transport stamps the send and finishes the trace (it is
written) once the answer is out, or finishes it unsent when the client left.
"""

from __future__ import annotations

from collections.abc import Awaitable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Protocol

from tensorgate.server.router import HttpRequest

if TYPE_CHECKING:
    from tensorgate.codec.trace import Trace

# Triton's names (http_server.cc, grpc/infer_handler.cc)
HTTP_RECV_START, HTTP_RECV_END = "HTTP_RECV_START", "HTTP_RECV_END"
HTTP_SEND_START, HTTP_SEND_END = "HTTP_SEND_START", "HTTP_SEND_END"
GRPC_WAITREAD_START, GRPC_WAITREAD_END = "GRPC_WAITREAD_START", "GRPC_WAITREAD_END"
GRPC_SEND_START, GRPC_SEND_END = "GRPC_SEND_START", "GRPC_SEND_END"
INFER_RESPONSE_COMPLETE = "INFER_RESPONSE_COMPLETE"  # the answer encoded for its protocol


class Timing:
    """Whether the HTTP/2 and gRPC transports read the clock for what they receive: while the process's
    tracer may trace (Tracer sets it). With tracing off they take no reading for it."""

    on = False


class TimedRequest(HttpRequest):
    """An HttpRequest as our transports hand it to the router: when it was received (time.monotonic()
    seconds; 0.0 when not timed) and, once its endpoint traced it, the Answer that finishes its trace."""

    __slots__ = ("started", "received", "answer")
    started: float
    received: float
    answer: Answer | None


class TimedCall(Protocol):
    """What a gRPC call keeps for its trace (server/http/grpc_call.py GrpcCall)."""

    started: float
    read: float
    answer: Answer | None


def ns(seconds: float) -> int:
    """time.monotonic() seconds -> the trace's nanoseconds (perf_counter_ns: the same clock)."""
    return round(seconds * 1e9)


class Sampler(Protocol):
    """The tracer as a front end's inference endpoints see it: the server's Tracer (server/tracing/tracer.py)
    in one process, a worker's WorkerTracer (server/frontend.py), whose engine samples."""

    on: bool  # while any request may be traced
    otel: Any  # the OpenTelemetry settings in that mode (a request's traceparent is read), else None

    def sample(self, model: str, traceparent: Any = None, tracestate: Any = None) -> Trace | None: ...

    def finish(self, trace: Trace | None) -> None: ...


class Answer:
    """A traced request's trace until its answer is out: its transport stamps the sending and finishes
    the trace (`sent`), or finishes it unsent (`dropped`: the client left, the answer failed)."""

    __slots__ = ("tracer", "trace", "start_name", "end_name", "start_ns")

    def __init__(self, tracer: Sampler, trace: Trace, start_name: str, end_name: str) -> None:
        self.tracer = tracer
        self.trace = trace
        self.start_name = start_name
        self.end_name = end_name
        self.start_ns = 0

    def sending(self) -> None:
        """The answer starts going out (the first call counts)."""
        if not self.start_ns:
            self.start_ns = perf_counter_ns()

    def sent(self) -> None:
        self.sending()
        self.trace.stamp_front(self.start_name, self.start_ns)
        self.trace.stamp_front(self.end_name, perf_counter_ns())
        self.tracer.finish(self.trace)

    def dropped(self) -> None:
        self.tracer.finish(self.trace)


def http_received(tracer: Sampler, trace: Trace, request: HttpRequest) -> bool:
    """A traced REST request: its receipt stamped (HTTP_RECV_START, HTTP_RECV_END) and its trace handed
    to its transport, which finishes it. False for a request no transport of ours received (one a
    worker forwarded to the engine): its endpoint finishes the trace."""
    if not isinstance(request, TimedRequest):
        return False
    if request.started:
        trace.stamp_front(HTTP_RECV_START, ns(request.started))
        trace.stamp_front(HTTP_RECV_END, ns(request.received))
    request.answer = Answer(tracer, trace, HTTP_SEND_START, HTTP_SEND_END)
    return True


def grpc_received(tracer: Sampler, trace: Trace, call: TimedCall) -> None:
    """A traced ModelInfer call: its receipt stamped (GRPC_WAITREAD_START, GRPC_WAITREAD_END) and its
    trace handed to the call, which finishes it once its status is out."""
    if call.started and call.read:
        trace.stamp_front(GRPC_WAITREAD_START, ns(call.started))
        trace.stamp_front(GRPC_WAITREAD_END, ns(call.read))
    call.answer = Answer(tracer, trace, GRPC_SEND_START, GRPC_SEND_END)


async def send_timed(answer: Answer, sending: Awaitable[None]) -> None:
    """Awaits a transport sending a traced request's answer, stamped around; the trace is then finished."""
    answer.sending()
    try:
        await sending
    except BaseException:
        answer.dropped()
        raise
    answer.sent()
