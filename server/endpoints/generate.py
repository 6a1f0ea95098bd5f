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
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
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
from tensorgate.server.endpoints.v2 import error_response, json_response, sample
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

if TYPE_CHECKING:
    from tensorgate.codec.tensor import InferRequest, InferResponse
    from tensorgate.codec.trace import Trace
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository import Repository
    from tensorgate.server.tracing.tracer import Tracer

log = logging.getLogger("tensorgate.generate")

ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


class GenerateEndpoints:
    def __init__(self, repository: Repository, tracer: Tracer, max_input_size: int = MAX_INPUT_SIZE) -> None:
        self.repository = repository
        self.tracer = tracer
        self.max_input_size = max_input_size  # --http-max-input-size

    def install(self, router: Router) -> None:
        model = "/v2/models/{model}[/versions/{version}]"
        router.add("POST", model + "/generate", self.generate, error_response)
        router.add("POST", model + "/generate_stream", self.generate_stream, error_response)

    def _request(self, request: HttpRequest) -> tuple[ModelVersion, InferRequest]:
        name, version = request.params["model"], parse_version(request.params["version"])
        found = self.repository.resolve(name, version)
        specs = {n: (spec.dtype.v2, spec.shape) for n, spec in found.inputs.items()}
        infer_request = decode_generate(request.body, name, version, specs, self.max_input_size)
        if self.tracer.on:
            infer_request.trace = sample(self.tracer, name, request.headers)
        return found, infer_request

    async def generate(self, request: HttpRequest) -> HttpResponse:
        model_version, infer_request = self._request(request)
        try:
            if model_version.stream_only:
                responses = await _collect(model_version.infer_stream(infer_request))
                if len(responses) != 1:
                    return json_response({"error": ONE_RESPONSE})  # Triton's status: its answer has begun
                response = responses[0]
            else:
                response = await model_version.infer(infer_request)
        finally:
            self.tracer.finish(infer_request.trace)
        return body_response(generate_json(response), JSON_CONTENT_TYPE)

    async def generate_stream(self, request: HttpRequest) -> HttpResponse:
        model_version, infer_request = self._request(request)
        trace = infer_request.trace
        if not model_version.streams:
            try:
                response = await model_version.infer(infer_request)
            except InferError as e:
                if e.kind is not ErrorKind.INTERNAL:  # refused before it ran
                    raise
                return _error_event(e)  # it ran and failed
            finally:
                self.tracer.finish(trace)
            return _events(_once(response))
        try:  # bad requests are refused here, before the model runs
            stream = model_version.infer_stream(infer_request)
        except BaseException:
            self.tracer.finish(trace)
            raise
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            first = None
        except InferError as e:
            await stream.aclose()
            self.tracer.finish(trace)
            return _error_event(e)
        except BaseException:
            await stream.aclose()
            self.tracer.finish(trace)
            raise
        return _events(self._rest(first, stream, trace))

    async def _rest(
        self, first: InferResponse | None, stream: AsyncIterator[InferResponse], trace: Trace | None
    ) -> AsyncIterator[InferResponse]:
        try:
            async with aclosing(stream):  # closing the events closes the model's generator
                if first is not None:
                    yield first
                async for response in stream:
                    yield response
        finally:
            self.tracer.finish(trace)


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
