"""Every RPC of both services through three clients (grpclib, grpcio sync, grpcio aio) on both ports (the
gRPC port, and the HTTP port, where HTTP/2 requests with content-type application/grpc are gRPC calls):
each answers what grpclib on the gRPC port answers, whose answers the other gRPC tests check in detail."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from e2e_helpers import ServerProcess
from grpc_helpers import simple_request, text_request
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality

import proto.grps.protos.v1 as grps
import proto.inference as pb

pytestmark = pytest.mark.ours

V2 = "/inference.GRPCInferenceService/"
GRPS = "/grps.protos.v1.GrpsService/"
UNARY, SERVER_STREAM, BIDI = "unary", "server-stream", "bidi"
# (path, request, response type, kind); answers of `statistics` change between calls: compared by shape.
CALLS: list[tuple[str, Any, type, str]] = [
    (V2 + "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse, UNARY),
    (V2 + "ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, UNARY),
    (V2 + "ModelReady", pb.ModelReadyRequest(name="simple"), pb.ModelReadyResponse, UNARY),
    (V2 + "ServerMetadata", pb.ServerMetadataRequest(), pb.ServerMetadataResponse, UNARY),
    (V2 + "ModelMetadata", pb.ModelMetadataRequest(name="simple"), pb.ModelMetadataResponse, UNARY),
    (V2 + "ModelInfer", simple_request(), pb.ModelInferResponse, UNARY),
    (V2 + "ModelInfer", simple_request(model_name="nowhere"), pb.ModelInferResponse, UNARY),
    (V2 + "ModelStreamInfer", simple_request(), pb.ModelStreamInferResponse, BIDI),
    (V2 + "ModelStreamInfer", text_request("one two three"), pb.ModelStreamInferResponse, BIDI),
    (V2 + "ModelConfig", pb.ModelConfigRequest(name="simple"), pb.ModelConfigResponse, UNARY),
    (V2 + "ModelStatistics", pb.ModelStatisticsRequest(name="simple"), pb.ModelStatisticsResponse, UNARY),
    (V2 + "RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse, UNARY),
    (
        V2 + "RepositoryModelLoad",
        pb.RepositoryModelLoadRequest(model_name="simple"),
        pb.RepositoryModelLoadResponse,
        UNARY,
    ),
    (
        V2 + "RepositoryModelUnload",
        pb.RepositoryModelUnloadRequest(model_name="simple"),
        pb.RepositoryModelUnloadResponse,
        UNARY,
    ),
    (
        V2 + "SystemSharedMemoryStatus",
        pb.SystemSharedMemoryStatusRequest(),
        pb.SystemSharedMemoryStatusResponse,
        UNARY,
    ),
    (
        V2 + "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(name="r"),
        pb.SystemSharedMemoryRegisterResponse,
        UNARY,
    ),
    (
        V2 + "SystemSharedMemoryUnregister",
        pb.SystemSharedMemoryUnregisterRequest(),
        pb.SystemSharedMemoryUnregisterResponse,
        UNARY,
    ),
    (
        V2 + "CudaSharedMemoryStatus",
        pb.CudaSharedMemoryStatusRequest(),
        pb.CudaSharedMemoryStatusResponse,
        UNARY,
    ),
    (
        V2 + "CudaSharedMemoryRegister",
        pb.CudaSharedMemoryRegisterRequest(),
        pb.CudaSharedMemoryRegisterResponse,
        UNARY,
    ),
    (
        V2 + "CudaSharedMemoryUnregister",
        pb.CudaSharedMemoryUnregisterRequest(),
        pb.CudaSharedMemoryUnregisterResponse,
        UNARY,
    ),
    (V2 + "TraceSetting", pb.TraceSettingRequest(), pb.TraceSettingResponse, UNARY),
    (V2 + "LogSettings", pb.LogSettingsRequest(), pb.LogSettingsResponse, UNARY),
    (GRPS + "Predict", grps.GrpsMessage(str_data="héllo", model="simple_identity"), grps.GrpsMessage, UNARY),
    (
        GRPS + "PredictStreaming",
        grps.GrpsMessage(str_data="one two three", model="token_stream"),
        grps.GrpsMessage,
        SERVER_STREAM,
    ),
    (GRPS + "CheckLiveness", grps.GrpsMessage(), grps.GrpsMessage, UNARY),
    (GRPS + "CheckReadiness", grps.GrpsMessage(), grps.GrpsMessage, UNARY),
    (GRPS + "ServerMetadata", grps.GrpsMessage(), grps.GrpsMessage, UNARY),
    (GRPS + "ModelMetadata", grps.GrpsMessage(str_data="simple"), grps.GrpsMessage, UNARY),
    (GRPS + "Online", grps.GrpsMessage(), grps.GrpsMessage, UNARY),
]
IDS = [f"{path.rsplit('/', 1)[1]}-{i}" for i, (path, *_) in enumerate(CALLS)]

Outcome = tuple[str, Any]  # ("ok", [messages]) or ("error", (status code, message))


def _comparable(path: str, messages: list) -> list:
    if path.endswith("ModelStatistics"):
        return [[(s.name, s.version) for s in m.model_stats] for m in messages]
    return [bytes(m) for m in messages]


def with_grpclib(port: int, path: str, request: Any, reply: type, kind: str) -> Outcome:
    cardinality = {UNARY: Cardinality.UNARY_UNARY, SERVER_STREAM: Cardinality.UNARY_STREAM}.get(
        kind, Cardinality.STREAM_STREAM
    )

    async def run() -> Outcome:
        channel = Channel("127.0.0.1", port)
        try:
            async with channel.request(path, cardinality, type(request), reply, timeout=10) as stream:
                await stream.send_message(request, end=True)
                return "ok", [m async for m in stream]
        except GRPCError as e:
            return "error", (e.status.value, e.message)
        finally:
            channel.close()

    return asyncio.run(run())


def with_grpcio(port: int, path: str, request: Any, reply: type, kind: str) -> Outcome:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        make = {UNARY: channel.unary_unary, SERVER_STREAM: channel.unary_stream}.get(
            kind, channel.stream_stream
        )
        method = make(path, request_serializer=bytes, response_deserializer=reply.parse)
        try:
            if kind == UNARY:
                return "ok", [method(request, timeout=10)]
            if kind == SERVER_STREAM:
                return "ok", list(method(request, timeout=10))
            return "ok", list(method(iter([request]), timeout=10))
        except grpc.RpcError as e:
            return "error", (e.code().value[0], e.details())


def with_grpcio_aio(port: int, path: str, request: Any, reply: type, kind: str) -> Outcome:
    async def run() -> Outcome:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            make = {UNARY: channel.unary_unary, SERVER_STREAM: channel.unary_stream}.get(
                kind, channel.stream_stream
            )
            method = make(path, request_serializer=bytes, response_deserializer=reply.parse)
            try:
                if kind == UNARY:
                    return "ok", [await method(request, timeout=10)]
                if kind == SERVER_STREAM:
                    return "ok", [m async for m in method(request, timeout=10)]
                return "ok", [m async for m in method(iter([request]), timeout=10)]
            except grpc.aio.AioRpcError as e:
                return "error", (e.code().value[0], e.details())

    return asyncio.run(run())


@pytest.fixture(scope="module")
def reference(v2_server: ServerProcess) -> dict[int, Outcome]:
    return {i: with_grpclib(v2_server.grpc_port, *call) for i, call in enumerate(CALLS)}


@pytest.mark.parametrize("index", range(len(CALLS)), ids=IDS)
@pytest.mark.parametrize("client", ["grpclib", "grpcio", "grpcio-aio"])
@pytest.mark.parametrize("port", ["grpc-port", "http-port"])
def test_every_rpc_answers_alike(
    v2_server: ServerProcess, reference, index: int, client: str, port: str
) -> None:
    path, request, reply, kind = CALLS[index]
    number = v2_server.grpc_port if port == "grpc-port" else v2_server.port
    calls = {"grpclib": with_grpclib, "grpcio": with_grpcio, "grpcio-aio": with_grpcio_aio}
    got = calls[client](number, path, request, reply, kind)
    wanted = reference[index]
    assert got[0] == wanted[0], (got, wanted)
    if got[0] == "ok":
        assert _comparable(path, got[1]) == _comparable(path, wanted[1])
        assert got[1], "at least one answer"
    else:
        assert got[1] == wanted[1]


@pytest.mark.parametrize("port", ["grpc-port", "http-port"])
def test_grpcio_with_gzip_both_ways(v2_server: ServerProcess, port: str) -> None:
    """grpcio with gzip compression on its channel (its calls say grpc-encoding: gzip) gets the answers an
    uncompressed call gets, unary and streaming. grpcio decompresses answers without a word, so whether they
    came back compressed is not seen here: test_e2e_grpc_wire.py's test_compressed_messages_both_ways
    checks that on the wire (the answer's grpc-encoding header and its message's compressed flag)."""
    number = v2_server.grpc_port if port == "grpc-port" else v2_server.port
    plain = with_grpclib(v2_server.grpc_port, *CALLS[5])  # ModelInfer, uncompressed
    with grpc.insecure_channel(f"127.0.0.1:{number}", compression=grpc.Compression.Gzip) as channel:
        infer = channel.unary_unary(
            V2 + "ModelInfer", request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
        )
        answer = infer(simple_request(), timeout=10)
        assert bytes(answer) == bytes(plain[1][0])
        streaming = channel.stream_stream(
            V2 + "ModelStreamInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelStreamInferResponse.parse,
        )
        answers = list(streaming(iter([simple_request()] * 3), timeout=10))
        for a in answers:  # a stream's answers say they are final; the rest is the unary answer
            assert a.infer_response.parameters.pop("triton_final_response").bool_param
        assert [bytes(a.infer_response) for a in answers] == [bytes(plain[1][0])] * 3
