"""Triton's trace extension against a real server: the trace settings over REST and gRPC (global and per
model, Triton's fallbacks), traces in Triton's JSON trace format from REST and gRPC requests (the seven
timestamps in order, ensembles and BLS calls as child traces, tensors), sampling by rate and count,
log_frequency's numbered files and the file written at shutdown, and perf_analyzer's --trace-* options."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import ServerProcess, assert_error, missing
from grpc_helpers import call, grpc_error, stream, tensor
from grpclib.const import Status
from trace_helpers import COMPUTE, assert_in_order, infer, traces, write_trace_repository

import tensorgate.proto.inference as pb
from bench import perf_analyzer

OFF = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0"}


def post_setting(client: httpx.Client, path: str, fields: dict) -> dict:
    """POST a trace setting: answered 200 with the setting now in force."""
    response = client.post(path, json=fields)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def traced(start_server, repo: Path, tmp_path: Path) -> ServerProcess:
    """Every request traced (rate 1, TIMESTAMPS), each trace in a file of its own (log_frequency 1)."""
    write_trace_repository(repo)
    args = ("--trace-config", f"triton,file={tmp_path / 'trace.json'}", "--trace-config", "level=TIMESTAMPS")
    args += ("--trace-config", "rate=1", "--trace-config", "triton,log-frequency=1")
    return start_server(repo, extra_args=args)


def test_settings_over_rest_and_grpc_follow_tritons_fallbacks(
    start_server, repo: Path, tmp_path: Path
) -> None:
    write_trace_repository(repo)
    file = str(tmp_path / "trace.json")
    server = start_server(repo, extra_args=("--trace-config", f"triton,file={file}"))
    defaults = {**OFF, "trace_file": file, "trace_mode": "triton"}
    with httpx.Client(base_url=server.base_url) as client:
        assert client.get("/v2/trace/setting").json() == defaults
        # a model's first setting takes what it does not name from the global one
        model = post_setting(client, "/v2/models/double/trace/setting", {"trace_level": ["TIMESTAMPS"]})
        assert model == {**defaults, "trace_level": ["TIMESTAMPS"]}
        # the global setting changes: the model follows it where it set nothing itself
        changed = post_setting(client, "/v2/trace/setting", {"trace_rate": "10", "trace_count": 5})
        assert changed == {**defaults, "trace_rate": "10", "trace_count": "5"}
        assert client.get("/v2/models/double/trace/setting").json() == {
            **defaults,
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "10",
            "trace_count": "5",
        }
        assert client.get("/v2/models/inc/trace/setting").json() == changed  # no setting of its own
        # null clears a field: it follows the global setting again
        cleared = post_setting(client, "/v2/models/double/trace/setting", {"trace_level": None})
        assert cleared == changed
    # gRPC reads and changes the same settings; no value clears
    value = pb.TraceSettingRequestSettingValue
    request = pb.TraceSettingRequest(
        settings={"trace_level": value(["TIMESTAMPS", "TENSORS"]), "trace_rate": value([])}, model_name="inc"
    )
    answer = call(server, lambda stub: stub.trace_setting(request))
    settings = {name: list(v.value) for name, v in answer.settings.items()}
    expected = {name: [value] for name, value in changed.items()}  # the global setting's ...
    assert settings == {**expected, "trace_level": ["TIMESTAMPS", "TENSORS"]}  # ... but for its level
    with httpx.Client(base_url=server.base_url) as client:
        assert client.get("/v2/models/inc/trace/setting").json()["trace_level"] == ["TIMESTAMPS", "TENSORS"]


def test_bad_trace_settings_get_tritons_errors(start_server, repo: Path) -> None:
    write_trace_repository(repo)
    server = start_server(repo)  # no trace file: tracing cannot be turned on
    with httpx.Client(base_url=server.base_url) as client:
        post = client.post
        assert_error(post("/v2/trace/setting", json={"trace_file": "/tmp/x"}), 501, "trace file location")
        assert_error(
            post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]}),
            400,
            "Attempting to set invalid trace setting :trace file name is not given",
        )
        assert_error(
            post("/v2/trace/setting", json={"trace_level": ["OFF", "TENSORS"]}),
            400,
            "Expect only one trace level 'OFF' is specified",
        )
        assert_error(
            post("/v2/trace/setting", json={"trace_level": ["LOUD"]}), 400, "unknown trace level 'LOUD'"
        )
        assert_error(
            post("/v2/trace/setting", json={"trace_rate": "ten"}),
            400,
            "Unable to parse 'trace_rate', got: ten",
        )
        assert_error(
            post("/v2/trace/setting", json={"trace_count": "-2"}),
            400,
            "Unable to parse 'trace_count'. Expecting value >= -1, got: -2",
        )
        assert_error(
            post("/v2/trace/setting", json={"log_frequency": "4294967296"}),
            400,
            "value is out of range [ 0, 4294967295 ]",
        )
        assert_error(client.get("/v2/models/nosuch/trace/setting"), 400, "Request for unknown model : nosuch")
        assert client.get("/v2/trace/setting").json()["trace_level"] == ["OFF"]  # nothing changed
    value = pb.TraceSettingRequestSettingValue
    two = pb.TraceSettingRequest(settings={"trace_rate": value(["1", "2"])})
    grpc_error(server, lambda stub: stub.trace_setting(two), Status.INVALID_ARGUMENT, "expect only 1 value")
    unknown = pb.TraceSettingRequest(model_name="nosuch")
    grpc_error(server, lambda stub: stub.trace_setting(unknown), Status.INVALID_ARGUMENT, "unknown model")


def test_a_traced_request_has_tritons_seven_timestamps(traced: ServerProcess, tmp_path: Path) -> None:
    with httpx.Client(base_url=traced.base_url) as client:
        assert infer(client, "double", [1, 2], id="req-7") == [2, 4]
        assert infer(client, "batched", [3]) == [6]  # through the dynamic batcher
    (first,) = traces(tmp_path / "trace.json.0").values()
    assert first["model_name"] == "double" and first["model_version"] == 1
    assert first["request_id"] == "req-7" and "parent_id" not in first
    assert_in_order(first)
    (batched,) = traces(tmp_path / "trace.json.1").values()
    assert batched["model_name"] == "batched"
    assert_in_order(batched)
    # over gRPC too
    request = pb.ModelInferRequest(
        model_name="double",
        inputs=[tensor("INPUT0", "INT32", [2])],
        raw_input_contents=[np.array([5, 6], "<i4").tobytes()],
    )
    call(traced, lambda stub: stub.model_infer(request))
    (over_grpc,) = traces(tmp_path / "trace.json.2").values()
    assert over_grpc["model_name"] == "double"
    assert_in_order(over_grpc)
    # and each request of a ModelStreamInfer stream
    answers = stream(traced, [request, request])
    assert [answer.error_message for answer in answers] == ["", ""]
    for index in (3, 4):
        (streamed,) = traces(tmp_path / f"trace.json.{index}").values()
        assert_in_order(streamed)


def test_requests_of_a_sequence_are_traced_through_either_strategy(
    traced: ServerProcess, tmp_path: Path
) -> None:
    with httpx.Client(base_url=traced.base_url) as client:
        for index, model in enumerate(("direct", "oldest")):
            parameters = {"sequence_id": 5, "sequence_start": True, "sequence_end": True}
            assert infer(client, model, [4], parameters=parameters) == [8]
            (one,) = traces(tmp_path / f"trace.json.{index}").values()
            assert one["model_name"] == model
            assert_in_order(one)


def test_ensemble_steps_and_bls_calls_are_child_traces(traced: ServerProcess, tmp_path: Path) -> None:
    with httpx.Client(base_url=traced.base_url) as client:
        assert infer(client, "pipe", [1, 2]) == [3, 5]
        assert infer(client, "bls", [4]) == [9]
    pipe = traces(tmp_path / "trace.json.0")
    (parent,) = [t for t in pipe.values() if t["model_name"] == "pipe"]
    steps = {t["model_name"]: t for t in pipe.values() if t.get("parent_id")}
    assert set(steps) == {"double", "inc"}
    ensemble_id = next(i for i, t in pipe.items() if t["model_name"] == "pipe")
    assert all(step["parent_id"] == ensemble_id for step in steps.values())
    assert_in_order(parent)
    for step in steps.values():
        assert_in_order(step)
        # each step ran inside the ensemble's request
        assert parent["timestamps"]["REQUEST_START"] <= step["timestamps"]["REQUEST_START"]
        assert step["timestamps"]["REQUEST_END"] <= parent["timestamps"]["REQUEST_END"]
    assert steps["double"]["timestamps"]["REQUEST_END"] <= steps["inc"]["timestamps"]["REQUEST_START"]
    # BLS: the call given request.trace() is a child; the one without is not traced
    bls = traces(tmp_path / "trace.json.1")
    assert sorted(t["model_name"] for t in bls.values()) == ["bls", "double"]
    (child,) = [t for t in bls.values() if t["model_name"] == "double"]
    assert child["parent_id"] == next(i for i, t in bls.items() if t["model_name"] == "bls")


def test_tensors_level_records_inputs_and_outputs(traced: ServerProcess, tmp_path: Path) -> None:
    with httpx.Client(base_url=traced.base_url) as client:
        tensors = post_setting(client, "/v2/trace/setting", {"trace_level": ["TENSORS"]})
        assert tensors["trace_level"] == ["TENSORS"]
        infer(client, "double", [1, -2, 3])
    (trace,) = traces(tmp_path / "trace.json.0").values()
    assert trace["timestamps"] == {}  # TENSORS alone
    assert trace["tensors"] == [
        {
            "id": trace["tensors"][0]["id"],
            "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "INPUT0", "data": "1,-2,3", "shape": "3", "dtype": "INT32"},
        },
        {
            "id": trace["tensors"][0]["id"],
            "activity": "TENSOR_BACKEND_OUTPUT",
            "tensor": {"name": "OUTPUT0", "data": "2,-4,6", "shape": "3", "dtype": "INT32"},
        },
    ]


def test_rate_count_and_the_file_written_at_shutdown(start_server, repo: Path, tmp_path: Path) -> None:
    """rate 2, count 2: the 2nd and 4th requests are traced, then none; with log_frequency 0 the traces
    are kept until the count runs out, then written to the first numbered file; a model's own setting with
    log_frequency 0 writes to the trace file itself at shutdown."""
    write_trace_repository(repo)
    file = tmp_path / "trace.json"
    args = ("--trace-config", f"triton,file={file}", "--trace-config", "level=TIMESTAMPS")
    server = start_server(repo, extra_args=(*args, "--trace-config", "rate=2", "--trace-config", "count=2"))
    with httpx.Client(base_url=server.base_url) as client:
        for value in range(6):
            infer(client, "double", [value], id=f"r{value}")
        assert client.get("/v2/trace/setting").json()["trace_count"] == "0"
        numbered = traces(tmp_path / "trace.json.0")
        assert sorted(t["request_id"] for t in numbered.values()) == ["r1", "r3"]
        inc = post_setting(client, "/v2/models/inc/trace/setting", {"trace_rate": "1", "trace_count": "-1"})
        assert (inc["trace_rate"], inc["trace_count"]) == ("1", "-1")
        infer(client, "inc", [1], id="at-shutdown")
        assert not file.exists()  # log_frequency 0: kept until shutdown
    server.stop()
    assert [t["request_id"] for t in traces(file).values()] == ["at-shutdown"]


def test_a_request_that_fails_is_traced_to_its_end(traced: ServerProcess, tmp_path: Path) -> None:
    with httpx.Client(base_url=traced.base_url) as client:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        assert client.post("/v2/models/double/infer", json=body).status_code == 400
        infer(client, "double", [1])
    (failed,) = traces(tmp_path / "trace.json.0").values()
    # the model's two, within the front end's (its error answer is sent, no response was encoded)
    assert list(failed["timestamps"]) == [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "REQUEST_START",
        "REQUEST_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]
    assert_in_order(traces(tmp_path / "trace.json.1").popitem()[1])


@pytest.fixture
def pa() -> None:
    why = perf_analyzer.install()
    if why:
        missing(why)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_trace_options(
    pa: None, start_server, repo: Path, tmp_path: Path, protocol: str
) -> None:
    """perf_analyzer --trace-level/--trace-rate/--trace-count/--log-frequency set the trace setting of the
    model it measures, and the server then writes traces of its requests."""
    write_trace_repository(repo)
    server = start_server(repo, extra_args=("--trace-config", f"triton,file={tmp_path / 'trace.json'}"))
    port = server.port if protocol == "http" else server.grpc_port
    args = ["-m", "double", "-u", f"127.0.0.1:{port}", "-i", protocol, "--shape", "INPUT0:4"]
    args += [
        "--trace-level",
        "TIMESTAMPS",
        "--trace-rate",
        "10",
        "--trace-count",
        "4",
        "--log-frequency",
        "2",
    ]
    done = perf_analyzer.run(args, seconds=0.5, csv_path=tmp_path / "out.csv")
    assert done.returncode == 0, done.output[-3000:]
    with httpx.Client(base_url=server.base_url) as client:
        setting = client.get("/v2/models/double/trace/setting").json()
    assert setting["trace_level"] == ["TIMESTAMPS"] and setting["trace_rate"] == "10"
    assert setting["log_frequency"] == "2" and setting["trace_count"] == "0"  # all four taken
    written = {**traces(tmp_path / "trace.json.0"), **traces(tmp_path / "trace.json.1")}
    assert len(written) == 4 and all(t["model_name"] == "double" for t in written.values())
    for trace in written.values():
        assert_in_order(trace)
    assert set(COMPUTE) <= set(next(iter(written.values()))["timestamps"])
