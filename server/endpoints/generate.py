"""Triton's generate extension over REST: POST /v2/models/{m}[/versions/{v}]/generate (one JSON answer) and
/generate_stream (Server-Sent Events, one `data:` event per answer). The mapping of requests and answers
is codec/generate.py.

- A model that streams (a decoupled Triton model, or ours with only `execute_stream`) answers
  /generate once or fails: Triton's 'generate expects model to produce exactly 1 response', with
  Triton's status for it, 200 (its answer has begun when it finds out). A model with a plain execute
  answers /generate_stream with one event.
- A request refused before the model runs (bad JSON, an unknown model, a wrong input) is the usual JSON
  error with its status. Once the model runs, /generate_stream answers in events, as Triton does: a
  failure as the first answer is an error event (`data: {"error": ...}`) sent with the error's status;
  after an answer, an error event ends the stream, its status already sent as 200.
- A client that goes away cancels its request: a queued one leaves its queue, a streaming model's
  generator is closed (the transport closes the event stream, which closes it).
- A traced request gets Triton's front-end timestamps (server/tracing/frontend.py): /generate as an
  infer; /generate_stream a pair of send timestamps per event, as Triton's (TimedEvents).
- With --workers a worker serves both itself (they are the front end's, server/assembly.py), its model
  in the engine. There, a streaming
  model's request that decodes but that the engine refuses before the model runs is an error event,
  not the JSON error: the worker cannot tell that refusal from a failure as the first answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from time import perf_counter_ns
from typing import TYPE_CHECKING

from tensorgate.codec.errors import ErrorKind, InferError, http_status, parse_version
from tensorgate.codec.generate import (
    JSON_CONTENT_TYPE,
    SSE_CONTENT_TYPE,
    decode_generate,
    generate_json,
    sse,
    sse_error,
)
from tensorgate.codec.v2_http import MAX_INPUT_SIZE
from tensorgate.server.endpoints.v2 import MODEL, error_response, json_response, sample
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response
from tensorgate.server.tracing.frontend import (
    HTTP_SEND_END,
    HTTP_SEND_START,
    INFER_RESPONSE_COMPLETE,
    http_received,
)

if TYPE_CHECKING:
    from tensorgate.codec.tensor import InferRequest, InferResponse
    from tensorgate.codec.trace import Trace
    from tensorgate.server.engine_client import EngineClient
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.tracing.frontend import Sampler

log = logging.getLogger("tensorgate.generate")

ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


class GenerateEndpoints:
    def __init__(self, engine: EngineClient, tracer: Sampler, max_input_size: int = MAX_INPUT_SIZE) -> None:
        self.engine = engine
        self.tracer = tracer
        self.max_input_size = max_input_size  # --http-max-input-size

    def install(self, router: Router) -> None:
        router.add("POST", MODEL + "/generate", self.generate, error_response)
        router.add("POST", MODEL + "/generate_stream", self.generate_stream, error_response)

    def _request(self, request: HttpRequest) -> tuple[ModelVersion, InferRequest]:
        name, version = request.params["model"], parse_version(request.params["version"])
        found = self.engine.resolve(name, version)
        specs = {n: (spec.dtype.v2, spec.shape) for n, spec in found.inputs.items()}
        infer_request = decode_generate(request.body, name, version, specs, self.max_input_size)
        if self.tracer.on:
            infer_request.trace = sample(self.tracer, name, request.headers)
        return found, infer_request

    async def generate(self, request: HttpRequest) -> HttpResponse:
        model_version, infer_request = self._request(request)
        trace = infer_request.trace
        # a traced request's transport stamps its answer's sending (its error's too), then finishes it
        handed = trace is not None and http_received(self.tracer, trace, request)
        try:
            if model_version.stream_only:
                responses = await _collect(self.engine.infer_stream(model_version, infer_request))
                if len(responses) != 1:
                    return json_response({"error": ONE_RESPONSE})  # Triton's status: its answer has begun
                response = responses[0]
            else:
                response = await self.engine.infer(model_version, infer_request)
        except asyncio.CancelledError:
            self.tracer.finish(trace)  # the client left: no answer goes out
            raise
        finally:
            if not handed:
                self.tracer.finish(trace)
        body = generate_json(response)
        if trace is not None:
            trace.stamp_front(INFER_RESPONSE_COMPLETE, perf_counter_ns())
        return body_response(body, JSON_CONTENT_TYPE)

    async def generate_stream(self, request: HttpRequest) -> HttpResponse:
        model_version, infer_request = self._request(request)
        trace = infer_request.trace
        if trace is None:
            return await _answer_stream(self.engine, model_version, infer_request)
        # an error's answer: its transport stamps the sending and finishes the trace
        handed = http_received(self.tracer, trace, request)
        try:
            response = await _answer_stream(self.engine, model_version, infer_request)
        except asyncio.CancelledError:
            self.tracer.finish(trace)
            raise
        except BaseException:
            if not handed:
                self.tracer.finish(trace)
            raise
        if isinstance(response.chunks, list):  # an error event
            if not handed:
                self.tracer.finish(trace)
            return response
        # events: each one stamped as it goes out (Triton's stamps of a streamed answer), the trace
        # finished when the stream ends
        if handed:
            request.answer = None  # type: ignore[attr-defined]  # a TimedRequest (http_received)
        response.chunks = TimedEvents(response.chunks, self.tracer, trace, handed)  # type: ignore[arg-type]
        return response


async def _answer_stream(
    engine: EngineClient, model_version: ModelVersion, infer_request: InferRequest
) -> HttpResponse:
    """The answer of /generate_stream: its events, or a first failure's error event."""
    if not model_version.streams:
        try:
            response = await engine.infer(model_version, infer_request)
        except InferError as e:
            if e.kind is not ErrorKind.INTERNAL:  # refused before it ran
                raise
            return _error_event(e)  # it ran and failed
        return _events(_once(response))
    stream = engine.infer_stream(model_version, infer_request)  # a bad request is refused here
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = None
    except InferError as e:
        await stream.aclose()
        return _error_event(e)
    except BaseException:
        await stream.aclose()
        raise
    return _events(_rest(first, stream))


async def _rest(
    first: InferResponse | None, stream: AsyncIterator[InferResponse]
) -> AsyncIterator[InferResponse]:
    async with aclosing(stream):  # closing the events closes the model's generator
        if first is not None:
            yield first
        async for response in stream:
            yield response


class TimedEvents:
    """A traced request's events. Triton's generate_stream stamps each answer of the model as it goes
    out: INFER_RESPONSE_COMPLETE (encoded), HTTP_SEND_START and HTTP_SEND_END (around its chunk's
    sending, here from the event handed to the transport to its asking for the next), when `stamping`
    (a request our transport received). Closing it (the transports always do) finishes the trace."""

    def __init__(self, events: AsyncIterator[bytes], tracer: Sampler, trace: Trace, stamping: bool) -> None:
        self.events = events
        self.tracer = tracer
        self.trace = trace
        self.stamping = stamping
        self.sending = False  # an event was handed out: its sending ends at the next call

    def __aiter__(self) -> TimedEvents:
        return self

    async def __anext__(self) -> bytes:
        trace = self.trace
        if self.sending:
            self.sending = False
            trace.stamp_front(HTTP_SEND_END, perf_counter_ns())
        event = await anext(self.events)
        if self.stamping:
            now = perf_counter_ns()
            trace.stamp_front(INFER_RESPONSE_COMPLETE, now)
            trace.stamp_front(HTTP_SEND_START, now)
            self.sending = True
        return event

    async def aclose(self) -> None:
        try:
            await self.events.aclose()  # type: ignore[attr-defined]  # _sse: an async generator
        finally:
            self.tracer.finish(self.trace)


def _events(responses: AsyncIterator[InferResponse]) -> HttpResponse:
    return HttpResponse(200, [(b"content-type", SSE_CONTENT_TYPE)], _sse(responses))


def _error_event(error: InferError) -> HttpResponse:
    """A failure as a stream's first answer: Triton's error event, sent with the error's status."""
    return body_response(sse_error(error), SSE_CONTENT_TYPE, http_status(error))


async def _sse(responses: AsyncIterator[InferResponse]) -> AsyncIterator[bytes]:
    """One event per answer; a failure ends the stream with an error event."""
    async with aclosing(responses):
        try:
            async for response in responses:
                yield sse(generate_json(response))
        except InferError as e:
            yield sse_error(e)
        except Exception:
            log.exception("unexpected error streaming a generate answer")
            yield sse_error(InferError(ErrorKind.INTERNAL, "internal error streaming the answer"))


async def _once(response: InferResponse) -> AsyncIterator[InferResponse]:
    yield response


async def _collect(stream: AsyncIterator[InferResponse]) -> list[InferResponse]:
    async with aclosing(stream):
        return [response async for response in stream]
