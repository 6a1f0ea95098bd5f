"""Triton's parameters and schedule_policy extensions end to end: custom request parameters reach the
model (our python API's `execute(inputs, parameters)`, Triton's `request.parameters()`, and every step
of an ensemble) without the reserved ones; requests batch only with others of the same parameters; the
dynamic batcher honours `priority` and `timeout` from REST and gRPC alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import ServerProcess, assert_error, stop_all, wait_for_file, wait_for_pending, write_model
from grpc_helpers import rest, stream
from grpclib.const import Status
from shm_helpers import grpcio_infer, rpc

import tensorgate.proto.inference as pb

SCALED = """
import json
import numpy as np

class Model:
    def execute(self, inputs, parameters):
        scale = parameters.get("scale", 1)
        rows = len(inputs["INPUT0"])
        seen = np.array([json.dumps(parameters, sort_keys=True).encode()] * rows, dtype=object)
        return {"OUTPUT0": inputs["INPUT0"] * scale, "SEEN": seen.reshape(rows, 1)}
"""
SCALED_CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }
]
%s
"""
STREAMING = """
class Model:
    async def execute_stream(self, inputs, parameters):
        for step in range(parameters.get("steps", 1)):
            yield {"OUTPUT0": inputs["INPUT0"] * step}
"""
STREAMING_CONFIG = """
name: "streaming"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""
TRITON_API = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            seen = np.array([[request.parameters().encode()]], dtype=object)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)]))
        return answers
"""
TRITON_CONFIG = """
name: "triton_api"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
ENSEMBLE = """
name: "scaled_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]
ensemble_scheduling { step [ {
  model_name: "scaled" model_version: -1
  input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "Y" }
} ] }
"""
# Records the order requests execute in (their tag, the first element); a negative tag holds the only
# instance until the test creates `release`.
ORDERED = """
import asyncio
from pathlib import Path

HERE = Path(__file__).parent

class Model:
    async def execute(self, inputs):
        tag = int(inputs["INPUT0"][0, 0])
        with open(HERE / "order.log", "a") as log:
            log.write(f"{tag}\\n")
        if tag < 0:
            (HERE / "started").write_text("started")
            while not (HERE / "release").exists():
                await asyncio.sleep(0.005)
        return {"OUTPUT0": inputs["INPUT0"]}
"""
ORDERED_CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
dynamic_batching {
  priority_levels: 2 default_priority_level: 2
  default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: true }
}
"""
WAIT_S = 15.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("parameters") / "models"
    repo.mkdir()
    write_model(repo, "scaled", SCALED_CONFIG % ("scaled", ""), {1: SCALED})
    batching = "dynamic_batching { max_queue_delay_microseconds: 1000000 }"
    write_model(repo, "scaled_batching", SCALED_CONFIG % ("scaled_batching", batching), {1: SCALED})
    write_model(repo, "triton_api", TRITON_CONFIG, {1: TRITON_API})
    write_model(repo, "streaming", STREAMING_CONFIG, {1: STREAMING})
    write_model(repo, "scaled_ensemble", ENSEMBLE, {1: None})
    for name in ("ordered_rest", "ordered_grpc"):
        write_model(repo, name, ORDERED_CONFIG % name, {1: ORDERED})
    return repo


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(models, models.parent / "server.log").start()
    yield process
    for name in ("ordered_rest", "ordered_grpc"):  # nothing may stay blocked at shutdown
        (models / name / "1" / "release").write_text("release")
    stop_all([process])


def infer(
    server: ServerProcess, model: str, values: list[int], parameters: dict | None = None
) -> httpx.Response:
    doc: dict = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": values}]}
    if parameters is not None:
        doc["parameters"] = parameters
    return rest(server, "POST", f"/v2/models/{model}/infer", json=doc)


def outputs(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


def grpc_request(
    model: str, values: list[int], parameters: dict[str, pb.InferParameter]
) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="INT32", shape=[1, 2])],
        raw_input_contents=[np.array(values, "<i4").tobytes()],
        parameters=parameters,
    )


# ------------------------------------------------------------------------------ custom parameters


def test_custom_parameters_reach_our_python_api_without_the_reserved_ones(server: ServerProcess) -> None:
    parameters = {"scale": 3, "mode": "fast", "ratio": 0.5, "flag": True, "priority": 1, "timeout": 5}
    got = outputs(infer(server, "scaled", [1, 2], parameters))
    assert got["OUTPUT0"] == [3, 6]
    assert json.loads(got["SEEN"][0]) == {"scale": 3, "mode": "fast", "ratio": 0.5, "flag": True}

    grpc_parameters = {
        "scale": pb.InferParameter(int64_param=4),
        "mode": pb.InferParameter(string_param="slow"),
        "priority": pb.InferParameter(uint64_param=1),
    }
    answer = rpc(server, "model_infer", grpc_request("scaled", [1, 2], grpc_parameters))
    assert np.frombuffer(answer.raw_output_contents[0], "<i4").tolist() == [4, 8]
    seen = answer.raw_output_contents[1][4:]  # one BYTES element: its 4-byte length, then the text
    assert json.loads(seen) == {"mode": "slow", "scale": 4}
    assert outputs(infer(server, "scaled", [1, 2]))["SEEN"] == ["{}"]


def test_custom_parameters_reach_a_streaming_model(server: ServerProcess) -> None:
    request = grpc_request("streaming", [1, 2], {"steps": pb.InferParameter(int64_param=3)})
    answers = stream(server, [request])
    got = [np.frombuffer(a.infer_response.raw_output_contents[0], "<i4").tolist() for a in answers]
    assert got == [[0, 0], [1, 2], [2, 4]]


def test_custom_parameters_reach_tritons_python_api(server: ServerProcess) -> None:
    got = outputs(infer(server, "triton_api", [1, 2], {"temperature": 0.5, "priority": 1, "sequence_id": 7}))
    assert json.loads(got["SEEN"][0]) == {"temperature": 0.5}


def test_an_ensemble_passes_its_custom_parameters_to_each_step(server: ServerProcess) -> None:
    doc = {
        "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [5, 6]}],
        "parameters": {"scale": 10},
    }
    assert outputs(rest(server, "POST", "/v2/models/scaled_ensemble/infer", json=doc))["Y"] == [50, 60]


def test_requests_batch_together_only_when_their_parameters_agree(server: ServerProcess) -> None:
    """Three requests with scale 2 queue, then three with scale 3: two batches (the first ends at the
    first request of other parameters, as a batch ends at the first that does not fit), each answer
    scaled by its own request's parameter."""
    before = rest(server, "GET", "/v2/models/scaled_batching/stats").json()["model_stats"][0][
        "execution_count"
    ]
    with ThreadPoolExecutor(6) as pool:
        twos = [pool.submit(infer, server, "scaled_batching", [1, 2], {"scale": 2}) for _ in range(3)]
        wait_for_pending(server, "scaled_batching", 3)
        threes = [pool.submit(infer, server, "scaled_batching", [1, 2], {"scale": 3}) for _ in range(3)]
        for scale, futures in ((2, twos), (3, threes)):
            for future in futures:
                assert outputs(future.result(WAIT_S))["OUTPUT0"] == [scale, 2 * scale]
    after = rest(server, "GET", "/v2/models/scaled_batching/stats").json()["model_stats"][0][
        "execution_count"
    ]
    assert after - before == 2


def test_a_triton_prefixed_parameter_is_refused_with_tritons_text(server: ServerProcess) -> None:
    response = infer(server, "scaled", [1, 2], {"triton_magic": 1})
    assert_error(response, 400, "parameter keys starting with 'triton_' are reserved for Triton usage")


# ------------------------------------------------------------------------------- schedule policy


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_a_higher_priority_request_overtakes_queued_ones(
    server: ServerProcess, models: Path, protocol: str
) -> None:
    """One instance held busy; requests queue at the default level (2), then one at priority 1: once
    the instance frees, the priority-1 request executes first."""
    model = f"ordered_{protocol}"
    folder = models / model / "1"

    def send(tag: int, priority: int | None = None) -> list[int]:
        if protocol == "rest":
            parameters = None if priority is None else {"priority": priority}
            return outputs(infer(server, model, [tag, tag], parameters))["OUTPUT0"]
        parameters = {} if priority is None else {"priority": pb.InferParameter(int64_param=priority)}
        answer = grpcio_infer(server, grpc_request(model, [tag, tag], parameters))
        return np.frombuffer(answer.raw_output_contents[0], "<i4").tolist()

    with ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(send, -1)
        wait_for_file(folder / "started", WAIT_S)
        low = [pool.submit(send, tag) for tag in (10, 11)]
        wait_for_pending(server, model, 2)
        high = pool.submit(send, 20, 1)
        wait_for_pending(server, model, 3)
        (folder / "release").write_text("release")
        assert blocker.result(WAIT_S) == [-1, -1]
        assert high.result(WAIT_S) == [20, 20] and sorted(f.result(WAIT_S)[0] for f in low) == [10, 11]
    order = [int(line) for line in (folder / "order.log").read_text().split()]
    assert order[:2] == [-1, 20], order


def test_a_timeout_from_grpc_expires_a_queued_request(server: ServerProcess, models: Path) -> None:
    model, folder = "ordered_grpc", models / "ordered_grpc" / "1"
    (folder / "release").unlink(missing_ok=True)
    (folder / "started").unlink(missing_ok=True)
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(infer, server, model, [-2, -2])
        wait_for_file(folder / "started", WAIT_S)
        parameters = {"timeout": pb.InferParameter(int64_param=50_000)}  # 50 ms instead of the 60 s default
        rpc(
            server,
            "model_infer",
            grpc_request(model, [30, 30], parameters),
            error=Status.UNAVAILABLE,
            message="Request timeout expired",
        )
        (folder / "release").write_text("release")
        assert outputs(blocker.result(WAIT_S))["OUTPUT0"] == [-2, -2]
    assert "30" not in (folder / "order.log").read_text().split()


def test_server_metadata_lists_schedule_policy_and_parameters(server: ServerProcess) -> None:
    rest_extensions = rest(server, "GET", "/v2").json()["extensions"]
    grpc_extensions = rpc(server, "server_metadata").extensions
    for name in ("schedule_policy", "parameters"):
        assert name in rest_extensions and name in grpc_extensions
