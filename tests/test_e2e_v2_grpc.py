"""KServe v2 over gRPC end to end, unary RPCs: a real server driven by grpclib stubs generated from proto/
(and grpcio for the message size limit); errors carry the same messages as REST; the message size limit;
SIGTERM with calls in flight. Streams and grpcio: test_e2e_v2_grpc_stream.py."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from e2e_helpers import A, B, ServerProcess, int32_config, wait_until_refused, write_model
from grpc_helpers import (
    DIFFS,
    SERVICE,
    SUMS,
    Stub,
    answer,
    call,
    grpc_error,
    open_call,
    open_stream,
    outputs,
    rest,
    simple_request,
    status_of,
    tensor,
)
from grpclib import GRPCError
from grpclib.client import UnaryUnaryMethod
from grpclib.const import Status
from h2_wire import H2Wire

import tensorgate.proto.inference as pb

# ----------------------------------------------------------------------------- health and metadata


def test_health_and_server_metadata(v2_server: ServerProcess) -> None:
    assert call(v2_server, lambda s: s.server_live()).live is True
    assert call(v2_server, lambda s: s.server_ready()).ready is True
    metadata = call(v2_server, lambda s: s.server_metadata())
    assert {"name": metadata.name, "version": metadata.version, "extensions": metadata.extensions} == rest(
        v2_server, "GET", "/v2"
    ).json()


def test_a_unary_call_that_ends_without_its_request_is_internal(v2_server: ServerProcess) -> None:
    """Inference and the other methods alike (with --workers, one is a worker's, the other the engine's)."""
    with H2Wire(("127.0.0.1", v2_server.grpc_port)) as h2:
        h2.open()
        for stream, method in ((1, "ModelInfer"), (3, "ServerLive"), (5, "ModelMetadata")):
            open_call(h2, stream, SERVICE + method, b"")  # END_STREAM with no message
            assert status_of(answer(h2, stream)[0]) == (13, "the call ended without its request message")
        open_call(h2, 7, SERVICE + "ServerLive", bytes([0, 0, 0, 0, 0]))  # one empty message: a request
        blocks, data = answer(h2, 7)
        assert status_of(blocks) == (0, "") and pb.ServerLiveResponse.parse(data[5:]).live


def test_model_ready(v2_server: ServerProcess) -> None:
    for version in ("", "1"):
        assert call(v2_server, lambda s, v=version: s.model_ready(pb.ModelReadyRequest("simple", v))).ready
    # As Triton's ModelIsReady: an unknown model or version is simply not ready (tritonclient.grpc's
    # is_model_ready then says False rather than raising).
    for name, version in (("nope", ""), ("simple", "7")):
        request = pb.ModelReadyRequest(name, version)
        assert call(v2_server, lambda s, r=request: s.model_ready(r)).ready is False


@pytest.mark.parametrize("model", ["simple", "simple_string", "token_stream", "half_plus_two"])
def test_model_metadata_matches_rest(v2_server: ServerProcess, model: str) -> None:
    for version in ("", "1"):
        got = call(v2_server, lambda s, v=version: s.model_metadata(pb.ModelMetadataRequest(model, v)))
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        expected = rest(v2_server, "GET", path).json()
        as_dict = {
            "name": got.name,
            "versions": got.versions,
            "platform": got.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in got.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in got.outputs],
        }
        assert as_dict == expected


def test_model_config(v2_server: ServerProcess) -> None:
    config = call(v2_server, lambda s: s.model_config(pb.ModelConfigRequest("token_stream"))).config
    expected = rest(v2_server, "GET", "/v2/models/token_stream/config").json()
    assert (config.name, config.backend, config.max_batch_size) == ("token_stream", "python", 0)
    assert [(i.name, i.data_type.name, i.dims) for i in config.input] == [
        (i["name"], i["data_type"], i["dims"]) for i in expected["input"]
    ]
    assert config.model_transaction_policy.decoupled is True
    assert config.parameters["delay_ms"].string_value == "50"
    message = grpc_error(v2_server, lambda s: s.model_config(pb.ModelConfigRequest("nope")), Status.NOT_FOUND)
    assert message == rest(v2_server, "GET", "/v2/models/nope/config").json()["error"]


# ------------------------------------------------------------------------------------------- infer


def test_model_infer_raw(v2_server: ServerProcess) -> None:
    response = call(v2_server, lambda s: s.model_infer(simple_request(id="req-1")))
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "req-1")
    assert [(o.name, o.datatype, o.shape) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]),
        ("OUTPUT1", "INT32", [1, 16]),
    ]
    assert outputs(response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


def test_model_infer_typed_contents_and_requested_outputs(v2_server: ServerProcess) -> None:
    inputs = [
        tensor("INPUT0", "INT32", [1, 16], int_contents=A),
        tensor("INPUT1", "INT32", [1, 16], int_contents=B),
    ]
    wanted = [pb.ModelInferRequestInferRequestedOutputTensor(n) for n in ("OUTPUT1", "OUTPUT0")]
    request = pb.ModelInferRequest(model_name="simple", model_version="1", inputs=inputs, outputs=wanted)
    response = call(v2_server, lambda s: s.model_infer(request))
    assert [o.name for o in response.outputs] == ["OUTPUT1", "OUTPUT0"]
    assert outputs(response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}
    request.outputs = wanted[:1]
    assert outputs(call(v2_server, lambda s: s.model_infer(request))) == {"OUTPUT1": DIFFS}


def test_bytes_tensors_raw_and_typed(v2_server: ServerProcess) -> None:
    a, b = [str(x).encode() for x in A], [str(x).encode() for x in B]
    typed = [
        tensor("INPUT0", "BYTES", [1, 16], bytes_contents=a),
        tensor("INPUT1", "BYTES", [1, 16], bytes_contents=b),
    ]
    raw = [b"".join(struct.pack("<I", len(e)) + e for e in side) for side in (a, b)]
    expected = {"OUTPUT0": [str(x).encode() for x in SUMS], "OUTPUT1": [str(x).encode() for x in DIFFS]}
    for request in (
        pb.ModelInferRequest(model_name="simple_string", inputs=typed),
        pb.ModelInferRequest(
            model_name="simple_string",
            inputs=[tensor(t.name, "BYTES", [1, 16]) for t in typed],
            raw_input_contents=raw,
        ),
    ):
        assert outputs(call(v2_server, lambda s, r=request: s.model_infer(r))) == expected


def test_large_fp32_tensor_round_trips(v2_server: ServerProcess) -> None:
    values = np.random.default_rng(7).standard_normal(1 << 20).astype("<f4")  # 4 MiB, grpcio's default cap
    request = pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[tensor("INPUT0", "FP32", [values.size])],
        raw_input_contents=[values.tobytes()],
    )
    response = call(v2_server, lambda s: s.model_infer(request))
    assert response.raw_output_contents == [values.tobytes()]


def _rest_input(t: pb.ModelInferRequestInferInputTensor) -> dict:
    data = t.contents.int_contents or t.contents.int64_contents
    return {"name": t.name, "datatype": t.datatype, "shape": t.shape, "data": data}


GOOD0, GOOD1 = (
    tensor("INPUT0", "INT32", [1, 16], int_contents=A),
    tensor("INPUT1", "INT32", [1, 16], int_contents=B),
)
# (id, model, version, inputs, requested outputs, gRPC status); REST answers the same message
INFER_ERRORS = [
    ("unknown-model", "nope", "", [GOOD0, GOOD1], [], Status.NOT_FOUND),
    ("unknown-version", "simple", "9", [GOOD0, GOOD1], [], Status.NOT_FOUND),
    ("unknown-input", "simple", "", [GOOD0, tensor("INPUT9", "INT32", [1, 16], int_contents=B)], [], None),
    ("wrong-shape", "simple", "", [GOOD0, tensor("INPUT1", "INT32", [1, 15], int_contents=B[:15])], [], None),
    ("wrong-datatype", "simple", "", [GOOD0, tensor("INPUT1", "INT64", [1, 16], int64_contents=B)], [], None),
    (
        "over-max-batch",
        "simple",
        "",
        [tensor(n, "INT32", [9, 16], int_contents=A * 9) for n in ("INPUT0", "INPUT1")],
        [],
        None,
    ),
    ("missing-input", "simple", "", [GOOD0], [], None),
    ("unknown-output", "simple", "", [GOOD0, GOOD1], ["OUTPUT7"], None),
]


@pytest.mark.parametrize(
    ("model", "version", "inputs", "wanted", "status"),
    [c[1:] for c in INFER_ERRORS],
    ids=[c[0] for c in INFER_ERRORS],
)
def test_infer_errors_match_rest(v2_server: ServerProcess, model, version, inputs, wanted, status) -> None:
    requested = [pb.ModelInferRequestInferRequestedOutputTensor(n) for n in wanted]
    request = pb.ModelInferRequest(model_name=model, model_version=version, inputs=inputs, outputs=requested)
    message = grpc_error(v2_server, lambda s: s.model_infer(request), status or Status.INVALID_ARGUMENT)
    body = {"inputs": [_rest_input(t) for t in inputs]}
    if wanted:
        body["outputs"] = [{"name": n} for n in wanted]
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    assert message == rest(v2_server, "POST", path, json=body).json()["error"]


class Raw:
    """Bytes sent as they are, for requests our messages would not write."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 (grpclib's name)
        return self.data


def test_malformed_and_inconsistent_requests_are_invalid_argument(v2_server: ServerProcess) -> None:
    async def send(stub: Stub, data: bytes) -> pb.ModelInferResponse:
        return await UnaryUnaryMethod(stub.channel, SERVICE + "ModelInfer", Raw, pb.ModelInferResponse)(
            Raw(data)
        )

    good = bytes(simple_request())
    for data, fragment in (
        (good[:-3], "malformed ModelInferRequest"),
        (b"\x0a\x03\xff\xfe\xfd" + good, "UTF-8"),
        (bytes(simple_request(b=[]))[:-2] + b"\x3a\x00", "raw_input_contents holds 0 bytes"),
        (
            bytes(pb.ModelInferRequest(model_name="simple", inputs=[GOOD0], raw_input_contents=[b"", b""])),
            "contents field must not be specified when using raw_input_contents for 'INPUT0'",
        ),
    ):
        grpc_error(v2_server, lambda s, d=data: send(s, d), Status.INVALID_ARGUMENT, fragment)
    assert outputs(call(v2_server, lambda s: send(s, good))) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


# ------------------------------------------------------------------------- statistics, repository


def test_model_statistics_count_requests(v2_server: ServerProcess) -> None:
    def stats() -> pb.ModelStatistics:
        (only,) = call(
            v2_server, lambda s: s.model_statistics(pb.ModelStatisticsRequest("simple_identity"))
        ).model_stats
        return only

    before = stats()
    assert (before.name, before.version) == ("simple_identity", "1")
    request = pb.ModelInferRequest(
        model_name="simple_identity", inputs=[tensor("INPUT0", "BYTES", [1, 2], bytes_contents=[b"x", b"y"])]
    )
    for _ in range(3):
        call(v2_server, lambda s: s.model_infer(request))
    after = stats()
    assert after.inference_stats.success.count == before.inference_stats.success.count + 3
    assert after.inference_count == before.inference_count + 3
    everything = call(v2_server, lambda s: s.model_statistics(pb.ModelStatisticsRequest())).model_stats
    assert {"simple", "simple_identity", "token_stream"} <= {m.name for m in everything}
    grpc_error(
        v2_server, lambda s: s.model_statistics(pb.ModelStatisticsRequest("nope")), Status.NOT_FOUND, "nope"
    )


def test_repository_index_matches_rest_and_control_is_refused_in_mode_none(v2_server: ServerProcess) -> None:
    index = call(v2_server, lambda s: s.repository_index(pb.RepositoryIndexRequest(ready=True))).models
    expected = rest(v2_server, "POST", "/v2/repository/index", json={"ready": True}).json()
    assert [{"name": m.name, "version": m.version, "state": m.state} for m in index] == expected
    for rpc, path in (("repository_model_load", "load"), ("repository_model_unload", "unload")):
        request = getattr(
            pb, "RepositoryModelLoadRequest" if path == "load" else "RepositoryModelUnloadRequest"
        )
        message = grpc_error(
            v2_server, lambda s, r=rpc, q=request: getattr(s, r)(q(model_name="simple")), Status.UNAVAILABLE
        )
        assert message == rest(v2_server, "POST", f"/v2/repository/models/simple/{path}").json()["error"]


def test_repository_load_and_unload_in_explicit_mode(start_server, repo: Path) -> None:
    write_model(
        repo,
        "disk",
        int32_config("disk"),
        {1: "class Model:\n    def execute(self, i):\n        return {'OUTPUT0': i['INPUT0'] + 1}\n"},
    )
    server = start_server(repo, extra_args=("--model-control-mode", "explicit"))
    infer = pb.ModelInferRequest(
        model_name="disk", inputs=[tensor("INPUT0", "INT32", [2], int_contents=[1, 2])]
    )
    grpc_error(server, lambda s: s.model_infer(infer), Status.NOT_FOUND, "disk")
    call(server, lambda s: s.repository_model_load(pb.RepositoryModelLoadRequest(model_name="disk")))
    assert outputs(call(server, lambda s: s.model_infer(infer))) == {"OUTPUT0": [2, 3]}

    config = json.dumps(
        {
            "name": "uploaded",
            "backend": "python",
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        }
    )
    code = b"class Model:\n    def execute(self, i):\n        return {'OUTPUT0': i['INPUT0'] * 10}\n"
    parameters = {
        "config": pb.ModelRepositoryParameter(string_param=config),
        "file:1/model.py": pb.ModelRepositoryParameter(bytes_param=code),
    }
    call(
        server,
        lambda s: s.repository_model_load(
            pb.RepositoryModelLoadRequest(model_name="uploaded", parameters=parameters)
        ),
    )
    infer.model_name = "uploaded"
    assert outputs(call(server, lambda s: s.model_infer(infer))) == {"OUTPUT0": [10, 20]}
    bad = {"config": pb.ModelRepositoryParameter(bytes_param=b"{}")}
    grpc_error(
        server,
        lambda s: s.repository_model_load(pb.RepositoryModelLoadRequest(model_name="x", parameters=bad)),
        Status.INVALID_ARGUMENT,
        "invalid value type for load parameter 'config', expected string_param.",
    )

    dependents = {"unload_dependents": pb.ModelRepositoryParameter(bool_param=True)}
    call(
        server,
        lambda s: s.repository_model_unload(
            pb.RepositoryModelUnloadRequest(model_name="disk", parameters=dependents)
        ),
    )
    assert not call(server, lambda s: s.model_ready(pb.ModelReadyRequest("disk"))).ready
    states = {
        m.name: m.state
        for m in call(server, lambda s: s.repository_index(pb.RepositoryIndexRequest())).models
    }
    assert states == {"disk": "UNAVAILABLE", "uploaded": "READY"}


# ------------------------------------------------------------------------ message size, shutdown

GROW_MODEL = """
import numpy as np


class Model:
    def execute(self, inputs):
        return {"OUTPUT0": np.tile(inputs["INPUT0"], 100)}
"""


def test_message_size_limit(start_server, repo: Path) -> None:
    write_model(repo, "grow", int32_config("grow"), {1: GROW_MODEL})
    server = start_server(repo, extra_args=("--grpc-max-message-bytes", "4096"))

    def request(n: int) -> pb.ModelInferRequest:
        return pb.ModelInferRequest(
            model_name="grow", inputs=[tensor("INPUT0", "INT32", [n])], raw_input_contents=[bytes(4 * n)]
        )

    async def over_then_under(stub: Stub) -> pb.ModelInferResponse:
        with pytest.raises(GRPCError) as excinfo:
            await stub.model_infer(request(2000))  # 8 KB in: refused, the connection lives on
        assert excinfo.value.status is Status.RESOURCE_EXHAUSTED
        assert "--grpc-max-message-bytes" in excinfo.value.message and "4096" in excinfo.value.message
        return await stub.model_infer(request(2))  # 800 bytes out

    assert outputs(call(server, over_then_under)) == {"OUTPUT0": [0] * 200}
    message = grpc_error(server, lambda s: s.model_infer(request(20)), Status.RESOURCE_EXHAUSTED, "4096")
    assert message.startswith("response message of 80")  # 8000 bytes of tensor and some metadata
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary(
            SERVICE + "ModelInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelInferResponse.parse,
        )
        with pytest.raises(grpc.RpcError) as excinfo:
            infer(request(2000), timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        streaming = channel.stream_stream(
            SERVICE + "ModelStreamInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelStreamInferResponse.parse,
        )
        answers = []
        with pytest.raises(grpc.RpcError) as excinfo:
            for answer in streaming(iter([request(2), request(2000)]), timeout=10):
                answers.append(answer)
        assert excinfo.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, "a too big message ends a stream"
        assert [outputs(a.infer_response) for a in answers] == [{"OUTPUT0": [0] * 200}]


SLOW_MODEL = """
import asyncio
from pathlib import Path


class Model:
    async def execute(self, inputs):
        (Path(__file__).parent / "started").write_text("started")
        await asyncio.sleep(1.0)
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""


def test_sigterm_lets_calls_in_flight_finish(start_server, repo: Path) -> None:
    write_model(repo, "slow", int32_config("slow"), {1: SLOW_MODEL})
    server = start_server(repo)
    started = repo / "slow" / "1" / "started"
    result: dict[str, Any] = {}

    async def in_flight(stub: Stub) -> None:
        opened = asyncio.Event()

        async def idle_stream() -> None:  # open, nothing in flight: it must not hold the exit up
            try:
                async with open_stream(stub) as idle:
                    await idle.send_request()
                    opened.set()
                    result["idle"] = await idle.recv_message()
            except GRPCError as e:
                result["idle_status"] = (e.status, e.message)

        idle = asyncio.create_task(idle_stream())
        await opened.wait()
        request = pb.ModelInferRequest(
            model_name="slow", inputs=[tensor("INPUT0", "INT32", [3], int_contents=[1, 2, 3])]
        )
        result["response"] = await stub.model_infer(request, timeout=20)
        await idle

    def run() -> None:
        try:
            call(server, in_flight)
        except Exception as e:  # reported by the main thread
            result["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not started.exists():
        assert time.monotonic() < deadline and worker.is_alive(), f"the slow model never started: {result}"
        time.sleep(0.01)
    signalled = time.monotonic()
    server.send_signal(signal.SIGTERM)
    assert wait_until_refused(("127.0.0.1", server.grpc_port), timeout=0.6) is not None, "still accepting"
    worker.join(timeout=15)
    assert "error" not in result, result
    assert outputs(result["response"]) == {"OUTPUT0": [2, 4, 6]}
    assert result["idle_status"][0] is Status.UNAVAILABLE and "shutting down" in result["idle_status"][1]
    assert server.wait(timeout=10) == 0
    assert time.monotonic() - signalled < 5, "the shutdown waited on the idle stream"


SLOW_FINALIZING = """
import asyncio
from pathlib import Path


class Model:
    async def execute(self, inputs):
        (Path(__file__).parent / "started").write_text("yes")
        await asyncio.sleep(2)
        return {"OUTPUT0": inputs["INPUT0"]}

    def finalize(self):
        (Path(__file__).parent / "finalized").write_text("yes")
"""


def test_an_unload_whose_call_is_cancelled_still_completes(start_server, repo: Path) -> None:
    """grpclib cancels a handler at its deadline: the unload it started must still drain, finalize the
    model and leave it UNAVAILABLE, not stuck UNLOADING."""
    write_model(
        repo, "slow", int32_config("slow", max_batch_size=4) + "dynamic_batching { }\n", {1: SLOW_FINALIZING}
    )
    server = start_server(repo, extra_args=("--model-control-mode", "explicit", "--load-model", "slow"))
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.base_url, timeout=15) as client:
        in_flight = pool.submit(client.post, "/v2/models/slow/infer", json=body)
        deadline = time.monotonic() + 10
        while not (repo / "slow" / "1" / "started").exists():  # the request is executing (2 s)
            assert time.monotonic() < deadline and not in_flight.done(), "the request never started"
            time.sleep(0.01)

        async def unload_with_a_short_deadline(stub: pb.GrpcInferenceServiceStub) -> str:
            request = pb.RepositoryModelUnloadRequest(model_name="slow")
            try:
                await stub.repository_model_unload(request, timeout=0.3)
            except (TimeoutError, GRPCError, asyncio.CancelledError) as e:
                return type(e).__name__
            return "answered"

        assert call(server, unload_with_a_short_deadline) != "answered"  # it waits for the 2 s request
        assert in_flight.result().status_code == 200
        deadline = time.monotonic() + 10
        while (state := client.post("/v2/repository/index").json()[0].get("state")) != "UNAVAILABLE":
            assert time.monotonic() < deadline, f"the model stayed {state}"
            time.sleep(0.05)
    assert (repo / "slow" / "1" / "finalized").read_text() == "yes"
