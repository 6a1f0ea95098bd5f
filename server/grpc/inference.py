"""KServe v2 / Triton `inference.GRPCInferenceService`: ModelInfer and ModelStreamInfer (`InferenceFrontEnd`,
the front end's, through the engine client), and every other method (`InferenceService`, thin calls into
the repository).

ModelInfer and ModelStreamInfer take the request bytes as the transport received them (RawMessage) and
decode them with codec.v2_grpc, zero-copy; a ModelInfer answer goes out as the pieces codec.v2_grpc
encodes (the output tensors' bytes are views, not joined into one message). The other RPCs use the
generated betterproto2 messages. Errors are InferErrors mapped to gRPC status codes in codec.v2_grpc,
with the same messages as REST. ModelStreamInfer is stream_infer.py.
"""

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from time import perf_counter_ns
from typing import Any, TypeVar, cast

from grpclib import GRPCError
from grpclib.const import Cardinality, Handler, Status

import tensorgate.proto.inference as pb
from tensorgate.codec import v2_grpc, v2_grpc_request
from tensorgate.codec.errors import ErrorKind, InferError, parse_version
from tensorgate.server import __version__, header_forwarding, identity
from tensorgate.server.endpoints.repository import check_overrides
from tensorgate.server.endpoints.v2 import EXTENSIONS
from tensorgate.server.engine_client import EngineClient
from tensorgate.server.grpc.stream_infer import SHUTTING_DOWN, StreamInfer
from tensorgate.server.http.grpc_call import GrpcCall
from tensorgate.server.log_settings import LogControl
from tensorgate.server.repository import Repository
from tensorgate.server.shared_memory import CUDA, SYSTEM, SharedMemory
from tensorgate.server.statistics import model_statistics
from tensorgate.server.tracing.frontend import INFER_RESPONSE_COMPLETE, Sampler, grpc_received
from tensorgate.server.tracing.settings import changes_from_grpc
from tensorgate.server.tracing.tracer import Tracer, check_model, sample_grpc

log = logging.getLogger("tensorgate.grpc")

SERVICE = "/inference.GRPCInferenceService/"

_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


class RawMessage:
    """A message as its bytes. The transport (and grpclib's client codec) calls FromString /
    SerializeToString on a handler's message types: these keep the bytes as they are, for codec.v2_grpc to
    read and write. `parts`, when given, are the bytes to send in pieces: our transport sends them
    without joining them."""

    __slots__ = ("data", "parts")

    def __init__(self, data: bytes | memoryview = b"", parts: list | None = None) -> None:
        self.data = data
        self.parts = parts

    @classmethod
    def FromString(cls, data: bytes | memoryview) -> "RawMessage":  # noqa: N802 (grpclib's name)
        return cls(data)

    def SerializeToString(self) -> bytes | memoryview:  # noqa: N802 (grpclib's name)
        return self.data if self.parts is None else b"".join(self.parts)


def grpc_error(error: Exception, rpc_name: str) -> GRPCError:
    """InferError -> its gRPC status and message; anything unexpected -> INTERNAL, logged (call it from
    an except clause)."""
    if isinstance(error, InferError):
        return GRPCError(v2_grpc.grpc_status(error.kind), error.message)
    log.exception("unexpected error serving %s", rpc_name)
    return GRPCError(Status.INTERNAL, f"internal error serving {rpc_name}")


def rpc(method: _Method) -> _Method:
    """Errors of a generated RPC method -> gRPC statuses (see grpc_error)."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any) -> Any:
        try:
            return await method(self, *args)
        except GRPCError:
            raise
        except Exception as e:
            raise grpc_error(e, method.__name__) from None

    return cast(_Method, wrapper)  # the same signature (functools.wraps)


def _choice(value: pb.LogSettingsRequestSettingValue) -> Any:
    """The value a LogSettings setting carries (its oneof), None when it carries none."""
    if value.bool_param is not None:
        return value.bool_param
    if value.uint32_param is not None:
        return value.uint32_param
    return value.string_param


INFERS = (SERVICE + "ModelInfer", SERVICE + "ModelStreamInfer")


class InferenceService(pb.GrpcInferenceServiceBase):
    """Every method but ModelInfer and ModelStreamInfer (InferenceFrontEnd's), over the repository."""

    def __init__(
        self, repository: Repository, shared_memory: SharedMemory, logs: LogControl, tracer: Tracer
    ) -> None:
        self.repository = repository
        self.shared_memory = shared_memory
        self.logs = logs  # Triton's logging extension (LogSettings)
        self.tracer = tracer  # Triton's trace extension (TraceSetting)

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()  # (not in the comprehension: compiled, it has no super())
        return {path: handler for path, handler in mapping.items() if path not in INFERS}

    # ------------------------------------------------------------------------------- health, metadata

    @rpc
    async def server_live(self, message: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @rpc
    async def server_ready(self, message: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.repository.ready)

    @rpc
    async def model_ready(self, message: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        """As Triton's: an unknown model or version is not ready, not an error."""
        version = parse_version(message.version)
        try:
            ready = self.repository.model(message.name).is_ready(version)
        except InferError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @rpc
    async def server_metadata(self, message: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=identity.name, version=__version__, extensions=list(EXTENSIONS))

    @rpc
    async def model_metadata(self, message: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        version = parse_version(message.version)
        return v2_grpc.model_metadata(self.repository.model(message.name).metadata(version))

    @rpc
    async def model_config(self, message: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        version = parse_version(message.version)
        return v2_grpc.model_config(self.repository.model(message.name).config_of(version))

    @rpc
    async def model_statistics(self, message: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """Triton's: every model when `name` is empty, every ready version when `version` is."""
        await self.repository.gather_stats()
        doc = model_statistics(self.repository, message.name, parse_version(message.version))
        return pb.ModelStatisticsResponse(
            model_stats=[v2_grpc.model_statistics(s["name"], s["version"], s) for s in doc["model_stats"]]
        )

    # --------------------------------------------------------------------------------- repository

    @rpc
    async def repository_index(self, message: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        entries = self.repository.index(message.ready)
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponseModelIndex(e["name"], e["version"], e["state"], e["reason"])
                for e in entries
            ]
        )

    @rpc
    async def repository_model_load(
        self, message: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        for key, parameter in message.parameters.items():  # Triton's gRPC front end's checks, its texts
            expected = "string_param" if key == "config" else "bytes_param" if key.startswith("file:") else ""
            if not expected:
                raise InferError(ErrorKind.INVALID_ARGUMENT, f"unrecognized load parameter '{key}'.")
            if getattr(parameter, expected) is None:
                raise InferError(
                    ErrorKind.INVALID_ARGUMENT,
                    f"invalid value type for load parameter '{key}', expected {expected}.",
                )
        config, files = v2_grpc.repository_parameters(message.parameters)
        check_overrides(message.model_name, config, files)
        await self.repository.load_model(message.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def repository_model_unload(
        self, message: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        parameter = message.parameters.get("unload_dependents")
        dependents = parameter.bool_param if parameter is not None else None
        if parameter is not None and dependents is None:
            raise InferError(ErrorKind.INVALID_ARGUMENT, "'unload_dependents' must be a bool_param")
        await self.repository.unload_model(message.model_name, bool(dependents))
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------------------- shared memory

    @rpc
    async def system_shared_memory_status(
        self, message: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self.shared_memory.status(SYSTEM, message.name)
        status = pb.SystemSharedMemoryStatusResponseRegionStatus
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: status(**r) for r in regions})

    @rpc
    async def system_shared_memory_register(
        self, message: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.shared_memory.register_system(message.name, message.key, message.offset, message.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    async def system_shared_memory_unregister(
        self, message: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.shared_memory.unregister(SYSTEM, message.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc
    async def cuda_shared_memory_status(
        self, message: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        regions = self.shared_memory.status(CUDA, message.name)
        status = pb.CudaSharedMemoryStatusResponseRegionStatus
        return pb.CudaSharedMemoryStatusResponse(regions={r["name"]: status(**r) for r in regions})

    @rpc
    async def cuda_shared_memory_register(
        self, message: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        shm = self.shared_memory
        shm.register_cuda(message.name, message.raw_handle, message.device_id, message.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @rpc
    async def cuda_shared_memory_unregister(
        self, message: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.shared_memory.unregister(CUDA, message.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------------------------- logging, trace

    @rpc
    async def log_settings(self, message: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        if message.settings:
            self.logs.update({name: _choice(value) for name, value in message.settings.items()})
        answer = pb.LogSettingsResponseSettingValue
        settings = {}
        for name, value in self.logs.settings.as_dict().items():
            if type(value) is bool:
                settings[name] = answer(bool_param=value)
            elif type(value) is int:
                settings[name] = answer(uint32_param=value)
            else:
                settings[name] = answer(string_param=value)
        return pb.LogSettingsResponse(settings=settings)

    @rpc
    async def trace_setting(self, message: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        model = message.model_name
        if model:
            check_model(self.repository, model)
        if message.settings:
            changes = changes_from_grpc({k: list(v.value) for k, v in message.settings.items()})
            self.tracer.update(model, changes)
        answer = pb.TraceSettingResponseSettingValue
        settings = {
            name: answer(value=value if isinstance(value, list) else [value])
            for name, value in self.tracer.answer(model).items()
        }
        return pb.TraceSettingResponse(settings=settings)


class InferenceFrontEnd:
    """ModelInfer and ModelStreamInfer: the front end's, through the engine client."""

    def __init__(self, engine: EngineClient, tracer: Sampler, forward: re.Pattern | None = None) -> None:
        self.engine = engine  # inference (server/engine_client.py)
        self.tracer = tracer  # the requests it samples (Triton's trace extension)
        self.forward = forward  # --grpc-header-forward-pattern
        self._streams: set[StreamInfer] = set()  # open ModelStreamInfer calls, stopped on shutdown
        self._closing = False

    def __mapping__(self) -> dict[str, Handler]:
        raw = (RawMessage, RawMessage)
        return {
            SERVICE + "ModelInfer": Handler(self._model_infer, Cardinality.UNARY_UNARY, *raw),
            SERVICE + "ModelStreamInfer": Handler(self._model_stream_infer, Cardinality.STREAM_STREAM, *raw),
        }

    def begin_shutdown(self) -> None:
        """Open streams take no more requests: each answers those it has read, then ends UNAVAILABLE."""
        self._closing = True
        for stream in list(self._streams):
            stream.stop()

    # ---------------------------------------------------------------------------------- ModelInfer

    async def _model_infer(self, call: GrpcCall) -> None:
        message = await call.recv_message()
        try:
            request = v2_grpc_request.decode_request(message.data)
            if self.forward is not None:
                request.parameters.update(header_forwarding.from_metadata(self.forward, call.metadata))
            version = self.engine.resolve(request.model_name, parse_version(request.model_version))
            if self.tracer.on:
                request.trace = sample_grpc(self.tracer, request.model_name, call.metadata)
                if request.trace is not None:  # the call stamps its sending and finishes the trace
                    grpc_received(self.tracer, request.trace, call)
            response = await self.engine.infer(version, request)
            parts = v2_grpc.encode_response_parts(response)
            if request.trace is not None:
                request.trace.stamp_front(INFER_RESPONSE_COMPLETE, perf_counter_ns())
        except Exception as e:  # only the work: the transport answers errors of the stream itself
            raise grpc_error(e, "ModelInfer") from None
        await call.send_message(RawMessage(parts=parts))

    # ----------------------------------------------------------------------------- ModelStreamInfer

    async def _model_stream_infer(self, call: GrpcCall) -> None:
        if self._closing:
            raise GRPCError(Status.UNAVAILABLE, SHUTTING_DOWN)
        stream = StreamInfer(self.engine, call, RawMessage, self.tracer, self.forward)
        self._streams.add(stream)
        try:
            await stream.run()
        finally:
            self._streams.discard(stream)
