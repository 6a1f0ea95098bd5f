"""grps over gRPC (grps.protos.v1.GrpsService) against a real server: grpclib stubs generated from
proto/ for every RPC, and grpcio (another HTTP/2 implementation, the one most clients use) calling
Predict and PredictStreaming with bytes serialized by our messages.

As grps does, every RPC completes with gRPC status OK; success and failure are in the message's status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import betterproto2
import grpc
import httpx
import pytest
from conftest import ServerFactory
from e2e_helpers import A, B, ServerProcess, write_model
from grpc_helpers import stalled_stream
from grpclib.client import Channel
from grpclib.const import Cardinality
from grps_helpers import bytes_config, echo_version, ticker_end, write_grps_repository

import tensorgate.proto.grps.protos.v1 as pb
import tensorgate.proto.inference as inference

Stub = pb.GrpsServiceStub
PREDICT_STREAMING = "/grps.protos.v1.GrpsService/PredictStreaming"


def call(server: ServerProcess, rpc: Callable[[Stub], Awaitable[Any]]) -> Any:
    """Runs `rpc(stub)` with a grpclib stub on a fresh channel to the server's gRPC port."""

    async def main() -> Any:
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            return await rpc(Stub(channel))
        finally:
            channel.close()

    return asyncio.run(main())


def predict(server: ServerProcess, message: pb.GrpsMessage) -> pb.GrpsMessage:
    return call(server, lambda stub: stub.predict(message))


def stream(server: ServerProcess, message: pb.GrpsMessage) -> list[pb.GrpsMessage]:
    async def collect(stub: Stub) -> list[pb.GrpsMessage]:
        return [m async for m in stub.predict_streaming(message)]

    return call(server, collect)


def assert_ok(message: pb.GrpsMessage) -> pb.GrpsMessage:
    assert (message.status.code, message.status.msg, message.status.status) == (
        200,
        "OK",
        pb.StatusStatusFlag.SUCCESS,
    ), message.status
    return message


def assert_failure(message: pb.GrpsMessage, code: int, *fragments: str) -> str:
    assert (message.status.code, message.status.status) == (code, pb.StatusStatusFlag.FAILURE), message.status
    assert betterproto2.which_one_of(message, "data_oneof") == ("", None)
    for fragment in fragments:
        assert fragment in message.status.msg, (fragment, message.status.msg)
    return message.status.msg


def int32_tensor(name: str, values: list[int]) -> pb.GenericTensor:
    return pb.GenericTensor(name=name, dtype=pb.DataType.DT_INT32, shape=[1, len(values)], flat_int32=values)


def tokens(messages: list[pb.GrpsMessage]) -> list[str]:
    return [assert_ok(m).str_data for m in messages]


# ------------------------------------------------------------------------------ health and metadata


def test_liveness_readiness_and_metadata(v2_server: ServerProcess) -> None:
    assert_ok(call(v2_server, lambda stub: stub.check_liveness(pb.GrpsMessage())))
    assert_ok(call(v2_server, lambda stub: stub.check_readiness(pb.GrpsMessage())))
    server_text = assert_ok(call(v2_server, lambda stub: stub.server_metadata(pb.GrpsMessage()))).str_data
    assert (
        server_text.startswith("server:\n  name: tensorgate\n") and "  - name: token_stream\n" in server_text
    )
    model_text = assert_ok(
        call(v2_server, lambda s: s.model_metadata(pb.GrpsMessage(str_data="half_plus_two-1")))
    )
    assert model_text.str_data.startswith('name: half_plus_two\nversions:\n  - "1"\n')
    assert (
        "  - name: x\n    datatype: FP32\n    shape:\n      - -1\n      - 1\n    dtype: DT_FLOAT32\n"
        in model_text.str_data
    )
    missing = call(v2_server, lambda stub: stub.model_metadata(pb.GrpsMessage(str_data="nosuch")))
    assert_failure(missing, 404, "unknown model 'nosuch'")
    assert_failure(call(v2_server, lambda stub: stub.model_metadata(pb.GrpsMessage())), 400, "no model name")


def test_offline_drains_every_readiness_probe_while_requests_are_served(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_model(repository, "echo", bytes_config("echo"), {1: echo_version(1)})
    server = start_server(repository)

    async def probes(stub: Stub) -> tuple[int, bool, int, int]:
        grps_ready = await stub.check_readiness(pb.GrpsMessage())
        v2 = await inference.GrpcInferenceServiceStub(stub.channel).server_ready(
            inference.ServerReadyRequest()
        )
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            rest_v2 = (await client.get("/v2/health/ready")).status_code
            rest_grps = (await client.get("/grps/v1/health/ready")).status_code
        return grps_ready.status.code, v2.ready, rest_v2, rest_grps

    assert call(server, probes) == (200, True, 200, 200)
    assert_ok(call(server, lambda stub: stub.offline(pb.GrpsMessage())))
    assert call(server, probes) == (503, False, 400, 503)
    readiness = call(server, lambda stub: stub.check_readiness(pb.GrpsMessage()))
    assert_failure(readiness, 503, "Service Unavailable", "offline")
    assert_ok(call(server, lambda stub: stub.check_liveness(pb.GrpsMessage())))
    assert assert_ok(predict(server, pb.GrpsMessage(str_data="served"))).str_data == "v1:served"
    assert_ok(call(server, lambda stub: stub.online(pb.GrpsMessage())))
    assert call(server, probes) == (200, True, 200, 200)


# ---------------------------------------------------------------------------------------- Predict


def test_predict_gtensors(v2_server: ServerProcess) -> None:
    tensors = pb.GenericTensorData(tensors=[int32_tensor("INPUT0", A), int32_tensor("INPUT1", B)])
    answer = assert_ok(predict(v2_server, pb.GrpsMessage(model="simple-1", gtensors=tensors)))
    out0, out1 = answer.gtensors.tensors
    assert (out0.name, out0.dtype, out0.shape) == ("OUTPUT0", pb.DataType.DT_INT32, [1, 16])
    assert out0.flat_int32 == [a + b for a, b in zip(A, B, strict=True)]
    assert out1.flat_int32 == [a - b for a, b in zip(A, B, strict=True)]


def test_predict_str_bin_and_gmap(v2_server: ServerProcess) -> None:
    text = predict(v2_server, pb.GrpsMessage(model="simple_identity", str_data="héllo"))
    assert assert_ok(text).str_data == "héllo"
    raw = bytes(range(256))
    assert (
        assert_ok(predict(v2_server, pb.GrpsMessage(model="simple_identity", bin_data=raw))).bin_data == raw
    )
    gmap = pb.GenericMapData(s_i64={"x": 3})
    answer = assert_ok(predict(v2_server, pb.GrpsMessage(model="half_plus_two", gmap=gmap)))
    assert betterproto2.which_one_of(answer, "data_oneof")[0] == "gmap" and answer.gmap.s_f == {"y": 3.5}


def test_predict_errors_are_failure_messages(grps_server: ServerProcess) -> None:
    assert_failure(predict(grps_server, pb.GrpsMessage(model="echo")), 400, "carries no data")
    assert_failure(
        predict(grps_server, pb.GrpsMessage(model="echo", ndarray=pb.NdArrayData())), 400, "HTTP JSON"
    )
    assert_failure(predict(grps_server, pb.GrpsMessage(model="nosuch", str_data="x")), 404, "unknown model")
    assert_failure(
        predict(grps_server, pb.GrpsMessage(model="echo-5", str_data="x")),
        404,
        "'echo' version 5 is not found",
    )
    assert_failure(predict(grps_server, pb.GrpsMessage(str_data="x")), 400, "no model selected")
    assert_failure(
        predict(grps_server, pb.GrpsMessage(model="broken", str_data="x")), 500, "RuntimeError: kaput"
    )
    assert_failure(
        predict(grps_server, pb.GrpsMessage(model="unloadable", str_data="x")),
        503,
        "'unloadable' has no available versions",
    )
    wrong = pb.GenericTensorData(tensors=[int32_tensor("TEXT", [1])])
    assert_failure(
        predict(grps_server, pb.GrpsMessage(model="echo", gtensors=wrong)), 400, "DT_INT32 values cannot"
    )


def test_model_selection_and_the_default_model(
    grps_server: ServerProcess, start_server: ServerFactory, tmp_path: Path
) -> None:
    assert assert_ok(predict(grps_server, pb.GrpsMessage(model="echo", str_data="a"))).str_data == "v2:a"
    assert assert_ok(predict(grps_server, pb.GrpsMessage(model="echo-1", str_data="a"))).str_data == "v1:a"
    assert (
        assert_ok(predict(grps_server, pb.GrpsMessage(model="my-model-1", str_data="a"))).str_data == "v7:a"
    )
    repository = write_grps_repository(tmp_path / "models")
    server = start_server(repository, extra_args=("--grps-default-model", "echo-1"))
    assert assert_ok(predict(server, pb.GrpsMessage(str_data="b"))).str_data == "v1:b"


# ------------------------------------------------------------------------------- PredictStreaming


def test_predict_streaming_sends_one_message_per_yield(v2_server: ServerProcess) -> None:
    messages = stream(v2_server, pb.GrpsMessage(model="token_stream", str_data="one two three"))
    assert tokens(messages) == ["one", "two", "three"]
    plain = stream(v2_server, pb.GrpsMessage(model="simple_identity", str_data="whole"))
    assert tokens(plain) == ["whole"]


def test_predict_streaming_delivers_before_the_stream_ends(
    grps_server: ServerProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"

    async def gated(stub: Stub) -> list[str]:
        seen = []
        async for message in stub.predict_streaming(pb.GrpsMessage(model="gated", str_data=str(gate))):
            seen.append(assert_ok(message).str_data)
            gate.touch()  # the model sends "second" only after we have "first"
        return seen

    assert call(grps_server, gated) == ["first", "second"]


def test_predict_streaming_errors(grps_server: ServerProcess) -> None:
    first, last = stream(grps_server, pb.GrpsMessage(model="failing", str_data="x"))
    assert assert_ok(first).str_data == "one"
    assert_failure(last, 500, "ValueError: boom in the middle of the stream")
    (only,) = stream(grps_server, pb.GrpsMessage(model="nosuch", str_data="x"))
    assert_failure(only, 404, "unknown model 'nosuch'")


def test_a_cancelled_stream_closes_the_model_stream(grps_server: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "closed"

    async def cancel_after_two(stub: Stub) -> list[str]:
        path = "/grps.protos.v1.GrpsService/PredictStreaming"
        async with stub.channel.request(
            path, Cardinality.UNARY_STREAM, pb.GrpsMessage, pb.GrpsMessage
        ) as rpc:
            await rpc.send_message(pb.GrpsMessage(model="ticker", str_data=str(marker)), end=True)
            seen = [(await rpc.recv_message()).str_data for _ in range(2)]
            await rpc.cancel()
        return seen

    assert call(grps_server, cancel_after_two) == ["tick 0", "tick 1"]
    assert ticker_end(marker).startswith("closed after"), "the model's stream was not closed"
    assert_ok(call(grps_server, lambda stub: stub.check_liveness(pb.GrpsMessage())))


def test_a_slow_reader_pauses_the_models_generator(grps_server: ServerProcess, tmp_path: Path) -> None:
    """As on ModelStreamInfer (test_e2e_grpc_wire.py): each message is ~4 KB, so a client that gives the
    default 64 KB of window and reads nothing gets ~16 of them, and the model's generator waits there
    instead of running on while the server buffers its answers."""
    progress = tmp_path / "progress"
    request = bytes(pb.GrpsMessage(model="counting", str_data=str(progress)))
    steps, bodies = stalled_stream(grps_server.grpc_port, PREDICT_STREAMING, request, progress)
    assert steps < 40, f"the generator ran {steps} steps ahead of a client that reads nothing"
    texts = tokens([pb.GrpsMessage.parse(body) for body in bodies])
    assert [int(text.split()[0]) for text in texts] == list(range(1000)), "every message, in order"
    assert all(len(text) == 4000 for text in texts)


# ------------------------------------------------------------------------------------------ grpcio


@pytest.fixture
def grpcio_channel(grps_server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{grps_server.grpc_port}") as channel:
        yield channel


def test_grpcio_predict_and_predict_streaming(grpcio_channel: grpc.Channel, v2_server: ServerProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{v2_server.grpc_port}") as channel:
        predict_rpc = channel.unary_unary(
            "/grps.protos.v1.GrpsService/Predict",
            request_serializer=bytes,
            response_deserializer=pb.GrpsMessage.parse,
        )
        tensors = pb.GenericTensorData(tensors=[int32_tensor("INPUT0", A), int32_tensor("INPUT1", B)])
        answer = assert_ok(predict_rpc(pb.GrpsMessage(model="simple", gtensors=tensors), timeout=10))
        assert answer.gtensors.tensors[0].flat_int32 == [a + b for a, b in zip(A, B, strict=True)]
        streaming_rpc = channel.unary_stream(
            "/grps.protos.v1.GrpsService/PredictStreaming",
            request_serializer=bytes,
            response_deserializer=pb.GrpsMessage.parse,
        )
        words = list(
            streaming_rpc(pb.GrpsMessage(model="token_stream", str_data="grpcio reads these"), timeout=10)
        )
        assert tokens(words) == ["grpcio", "reads", "these"]
    failing = grpcio_channel.unary_stream(
        "/grps.protos.v1.GrpsService/PredictStreaming",
        request_serializer=bytes,
        response_deserializer=pb.GrpsMessage.parse,
    )
    first, last = failing(pb.GrpsMessage(model="failing", str_data="x"), timeout=10)
    assert assert_ok(first).str_data == "one"
    assert_failure(last, 500, "boom")


def test_grpcio_cancelling_a_stream_closes_the_model_stream(
    grpcio_channel: grpc.Channel, tmp_path: Path
) -> None:
    marker = tmp_path / "closed"
    streaming_rpc = grpcio_channel.unary_stream(
        "/grps.protos.v1.GrpsService/PredictStreaming",
        request_serializer=bytes,
        response_deserializer=pb.GrpsMessage.parse,
    )
    responses = streaming_rpc(pb.GrpsMessage(model="ticker", str_data=str(marker)), timeout=30)
    assert [next(responses).str_data for _ in range(3)] == ["tick 0", "tick 1", "tick 2"]
    responses.cancel()
    assert ticker_end(marker).startswith("closed after"), "the model's stream was not closed"
    liveness = grpcio_channel.unary_unary(
        "/grps.protos.v1.GrpsService/CheckLiveness",
        request_serializer=bytes,
        response_deserializer=pb.GrpsMessage.parse,
    )
    assert_ok(liveness(pb.GrpsMessage(), timeout=10))
