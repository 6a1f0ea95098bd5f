"""Every RPC of both services through three clients (grpclib, grpcio sync, grpcio aio) on both ports (the
gRPC port, and the HTTP port, where HTTP/2 requests with content-type application/grpc are gRPC calls):
each answers what is expected, worked out here apart from the server: inference answers computed with
numpy from the example models' definitions (examples/model_repository/<model>/1/model.py), metadata
from their config.pbtxt, the repository from its folders, and statuses as docs/protocols/v2-grpc.md
documents them. The other gRPC tests check these answers in more detail."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
import yaml
from e2e_helpers import EXAMPLES, A, B, ServerProcess, encode_bytes_elements
from grpc_helpers import simple_request, text_request
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality

import tensorgate.proto.grps.protos.v1 as grps
import tensorgate.proto.inference as pb

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

# ------------------------------------------------------------------------------- the expected answers

# simple (examples/model_repository/simple): INT32 [16] twice in, OUTPUT0 = a + b, OUTPUT1 = a - b.
A32, B32 = np.array(A, "<i4"), np.array(B, "<i4")
SIMPLE_TENSORS = [
    pb.ModelMetadataResponseTensorMetadata(name=name, datatype="INT32", shape=[-1, 16])
    for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
]
SIMPLE_ANSWER = pb.ModelInferResponse(
    model_name="simple",
    model_version="1",
    outputs=[
        pb.ModelInferResponseInferOutputTensor(name=name, datatype="INT32", shape=[1, 16])
        for name in ("OUTPUT0", "OUTPUT1")
    ],
    raw_output_contents=[(A32 + B32).tobytes(), (A32 - B32).tobytes()],
)


def final(flag: bool) -> dict[str, pb.InferParameter]:
    """The parameter every ModelStreamInfer answer carries (as Triton's): whether it is its request's last."""
    return {"triton_final_response": pb.InferParameter(bool_param=flag)}


STREAMED_SIMPLE_ANSWER = pb.ModelInferResponse(
    model_name="simple",
    model_version="1",
    outputs=SIMPLE_ANSWER.outputs,
    raw_output_contents=SIMPLE_ANSWER.raw_output_contents,
    parameters=final(True),
)
# token_stream: one TOKEN (BYTES [1]) per word of TEXT, streamed.
WORDS = ["one", "two", "three"]
TOKEN_ANSWERS = [
    pb.ModelStreamInferResponse(
        infer_response=pb.ModelInferResponse(
            model_name="token_stream",
            model_version="1",
            outputs=[pb.ModelInferResponseInferOutputTensor(name="TOKEN", datatype="BYTES", shape=[1])],
            raw_output_contents=[encode_bytes_elements([word.encode()])],
            parameters=final(False),
        )
    )
    for word in WORDS
]
EXAMPLE_MODELS = sorted(path.parent.name for path in EXAMPLES.glob("*/config.*"))
# GET /v2's extensions (docs/protocols/v2-rest.md), with the shared-memory ones.
EXTENSIONS = [
    "classification",
    "sequence",
    "sequence(string_id)",
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
    "generate",
]
GRPS_OK = grps.Status(code=200, msg="OK", status=grps.StatusStatusFlag.SUCCESS)
NOT_EXPLICIT = "not allowed in model control mode 'none'"
SHM_OFF = "client shared memory is disabled on this server: start it with --allow-client-shm true"


def version_of_tensorgate() -> str:
    with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def simple_config(config: pb.ModelConfig) -> None:
    """ModelConfig's answer: examples/model_repository/simple/config.pbtxt (and the defaults the server
    fills in, not checked here)."""
    assert (config.name, config.backend, config.max_batch_size) == ("simple", "python", 8)
    for tensors, names in ((config.input, ["INPUT0", "INPUT1"]), (config.output, ["OUTPUT0", "OUTPUT1"])):
        assert [(t.name, t.data_type, list(t.dims)) for t in tensors] == [
            (name, pb.DataType.TYPE_INT32, [16]) for name in names
        ]


def simple_statistics(answer: pb.ModelStatisticsResponse) -> None:
    """Counts change between calls: the models named only."""
    assert [(s.name, s.version) for s in answer.model_stats] == [("simple", "1")]


def grps_server_metadata(message: grps.GrpsMessage) -> None:
    assert message.status == GRPS_OK
    doc = yaml.safe_load(message.str_data)
    assert doc["server"]["name"] == "tensorgate" and doc["ready"] is True
    assert [(m["name"], m["versions"], m["ready"]) for m in doc["models"]] == [
        (name, ["1"], True) for name in EXAMPLE_MODELS
    ]


def grps_model_metadata(message: grps.GrpsMessage) -> None:
    assert message.status == GRPS_OK
    doc = yaml.safe_load(message.str_data)
    assert (doc["name"], doc["versions"], doc["max_batch_size"]) == ("simple", ["1"], 8)
    tensors = [(t["name"], t["datatype"], t["shape"]) for t in doc["inputs"] + doc["outputs"]]
    assert tensors == [(t.name, t.datatype, t.shape) for t in SIMPLE_TENSORS]


# Per call: the answers expected (compared message by message), a function that checks each answer, or
# the error: (status code, a fragment of its message).
EXPECTED: dict[str, Any] = {
    "ServerLive-0": [pb.ServerLiveResponse(live=True)],
    "ServerReady-1": [pb.ServerReadyResponse(ready=True)],
    "ModelReady-2": [pb.ModelReadyResponse(ready=True)],
    "ServerMetadata-3": [
        pb.ServerMetadataResponse(name="tensorgate", version=version_of_tensorgate(), extensions=EXTENSIONS)
    ],
    "ModelMetadata-4": [
        pb.ModelMetadataResponse(
            name="simple",
            versions=["1"],
            platform="python",
            inputs=SIMPLE_TENSORS[:2],
            outputs=SIMPLE_TENSORS[2:],
        )
    ],
    "ModelInfer-5": [SIMPLE_ANSWER],
    "ModelInfer-6": (5, "Request for unknown model: 'nowhere' is not found"),  # NOT_FOUND
    "ModelStreamInfer-7": [pb.ModelStreamInferResponse(infer_response=STREAMED_SIMPLE_ANSWER)],
    "ModelStreamInfer-8": TOKEN_ANSWERS,
    "ModelConfig-9": lambda answer: simple_config(answer.config),
    "ModelStatistics-10": simple_statistics,
    "RepositoryIndex-11": [
        pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponseModelIndex(name=name, version="1", state="READY")
                for name in EXAMPLE_MODELS
            ]
        )
    ],
    "RepositoryModelLoad-12": (14, NOT_EXPLICIT),  # UNAVAILABLE
    "RepositoryModelUnload-13": (14, NOT_EXPLICIT),
    "SystemSharedMemoryStatus-14": [pb.SystemSharedMemoryStatusResponse()],
    "SystemSharedMemoryRegister-15": (3, SHM_OFF),  # INVALID_ARGUMENT
    "SystemSharedMemoryUnregister-16": (3, SHM_OFF),
    "CudaSharedMemoryStatus-17": [pb.CudaSharedMemoryStatusResponse()],
    "CudaSharedMemoryRegister-18": (3, SHM_OFF),
    "CudaSharedMemoryUnregister-19": (3, SHM_OFF),
    "TraceSetting-20": lambda answer: trace_off(answer),
    "LogSettings-21": lambda answer: log_defaults(answer),
    "Predict-22": [grps.GrpsMessage(status=GRPS_OK, str_data="héllo")],  # simple_identity echoes
    "PredictStreaming-23": [grps.GrpsMessage(status=GRPS_OK, str_data=word) for word in WORDS],
    "CheckLiveness-24": [grps.GrpsMessage(status=GRPS_OK)],
    "CheckReadiness-25": [grps.GrpsMessage(status=GRPS_OK)],
    "ServerMetadata-26": grps_server_metadata,
    "ModelMetadata-27": grps_model_metadata,
    "Online-28": [grps.GrpsMessage(status=GRPS_OK)],
}


def trace_off(answer: pb.TraceSettingResponse) -> None:
    """The example server traces nothing: no --trace-config."""
    settings = {name: list(value.value) for name, value in answer.settings.items()}
    assert settings["trace_level"] == ["OFF"] and settings["trace_mode"] == ["triton"], settings


def log_defaults(answer: pb.LogSettingsResponse) -> None:
    settings = answer.settings
    assert settings["log_info"].bool_param is True and settings["log_format"].string_param == "default"


def assert_expected(call_id: str, got: Outcome) -> None:
    expected = EXPECTED[call_id]
    if isinstance(expected, tuple):
        assert got[0] == "error", got
        code, message = got[1]
        assert code == expected[0] and expected[1] in message, (got, expected)
        return
    assert got[0] == "ok", got
    if callable(expected):
        assert len(got[1]) == 1, got
        expected(got[1][0])
    else:
        assert got[1] == expected


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


def test_every_call_has_its_expected_answer() -> None:
    assert set(EXPECTED) == set(IDS)


@pytest.mark.parametrize("index", range(len(CALLS)), ids=IDS)
@pytest.mark.parametrize("client", ["grpclib", "grpcio", "grpcio-aio"])
@pytest.mark.parametrize("port", ["grpc-port", "http-port"])
def test_every_rpc_answers_as_expected(v2_server: ServerProcess, index: int, client: str, port: str) -> None:
    path, request, reply, kind = CALLS[index]
    number = v2_server.grpc_port if port == "grpc-port" else v2_server.port
    calls = {"grpclib": with_grpclib, "grpcio": with_grpcio, "grpcio-aio": with_grpcio_aio}
    assert_expected(IDS[index], calls[client](number, path, request, reply, kind))


@pytest.mark.parametrize("port", ["grpc-port", "http-port"])
def test_grpcio_with_gzip_both_ways(v2_server: ServerProcess, port: str) -> None:
    """grpcio with gzip compression on its channel (its calls say grpc-encoding: gzip) gets the answers an
    uncompressed call gets, unary and streaming. grpcio decompresses answers without a word, so whether they
    came back compressed is not seen here: test_e2e_grpc_wire.py's test_compressed_messages_both_ways
    checks that on the wire (the answer's grpc-encoding header and its message's compressed flag)."""
    number = v2_server.grpc_port if port == "grpc-port" else v2_server.port
    with grpc.insecure_channel(f"127.0.0.1:{number}", compression=grpc.Compression.Gzip) as channel:
        infer = channel.unary_unary(
            V2 + "ModelInfer", request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
        )
        answer = infer(simple_request(), timeout=10)
        assert answer == SIMPLE_ANSWER
        streaming = channel.stream_stream(
            V2 + "ModelStreamInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelStreamInferResponse.parse,
        )
        answers = list(streaming(iter([simple_request()] * 3), timeout=10))
        assert [a.infer_response for a in answers] == [STREAMED_SIMPLE_ANSWER] * 3
