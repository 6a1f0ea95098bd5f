"""grpc.health.v1.Health and server reflection, through the clients grpc ships for them (grpcio-health-
checking, grpcio-reflection: what Kubernetes' probes and grpcurl do) and through grpclib with our own
generated stubs (reflection v1)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import httpx
import pytest
from e2e_helpers import IDENTITY_MODEL, ServerProcess, int32_config, write_model
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpclib.client import Channel

import tensorgate.proto.grpc.reflection.v1 as reflection_v1

pytestmark = pytest.mark.ours

SERVICES = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "grps.protos.v1.GrpsService",
    "inference.GRPCInferenceService",
    "tensorflow.serving.ModelService",
    "tensorflow.serving.PredictionService",
]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.fixture(params=["grpc-port", "http-port"])
def channel(request: pytest.FixtureRequest, v2_server: ServerProcess):
    port = v2_server.grpc_port if request.param == "grpc-port" else v2_server.port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel


def test_health_check(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "inference.GRPCInferenceService", "grps.protos.v1.GrpsService", "simple", "mlp"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == SERVING
    with pytest.raises(grpc.RpcError) as excinfo:
        health.Check(health_pb2.HealthCheckRequest(service="no_such_model"), timeout=5)
    assert excinfo.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in excinfo.value.details()


@pytest.fixture
def ident_server(start_server, repo: Path) -> ServerProcess:
    """A server in explicit model control mode on `repo`, with one model, ident, loaded."""
    write_model(repo, "ident", int32_config("ident"), {1: IDENTITY_MODEL})
    return start_server(repo, extra_args=("--model-control-mode", "explicit", "--load-model", "ident"))


def repository_action(server: ServerProcess, model: str, action: str) -> None:
    """POST /v2/repository/models/<model>/<action> (load, unload); it answers once the action is done."""
    httpx.post(f"{server.base_url}/v2/repository/models/{model}/{action}", timeout=10).raise_for_status()


def test_health_check_follows_an_unload_and_a_load(ident_server: ServerProcess) -> None:
    """Check on a model's name, as a probe asks it: SERVING while the model is loaded, NOT_SERVING once it
    is unloaded (a name the server still knows, so not NOT_FOUND), SERVING again after a load. The server
    itself ("") serves on throughout: an unloaded model does not count for its readiness."""
    with grpc.insecure_channel(f"127.0.0.1:{ident_server.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def check(service: str) -> int:
            return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

        assert (check("ident"), check("")) == (SERVING, SERVING)
        repository_action(ident_server, "ident", "unload")
        assert (check("ident"), check("")) == (NOT_SERVING, SERVING)
        repository_action(ident_server, "ident", "load")
        assert (check("ident"), check("")) == (SERVING, SERVING)


def test_health_watch_follows_an_unload_and_a_load(ident_server: ServerProcess, repo: Path) -> None:
    seen: list[int] = []
    with grpc.insecure_channel(f"127.0.0.1:{ident_server.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service="ident"), timeout=30)
        unknown = health.Watch(health_pb2.HealthCheckRequest(service="later"), timeout=30)
        assert next(watch).status == SERVING
        assert next(unknown).status == SERVICE_UNKNOWN, "Watch of an unknown name waits for it"
        repository_action(ident_server, "ident", "unload")
        assert next(watch).status == NOT_SERVING
        repository_action(ident_server, "ident", "load")
        assert next(watch).status == SERVING
        write_model(repo, "later", int32_config("later"), {1: IDENTITY_MODEL})
        repository_action(ident_server, "later", "load")
        assert next(unknown).status == SERVING

        # At shutdown every watch hears NOT_SERVING, then its call ends UNAVAILABLE.
        def follow() -> None:
            try:
                for answer in watch:
                    seen.append(answer.status)
            except grpc.RpcError as e:
                seen.append(e.code())

        follower = threading.Thread(target=follow)
        follower.start()
        ident_server.stop()
        follower.join(timeout=10)
    assert seen == [NOT_SERVING, grpc.StatusCode.UNAVAILABLE]


def test_reflection_lists_and_describes_every_service(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)  # grpcio's client, reflection v1alpha
    assert sorted(database.get_services()) == SERVICES
    pool = DescriptorPool(database)
    infer = pool.FindServiceByName("inference.GRPCInferenceService")
    assert {"ModelInfer", "ModelStreamInfer", "RepositoryModelLoad"} <= {m.name for m in infer.methods}
    model_infer = infer.FindMethodByName("ModelStreamInfer")
    assert model_infer.input_type.full_name == "inference.ModelInferRequest"
    assert model_infer.output_type.full_name == "inference.ModelStreamInferResponse"
    # A message from the imported file (model_config.proto) resolves too.
    config = pool.FindMessageTypeByName("inference.ModelConfig")
    assert config.fields_by_name["max_batch_size"].number == 4
    grps = pool.FindServiceByName("grps.protos.v1.GrpsService")
    assert "PredictStreaming" in {m.name for m in grps.methods}
    health = pool.FindServiceByName("grpc.health.v1.Health")
    assert health.FindMethodByName("Watch").output_type.full_name == "grpc.health.v1.HealthCheckResponse"
    # TF Serving's: its messages, the TensorFlow ones they use, and protobuf's Any and Int64Value resolve
    predict = pool.FindServiceByName("tensorflow.serving.PredictionService").FindMethodByName("Predict")
    inputs = predict.input_type.fields_by_name["inputs"].message_type.fields_by_name["value"]
    assert inputs.message_type.full_name == "tensorflow.TensorProto"
    spec = pool.FindMessageTypeByName("tensorflow.serving.ModelSpec")
    assert spec.fields_by_name["version"].message_type.full_name == "google.protobuf.Int64Value"
    metadata = pool.FindMessageTypeByName("tensorflow.serving.GetModelMetadataResponse")
    value = metadata.fields_by_name["metadata"].message_type.fields_by_name["value"]
    assert value.message_type.full_name == "google.protobuf.Any"


def test_reflection_v1_with_grpclib(v2_server: ServerProcess) -> None:
    pb = reflection_v1

    async def ask() -> list:
        channel = Channel("127.0.0.1", v2_server.grpc_port)
        try:
            stub = pb.ServerReflectionStub(channel)
            requests = [
                pb.ServerReflectionRequest(list_services=""),
                pb.ServerReflectionRequest(
                    file_containing_symbol="inference.GRPCInferenceService.ModelInfer"
                ),
                pb.ServerReflectionRequest(file_by_filename="grps.proto"),
                pb.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
                pb.ServerReflectionRequest(all_extension_numbers_of_type="inference.ModelInferRequest"),
            ]
            return [answer async for answer in stub.server_reflection_info(requests, timeout=10)]
        finally:
            channel.close()

    listed, symbol, by_name, missing, extensions = asyncio.run(ask())
    assert sorted(s.name for s in listed.list_services_response.service) == SERVICES
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(f)
        for f in symbol.file_descriptor_response.file_descriptor_proto
    ]
    assert [f.name for f in files] == ["grpc_service.proto", "model_config.proto"], (
        "the file, then its import"
    )
    assert files[0].package == "inference"
    [grps_file] = by_name.file_descriptor_response.file_descriptor_proto
    assert descriptor_pb2.FileDescriptorProto.FromString(grps_file).service[0].name == "GrpsService"
    assert missing.error_response.error_code == 5 and "no.such.Symbol" in missing.error_response.error_message
    assert extensions.all_extension_numbers_response.base_type_name == "inference.ModelInferRequest"
    assert list(extensions.all_extension_numbers_response.extension_number) == []
