"""KServe v2 REST endpoints: infer (`V2Inference`, the front end's, through the engine client), and health,
server and model metadata, model config, statistics, and Triton's system and CUDA shared-memory extensions
(`V2Endpoints`, over the repository)."""

from __future__ import annotations

import asyncio
import functools
import re
from time import perf_counter_ns
from typing import TYPE_CHECKING

import orjson

from tensorgate.codec import v2_http
from tensorgate.codec.errors import InferError, http_status, invalid, parse_version
from tensorgate.codec.v2_http import HEADER_LENGTH_BYTES, decode_request, encode_response, parse_header_length
from tensorgate.server import __version__, header_forwarding, identity
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response
from tensorgate.server.shared_memory import CUDA, SYSTEM, decode_handle
from tensorgate.server.statistics import model_statistics
from tensorgate.server.tracing.frontend import INFER_RESPONSE_COMPLETE, http_received

if TYPE_CHECKING:
    from tensorgate.codec.tensor import InferRequest
    from tensorgate.codec.trace import Trace
    from tensorgate.server.engine_client import EngineClient
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository import Repository
    from tensorgate.server.shared_memory import SharedMemory
    from tensorgate.server.tracing.frontend import Sampler

MODEL = "/v2/models/{model}[/versions/{version}]"

# Server metadata's extensions: exactly those implemented, in Triton's words and order (core server.cc).
EXTENSIONS = [
    "classification",
    "sequence",  # Triton's sequence extension: sequence_id, sequence_start, sequence_end
    "sequence(string_id)",  # sequence_id may be a string
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
    "generate",  # Triton's own metadata leaves it out; the extension's name in its docs
]


def json_response(doc: object, status: int = 200) -> HttpResponse:
    return body_response(orjson.dumps(doc), v2_http.JSON_CONTENT_TYPE, status)


def error_response(error: InferError) -> HttpResponse:
    return json_response({"error": error.message}, http_status(error))


def sample(tracer: Sampler, model: str, headers: dict[bytes, bytes]) -> Trace | None:
    """The trace of a request when the tracer takes it; in OpenTelemetry mode its W3C trace context
    headers (the parent of its trace) go with it."""
    if tracer.otel is None:
        return tracer.sample(model)
    return tracer.sample(model, headers.get(b"traceparent"), headers.get(b"tracestate"))


class V2Inference:
    """v2 infer, decoded and answered in the front end (server/engine_client.py)."""

    def __init__(
        self,
        engine: EngineClient,
        tracer: Sampler,
        forward: re.Pattern | None = None,
        max_input_size: int = v2_http.MAX_INPUT_SIZE,
    ) -> None:
        self.engine = engine
        self.tracer = tracer  # Triton's trace extension: `on` while any request may be traced
        self.forward = forward  # --http-header-forward-pattern
        self.max_input_size = max_input_size  # --http-max-input-size

    def install(self, router: Router) -> None:
        router.add("POST", MODEL + "/infer", self.infer, error_response)

    async def infer(self, request: HttpRequest) -> HttpResponse:
        params, body = request.params, request.body
        name, version = params["model"], parse_version(params["version"])
        model_version = self.engine.resolve(name, version)
        header_length = parse_header_length(request.headers.get(HEADER_LENGTH_BYTES), len(body))
        infer_request = decode_request(body, header_length, name, version, self.max_input_size)
        if self.forward is not None:
            infer_request.parameters.update(header_forwarding.from_headers(self.forward, request.headers))
        if self.tracer.on:
            infer_request.trace = sample(self.tracer, name, request.headers)
            if infer_request.trace is not None:
                return await self._infer_traced(model_version, infer_request, request)
        response = await self.engine.infer(model_version, infer_request)
        headers, chunks = encode_response(response, infer_request)
        return HttpResponse(200, headers, chunks)

    async def _infer_traced(
        self, model_version: ModelVersion, infer_request: InferRequest, request: HttpRequest
    ) -> HttpResponse:
        trace = infer_request.trace
        assert trace is not None  # infer checked it
        # our transports stamp the answer's sending (its error's too) and then finish the trace
        handed = http_received(self.tracer, trace, request)
        try:
            response = await self.engine.infer(model_version, infer_request)
        except asyncio.CancelledError:
            self.tracer.finish(trace)  # the client left: no answer goes out
            raise
        finally:
            if not handed:
                self.tracer.finish(trace)
        headers, chunks = encode_response(response, infer_request)
        trace.stamp_front(INFER_RESPONSE_COMPLETE, perf_counter_ns())
        return HttpResponse(200, headers, chunks)


class V2Endpoints:
    """Health, metadata, configuration, statistics and the shared-memory registry, over the repository."""

    def __init__(self, repository: Repository, shared_memory: SharedMemory) -> None:
        self.repository = repository
        self.shared_memory = shared_memory

    def install(self, router: Router) -> None:
        for method, template, handler in (
            ("GET", "/v2", self.server_metadata),
            ("GET", "/v2/health/live", self.live),
            ("GET", "/v2/health/ready", self.ready),
            # before the model routes: /v2/models/stats is the statistics of all models, as in Triton
            ("GET", "/v2/models[/{model}[/versions/{version}]]/stats", self.model_stats),
            ("GET", MODEL, self.model_metadata),
            ("GET", MODEL + "/ready", self.model_ready),
            ("GET", MODEL + "/config", self.model_config),
        ):
            router.add(method, template, handler, error_response)
        for kind in (SYSTEM, CUDA):
            base = f"/v2/{kind}sharedmemory"
            for method, template, region_handler in (
                ("GET", base + "[/region/{name}]/status", self.shm_status),
                ("POST", base + "/region/{name}/register", self.shm_register),
                ("POST", base + "[/region/{name}]/unregister", self.shm_unregister),
            ):
                router.add(method, template, functools.partial(region_handler, kind), error_response)

    async def server_metadata(self, request: HttpRequest) -> HttpResponse:
        return json_response({"name": identity.name, "version": __version__, "extensions": EXTENSIONS})

    async def live(self, request: HttpRequest) -> HttpResponse:
        return json_response({"live": True})

    async def ready(self, request: HttpRequest) -> HttpResponse:
        ready = self.repository.ready
        return json_response({"ready": ready}, 200 if ready else 400)

    async def model_ready(self, request: HttpRequest) -> HttpResponse:
        name, version = request.params["model"], parse_version(request.params["version"])
        ready = self.repository.model(name).is_ready(version)
        return json_response({"name": name, "ready": ready}, 200 if ready else 400)

    async def model_metadata(self, request: HttpRequest) -> HttpResponse:
        version = parse_version(request.params["version"])
        return json_response(self.repository.model(request.params["model"]).metadata(version))

    async def model_config(self, request: HttpRequest) -> HttpResponse:
        version = parse_version(request.params["version"])
        return json_response(self.repository.model(request.params["model"]).config_of(version))

    async def model_stats(self, request: HttpRequest) -> HttpResponse:
        version = parse_version(request.params["version"])
        await self.repository.gather_stats()
        return json_response(model_statistics(self.repository, request.params["model"], version))

    # ------------------------------------------------------------------------------- shared memory

    async def shm_status(self, kind: str, request: HttpRequest) -> HttpResponse:
        return json_response(self.shared_memory.status(kind, request.params["name"]))

    async def shm_register(self, kind: str, request: HttpRequest) -> HttpResponse:
        body = _json_object(request.body, f"{kind} shared memory register request")
        name = request.params["name"]
        if kind == SYSTEM:
            key = body.get("key")
            if not isinstance(key, str):
                raise invalid("system shared memory register request needs a string 'key'")
            # register_* check offset and byte_size as the JSON has them (shared_memory._check_sizes)
            self.shared_memory.register_system(name, key, body.get("offset", 0), body.get("byte_size"))  # type: ignore[arg-type]
        else:
            handle = decode_handle(body.get("raw_handle"))
            device_id = body.get("device_id", 0)
            if type(device_id) is not int or device_id < 0:
                raise invalid("cuda shared memory register request needs a non-negative integer 'device_id'")
            self.shared_memory.register_cuda(name, handle, device_id, body.get("byte_size"))  # type: ignore[arg-type]
        return body_response(b"", v2_http.JSON_CONTENT_TYPE)

    async def shm_unregister(self, kind: str, request: HttpRequest) -> HttpResponse:
        self.shared_memory.unregister(kind, request.params["name"])
        return body_response(b"", v2_http.JSON_CONTENT_TYPE)


def _json_object(body: bytes | memoryview, what: str) -> dict:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise invalid(f"{what}: the body is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise invalid(f"{what}: the body must be a JSON object")
    return doc
