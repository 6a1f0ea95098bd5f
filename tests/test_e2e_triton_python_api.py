"""The rest of Triton's python API, end to end: a model that loads, checks, calls and unloads another
model (pb_utils.load_model, is_model_ready, unload_model; explicit model control, refused in `none` mode
with Triton's text), `request.is_cancelled()` of a plain request whose client went away, and the
`response_stats` of a decoupled model's statistics over REST and gRPC. Each model runs with its
instances in threads of the server and in processes of their own."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import ServerProcess, stop_all, wait_for_file, write_model
from grpc_helpers import call, open_stream, stream, tensor
from grpclib.exceptions import GRPCError

import tensorgate.proto.inference as pb

MODES = ["thread", "process"]


def in_mode(config: str, mode: str) -> str:
    return config + f'parameters {{ key: "EXECUTION_MODE" value: {{ string_value: "{mode}" }} }}\n'


CALLEE = """
name: "callee"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
CALLEE_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        doubled = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2 for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]) for y in doubled]
"""

# Loads `callee`, checks it is ready, calls it, unloads it: what it saw, as a JSON document.
LOADER = """
name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
LOADER_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

def attempt(call, *args):
    try:
        return call(*args)
    except pb_utils.TritonModelException as e:
        return "error: " + e.message()

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            info = {"ready_before": pb_utils.is_model_ready("callee")}
            info["load"] = attempt(pb_utils.load_model, "callee")
            info["ready"] = pb_utils.is_model_ready("callee")
            info["ready_v1"] = pb_utils.is_model_ready("callee", "1")
            info["ready_v7"] = pb_utils.is_model_ready("callee", "7")
            info["bad_version"] = attempt(pb_utils.is_model_ready, "callee", "one")
            call = pb_utils.InferenceRequest(
                model_name="callee", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
            )
            answer = call.exec()
            info["called"] = (
                answer.error().message() if answer.has_error()
                else pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy().tolist()
            )
            info["unload"] = attempt(pb_utils.unload_model, "callee")
            info["ready_after"] = pb_utils.is_model_ready("callee")
            info["unknown"] = pb_utils.is_model_ready("no_such_model")
            document = np.array([json.dumps(info).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", document)]))
        return responses
"""

# initialize loads a model of its own making (config and files given), as Triton's README example does;
# execute answers whether it is ready and what it answers.
INIT_LOADER_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

CONFIG = {
    "name": "made", "backend": "python", "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [-1]}],
    "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [-1]}],
}

class TritonPythonModel:
    def initialize(self, args):
        files = {"1/model.py": MODEL_PY.encode()}
        pb_utils.load_model("made", config=json.dumps(CONFIG), files=files)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(model_name="made", inputs=[x], requested_output_names=["Y"])
            y = pb_utils.get_output_tensor_by_name(call.exec(), "Y").as_numpy().tolist()
            info = {"ready": pb_utils.is_model_ready("made"), "called": y}
            document = np.array([json.dumps(info).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", document)]))
        return responses
"""

# Polls is_cancelled() until its client goes away, then writes its marker file.
PATIENT = """
name: "%s"
backend: "python"
max_batch_size: %d
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
parameters { key: "marker" value: { string_value: "%s" } }
%s
"""
PATIENT_PY = """
import json, time
from pathlib import Path
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = Path(config["parameters"]["marker"]["string_value"])

    def execute(self, requests):
        Path(str(self.marker) + ".started").write_text("executing")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(r.is_cancelled() for r in requests):
            time.sleep(0.01)
        if all(r.is_cancelled() for r in requests):  # written whole, then named: a reader never sees it empty
            partial = Path(str(self.marker) + ".partial")
            partial.write_text("cancelled")
            partial.replace(self.marker)
        error = pb_utils.TritonError("the client went away", pb_utils.TritonError.CANCELLED)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
"""


def info(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return json.loads(response.json()["outputs"][0]["data"][0])


def x_body(values: list[int], batched: bool = False) -> dict:
    shape = [1, len(values)] if batched else [len(values)]
    return {"inputs": [{"name": "X", "datatype": "INT32", "shape": shape, "data": values}]}


# N responses, each its own send(), then the final flag alone (an empty response); N < 0: one error.
COUNTDOWN = """
name: "%s"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
COUNTDOWN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            if n < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("N < 0")), flags=final)
                continue
            for i in range(n, 0, -1):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
            sender.send(flags=final)
        return None
"""


# One response, then waits for its client to leave (its marker file says it saw it go).
LINGERING_PY = """
import json, time
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = Path(config["parameters"]["marker"]["string_value"])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([1], np.int32))]))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not sender.is_cancelled():
                time.sleep(0.01)
            if sender.is_cancelled():
                self.marker.write_text("cancelled")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Path:
    repository = tmp_path_factory.mktemp("api_models")
    write_model(repository, "callee", CALLEE, {1: CALLEE_PY})
    for mode in MODES:
        write_model(repository, f"loader_{mode}", in_mode(LOADER % f"loader_{mode}", mode), {1: LOADER_PY})
        for batching in ("", "dynamic_batching { }"):
            name = f"patient_{mode}" + ("_batched" if batching else "")
            config = PATIENT % (name, 4 if batching else 0, markers / name, batching)
            write_model(repository, name, in_mode(config, mode), {1: PATIENT_PY})
        name = f"countdown_{mode}"
        write_model(repository, name, in_mode(COUNTDOWN % name, mode), {1: COUNTDOWN_PY})
        name = f"lingering_{mode}"
        config = (
            COUNTDOWN % name
            + f'parameters {{ key: "marker" value: {{ string_value: "{markers / name}" }} }}\n'
        )
        write_model(repository, name, in_mode(config, mode), {1: LINGERING_PY})
        name = f"init_loader_{mode}"
        code = INIT_LOADER_PY.replace("MODEL_PY", repr(CALLEE_PY))
        write_model(repository, name, in_mode(LOADER % name, mode), {1: code})
    return repository


@pytest.fixture(scope="module")
def explicit(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("explicit") / "server.log"
    loads = [arg for mode in MODES for arg in ("--load-model", f"loader_{mode}")]
    patients = [f"patient_{mode}{suffix}" for mode in MODES for suffix in ("", "_batched")]
    patients += [f"{kind}_{mode}" for mode in MODES for kind in ("countdown", "init_loader", "lingering")]
    loads += [arg for name in patients for arg in ("--load-model", name)]
    server = ServerProcess(repository, log, extra_args=("--model-control-mode", "explicit", *loads)).start()
    yield server
    stop_all([server])


@pytest.mark.parametrize("mode", MODES)
def test_a_model_loads_calls_and_unloads_another(explicit: ServerProcess, mode: str) -> None:
    with httpx.Client(base_url=explicit.base_url, timeout=60) as client:
        assert client.get("/v2/models/callee/ready").status_code != 200  # not loaded
        seen = info(client.post(f"/v2/models/loader_{mode}/infer", json=x_body([1, 2, 3])))
        assert seen["ready_before"] is False
        assert seen["load"] is None
        assert seen["ready"] is True and seen["ready_v1"] is True
        assert seen["ready_v7"] is False
        assert seen["bad_version"].startswith(
            "error: Failed to check model readiness: failed to get model version from specified version "
            "string 'one'"
        )
        assert seen["called"] == [2, 4, 6]
        assert seen["unload"] is None
        assert seen["ready_after"] is False
        assert seen["unknown"] is False
        # the server's view agrees: unloaded, as the repository index says
        index = client.post("/v2/repository/index").json()
        assert {"name": "callee", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index


@pytest.mark.parametrize("mode", MODES)
def test_initialize_loads_a_model_given_its_config_and_files(explicit: ServerProcess, mode: str) -> None:
    with httpx.Client(base_url=explicit.base_url, timeout=60) as client:
        assert client.get("/v2/models/made/ready").status_code == 200
        seen = info(client.post(f"/v2/models/init_loader_{mode}/infer", json=x_body([4, 5])))
    assert seen == {"ready": True, "called": [8, 10]}


def test_load_refused_without_explicit_model_control(repository: Path, tmp_path: Path) -> None:
    server = ServerProcess(repository, tmp_path / "server.log").start()
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            for mode in MODES:
                seen = info(client.post(f"/v2/models/loader_{mode}/infer", json=x_body([5])))
                assert seen["load"].startswith(
                    "error: Failed to load model: explicit model load / unload is not allowed"
                )
                assert seen["unload"].startswith(
                    "error: Failed to unload model: explicit model load / unload is not allowed"
                )
                assert seen["ready"] is True  # loaded at start, as everything is in `none` mode
                assert seen["called"] == [10]
    finally:
        stop_all([server])


@pytest.mark.parametrize("batched", [False, True], ids=["direct", "dynamic"])
@pytest.mark.parametrize("mode", MODES)
def test_is_cancelled_once_the_client_goes_away(
    explicit: ServerProcess, markers: Path, mode: str, batched: bool
) -> None:
    name = f"patient_{mode}" + ("_batched" if batched else "")
    marker = markers / name
    leave_during_execute(explicit, name, batched)
    assert Path(str(marker) + ".started").exists()  # it was executing when the client left
    wait_for_file(marker, timeout=20)
    assert marker.read_text() == "cancelled"
    # the model's instance is free again: the next request executes, and is cancelled in turn
    marker.unlink()
    leave_during_execute(explicit, name, batched)
    wait_for_file(marker, timeout=20)


@pytest.mark.parametrize("mode", MODES)
def test_is_cancelled_once_a_grpc_deadline_passes(explicit: ServerProcess, markers: Path, mode: str) -> None:
    name = f"patient_{mode}"
    marker = markers / name
    marker.unlink(missing_ok=True)
    request = pb.ModelInferRequest(
        model_name=name,
        inputs=[tensor("X", "INT32", [1])],
        raw_input_contents=[np.array([1], "<i4").tobytes()],
    )

    async def infer(stub) -> None:
        await stub.model_infer(request, timeout=2)

    with pytest.raises((GRPCError, asyncio.TimeoutError)):
        call(explicit, infer)
    wait_for_file(marker, timeout=20)
    assert marker.read_text() == "cancelled"


def leave_during_execute(server: ServerProcess, name: str, batched: bool) -> None:
    """A request whose client gives up waiting for its answer (a read timeout closes its connection)."""
    timeout = httpx.Timeout(60, read=2)
    client = httpx.Client(base_url=server.base_url, timeout=timeout)
    with client, pytest.raises(httpx.ReadTimeout):
        client.post(f"/v2/models/{name}/infer", json=x_body([1], batched))


@pytest.mark.parametrize("mode", MODES)
def test_response_stats_of_a_decoupled_model(explicit: ServerProcess, mode: str) -> None:
    name = f"countdown_{mode}"

    def request(n: int) -> pb.ModelInferRequest:
        return pb.ModelInferRequest(
            model_name=name,
            inputs=[tensor("N", "INT32", [1])],
            raw_input_contents=[np.array([n], "<i4").tobytes()],
        )

    # 3 + 1 + 2 responses with outputs, each request's FINAL flag alone after them, one error response
    answers = stream(explicit, [request(3), request(1), request(2), request(-1)])
    assert sum(1 for a in answers if not a.error_message) == 6
    assert [a.error_message for a in answers if a.error_message] == ["N < 0"]

    with httpx.Client(base_url=explicit.base_url, timeout=20) as client:
        rest = client.get(f"/v2/models/{name}/stats").json()["model_stats"][0]["response_stats"]
    counts = {
        key: {kind: entry[kind]["count"] for kind in ("success", "fail", "empty_response", "cancel")}
        for key, entry in rest.items()
    }
    assert counts == {
        "0": {"success": 3, "fail": 1, "empty_response": 0, "cancel": 0},
        "1": {"success": 2, "fail": 0, "empty_response": 1, "cancel": 0},  # the second request's FINAL
        "2": {"success": 1, "fail": 0, "empty_response": 1, "cancel": 0},
        "3": {"success": 0, "fail": 0, "empty_response": 1, "cancel": 0},
    }
    for entry in rest.values():
        inferred = entry["success"]["count"] + entry["fail"]["count"] + entry["empty_response"]["count"]
        assert entry["compute_infer"]["count"] == inferred
        assert entry["compute_output"]["count"] == entry["success"]["count"]
        assert entry["success"]["ns"] >= entry["compute_output"]["ns"] >= 0

    # gRPC ModelStatistics: the same counts, wire-identical to Triton's response_stats
    async def statistics(stub) -> pb.ModelStatisticsResponse:
        return await stub.model_statistics(pb.ModelStatisticsRequest(name=name))

    grpc_stats = call(explicit, statistics).model_stats[0].response_stats
    assert sorted(grpc_stats) == ["0", "1", "2", "3"]
    for key, entry in grpc_stats.items():
        assert entry.success.count == rest[key]["success"]["count"]
        assert entry.empty_response.count == rest[key]["empty_response"]["count"]
        assert entry.fail.count == rest[key]["fail"]["count"]
        assert entry.compute_infer.count == rest[key]["compute_infer"]["count"]

    # a model that does not stream has none
    with httpx.Client(base_url=explicit.base_url, timeout=20) as client:
        plain = client.get("/v2/models/loader_thread/stats").json()["model_stats"][0]
    assert plain["response_stats"] == {}


@pytest.mark.parametrize("mode", MODES)
def test_response_stats_count_a_cancelled_stream(explicit: ServerProcess, markers: Path, mode: str) -> None:
    name = f"lingering_{mode}"

    async def leave_after_one(stub) -> list[int]:
        async with open_stream(stub) as s:
            raw = [np.array([1], "<i4").tobytes()]
            await s.send_message(
                pb.ModelInferRequest(
                    model_name=name, inputs=[tensor("N", "INT32", [1])], raw_input_contents=raw
                )
            )
            first = await s.recv_message()
            await s.cancel()
        return np.frombuffer(first.infer_response.raw_output_contents[0], "<i4").tolist()

    assert call(explicit, leave_after_one) == [1]
    wait_for_file(markers / name, timeout=20)

    def counted() -> dict:
        with httpx.Client(base_url=explicit.base_url, timeout=20) as client:
            stats = client.get(f"/v2/models/{name}/stats").json()["model_stats"][0]["response_stats"]
        return {key: (entry["success"]["count"], entry["cancel"]["count"]) for key, entry in stats.items()}

    deadline = time.monotonic() + 10  # the stream's end is counted as the server closes it
    while counted() != {"0": (1, 0), "1": (0, 1)}:
        assert time.monotonic() < deadline, counted()
        time.sleep(0.05)
