"""KServe v2 / Triton `inference.GRPCInferenceService`: thin calls into the Repository.

ModelInfer and ModelStreamInfer take the request bytes as the transport received them (RawMessage) and
decode them with codec.v2_grpc, zero-copy; a ModelInfer answer goes out as the pieces codec.v2_grpc
encodes (the output tensors' bytes are views, not joined into one message). The other RPCs use the
generated betterproto2 messages. Errors are
InferErrors mapped to gRPC status codes in codec.v2_grpc, with the same messages as REST.

ModelStreamInfer reads requests while earlier ones run (up to STREAM_WINDOW in flight per stream) and
answers in request order: one response per request, or one per yield of a model with `execute_stream`.
An error answers its request with `error_message` and the stream goes on. With the request parameter
`triton_enable_empty_final_response: true`, as Triton has it for decoupled models, each answer carries
the parameter `triton_final_response`, true on the last one (after a streaming model's yields, an answer
with no outputs).
"""

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from grpclib import GRPCError
from grpclib.const import Cardinality, Handler, Status
from grpclib.server import Stream

import proto.inference as pb
from codec import v2_grpc
from codec.errors import ErrorKind, InferError
from codec.tensor import InferResponse
from server import __version__
from server.endpoints.v2 import EXTENSIONS
from server.http import eager
from server.repository import Repository
from server.statistics import model_statistics

log = logging.getLogger("tensorgate.grpc")

SERVICE = "/inference.GRPCInferenceService/"
STREAM_WINDOW = 64  # requests of one ModelStreamInfer stream read ahead of their answers
FINAL_FLAG = "triton_final_response"
ENABLE_FINAL = "triton_enable_empty_final_response"


class RawMessage:
    """A message as its bytes. The transport (and grpclib's client codec) calls FromString /
    SerializeToString on a handler's message types: these keep the bytes as they are, for codec.v2_grpc to
    read and write. `parts` are the bytes to send, in pieces; our transport sends them without joining."""

    __slots__ = ("data", "parts")

    def __init__(self, data: bytes | memoryview = b"", parts: list | None = None) -> None:
        self.data = data
        self.parts = [data] if parts is None else parts

    @classmethod
    def FromString(cls, data: bytes | memoryview) -> "RawMessage":  # noqa: N802 (grpclib's name)
        return cls(data)

    def SerializeToString(self) -> bytes:  # noqa: N802 (grpclib's name)
        return self.data if len(self.parts) == 1 else b"".join(self.parts)


def _grpc_error(error: Exception, rpc_name: str) -> GRPCError:
    """InferError -> its gRPC status and message; anything unexpected -> INTERNAL, logged (call it from
    an except clause)."""
    if isinstance(error, InferError):
        return GRPCError(v2_grpc.grpc_status(error.kind), error.message)
    log.exception("unexpected error serving %s", rpc_name)
    return GRPCError(Status.INTERNAL, f"internal error serving {rpc_name}")


def rpc(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Errors of a generated RPC method -> gRPC statuses (see _grpc_error)."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any) -> Any:
        try:
            return await method(self, *args)
        except GRPCError:
            raise
        except Exception as e:
            raise _grpc_error(e, method.__name__) from None

    return wrapper


def _unimplemented(what: str) -> GRPCError:
    return GRPCError(Status.UNIMPLEMENTED, f"{what} is not supported by this server")


class InferenceService(pb.GrpcInferenceServiceBase):
    def __init__(self, repository: Repository) -> None:
        self.repository = repository
        self._readers: set[asyncio.Task] = set()  # ModelStreamInfer readers, stopped on shutdown
        self._closing = False

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        raw = (RawMessage, RawMessage)
        mapping[SERVICE + "ModelInfer"] = Handler(self._model_infer, Cardinality.UNARY_UNARY, *raw)
        mapping[SERVICE + "ModelStreamInfer"] = Handler(
            self._model_stream_infer, Cardinality.STREAM_STREAM, *raw
        )
        return mapping

    def begin_shutdown(self) -> None:
        """Open streams take no more requests: each answers those it has read, then ends UNAVAILABLE."""
        self._closing = True
        for reader in self._readers:
            reader.cancel()

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
        try:
            ready = self.repository.model(message.name).is_ready(message.version)
        except InferError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @rpc
    async def server_metadata(self, message: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="tensorgate", version=__version__, extensions=list(EXTENSIONS))

    @rpc
    async def model_metadata(self, message: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        return v2_grpc.model_metadata(self.repository.model(message.name).metadata(message.version))

    @rpc
    async def model_config(self, message: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        return v2_grpc.model_config(self.repository.model(message.name).config_of(message.version))

    @rpc
    async def model_statistics(self, message: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """Triton's: every model when `name` is empty, every ready version when `version` is."""
        doc = model_statistics(self.repository, message.name, message.version)
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
        config, files = v2_grpc.repository_parameters(message.parameters)
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

    # ------------------------------------------------------------------- what this server does not do

    async def system_shared_memory_status(self, message: Any) -> Any:
        raise _unimplemented("system shared memory")

    async def system_shared_memory_register(self, message: Any) -> Any:
        raise _unimplemented("system shared memory")

    async def system_shared_memory_unregister(self, message: Any) -> Any:
        raise _unimplemented("system shared memory")

    async def cuda_shared_memory_status(self, message: Any) -> Any:
        raise _unimplemented("CUDA shared memory")

    async def cuda_shared_memory_register(self, message: Any) -> Any:
        raise _unimplemented("CUDA shared memory")

    async def cuda_shared_memory_unregister(self, message: Any) -> Any:
        raise _unimplemented("CUDA shared memory")

    async def trace_setting(self, message: Any) -> Any:
        raise _unimplemented("TraceSetting")

    async def log_settings(self, message: Any) -> Any:
        raise _unimplemented("LogSettings")

    # ---------------------------------------------------------------------------------- ModelInfer

    async def _model_infer(self, stream: Stream) -> None:
        message = await stream.recv_message()
        try:
            request = v2_grpc.decode_request(message.data)
            version = self.repository.resolve(request.model_name, request.model_version)
            parts = v2_grpc.encode_response_parts(await version.infer(request))
        except Exception as e:  # only the work: the transport answers errors of the stream itself
            raise _grpc_error(e, "ModelInfer") from None
        await stream.send_message(RawMessage(parts=parts))

    # ----------------------------------------------------------------------------- ModelStreamInfer

    async def _model_stream_infer(self, stream: Stream) -> None:
        pending: asyncio.Queue = asyncio.Queue()
        window = asyncio.Semaphore(STREAM_WINDOW)
        reader = asyncio.create_task(self._read_stream(stream, pending, window))
        self._readers.add(reader)
        try:
            while True:
                item = await pending.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                await self._answer(stream, item)
                window.release()
        finally:
            self._readers.discard(reader)
            reader.cancel()
            while not pending.empty():
                item = pending.get_nowait()
                if isinstance(item, _Pending):
                    await item.discard()

    async def _read_stream(self, stream: Stream, pending: asyncio.Queue, window: asyncio.Semaphore) -> None:
        """Reads requests and queues each one's answer in the making; the last item is an _End."""
        try:
            if self._closing:
                raise asyncio.CancelledError
            while True:
                await window.acquire()
                message = await stream.recv_message()
                if message is None:
                    pending.put_nowait(_End())
                    return
                pending.put_nowait(self._start(message.data))
        except asyncio.CancelledError:  # the server is shutting down (or the call ended, no one reads on)
            shutting_down = GRPCError(
                Status.UNAVAILABLE, "the server is shutting down: this stream takes no more requests"
            )
            pending.put_nowait(_End(shutting_down))
        except GRPCError as e:  # a message over the size limit: the call ends with its status
            pending.put_nowait(_End(e))
        except Exception as e:
            log.exception("unexpected error reading a ModelStreamInfer stream")
            pending.put_nowait(_End(GRPCError(Status.INTERNAL, f"internal error reading the stream: {e}")))

    def _start(self, data: bytes) -> "_Pending":
        """Starts one request of the stream: a task for a plain infer, an iterator (started when its turn
        to answer comes) for a streaming model, or the error that answers it."""
        request_id = None
        try:
            request = v2_grpc.decode_request(data)
            request_id = request.id
            final = request.parameters.pop(ENABLE_FINAL, False) is True
            version = self.repository.resolve(request.model_name, request.model_version)
            if version.streams:
                return _Pending(request_id, final, iterator=version.infer_stream(request))
            # Run at once: a model executed inline answers without a task made for it.
            answer = eager.future(version.infer(request), asyncio.get_running_loop())
            return _Pending(request_id, final, task=answer)
        except InferError as e:
            return _Pending(request_id, False, error=e.message)
        except Exception:
            log.exception("unexpected error starting a ModelStreamInfer request")
            return _Pending(request_id, False, error="internal error serving ModelStreamInfer")

    async def _answer(self, stream: Stream, item: "_Pending") -> None:
        if item.iterator is None:  # one answer: no generator to run it through
            await stream.send_message(RawMessage(await _one_answer(item)))
            return
        async with aclosing(_streamed_answers(item)) as answers:
            async for body in answers:
                await stream.send_message(RawMessage(body))


async def _one_answer(item: "_Pending") -> bytes:
    """The ModelStreamInferResponse answering a request of a stream with one answer, or its error_message."""
    if item.error is not None:
        return v2_grpc.encode_stream_error(item.error, item.request_id)
    try:
        response = await item.task
    except Exception as e:
        return v2_grpc.encode_stream_error(_message_of(e), item.request_id)
    if item.final:
        response.parameters[FINAL_FLAG] = True
    return v2_grpc.encode_stream_response(v2_grpc.encode_response(response))


async def _streamed_answers(item: "_Pending") -> AsyncIterator[bytes]:
    """The ModelStreamInferResponse messages answering a request to a streaming model: one per yield, an
    empty final one when asked for, or an error_message after the answers already given."""
    try:
        async with aclosing(item.iterator) as responses:
            async for response in responses:
                if item.final:
                    response.parameters[FINAL_FLAG] = False
                yield v2_grpc.encode_stream_response(v2_grpc.encode_response(response))
        if item.final:
            yield _final_response(item.request_id)
    except Exception as e:
        yield v2_grpc.encode_stream_error(_message_of(e), item.request_id)


def _message_of(error: Exception) -> str:
    """An InferError's message (a model's failure among them, server/model.py); anything else is logged
    (call it from an except clause)."""
    if isinstance(error, InferError):
        return error.message
    log.exception("unexpected error answering a ModelStreamInfer request")
    return "internal error serving ModelStreamInfer"


def _final_response(request_id: str | None) -> bytes:
    empty = InferResponse("", "", [], request_id, {FINAL_FLAG: True})
    return v2_grpc.encode_stream_response(v2_grpc.encode_response(empty))


class _End:
    __slots__ = ("error",)

    def __init__(self, error: GRPCError | None = None) -> None:
        self.error = error


class _Pending:
    """One stream request on its way to its answer(s)."""

    __slots__ = ("request_id", "final", "task", "iterator", "error")

    def __init__(
        self,
        request_id: str | None,
        final: bool,
        *,
        task: asyncio.Future | None = None,
        iterator: AsyncIterator | None = None,
        error: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.final = final
        self.task = task
        self.iterator = iterator
        self.error = error

    async def discard(self) -> None:
        if self.task is not None:
            if self.task.done() and not self.task.cancelled():
                self.task.exception()  # retrieved: no "exception was never retrieved" warning
            self.task.cancel()
        if self.iterator is not None:
            await self.iterator.aclose()  # type: ignore[attr-defined]
