"""Models written for Triton's python backend, run unchanged (`import triton_python_backend_utils`):
execute(requests) with dynamic batching, per-request errors, initialize's args, every pb_utils call a
model makes, decoupled models over every streaming path, BLS (exec, async_exec, decoupled), and
auto_complete_config. A real server; REST, grpclib and grps clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import e2e_helpers
import httpx
import numpy as np
import pytest
from e2e_helpers import ServerProcess, assert_error, stop_all, write_model
from grpc_helpers import call, tensor
from grps_helpers import gtensor, streamed

import tensorgate.proto.inference as pb
from tensorgate.server.backends import pb_utils

ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
dynamic_batching { max_queue_delay_microseconds: 200000 preferred_batch_size: [ 4 ] }
"""
ADD_SUB_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if (a < 0).any():
                error = pb_utils.TritonError("INPUT0 must not be negative", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
# add_sub for four requests that must share a batch: it goes once four are queued (the delay, long, is
# only there so that the batch does not go before the fourth arrives).
ADD_SUB_FOUR = ADD_SUB.replace('name: "add_sub"', 'name: "add_sub_four"').replace(
    "max_queue_delay_microseconds: 200000", "max_queue_delay_microseconds: 30000000"
)

# Answers what it was given, as a BYTES JSON document: every accessor of a request and of initialize's
# args, and the helpers, so a test can check each against what the client sent.
INTROSPECT = """
name: "introspect"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] }
]
parameters { key: "marker" value: { string_value: "%s" } }
"""
INTROSPECT_PY = """
import json
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.config = json.loads(args["model_config"])
        pb_utils.Logger.log_info("introspect initialized")
        pb_utils.Logger.log_warn("introspect warns")
        pb_utils.Logger.log("introspect error level", pb_utils.LogLevel.ERROR)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            s = pb_utils.get_input_tensor_by_name(request, "S")
            via_torch = torch.from_dlpack(x.to_dlpack()) * 2
            back = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(via_torch))
            info = {
                "args": {k: v for k, v in self.args.items() if k != "model_config"},
                "config_name": self.config["name"],
                "request_id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "requested": request.requested_output_names(),
                "inputs": [[t.name(), t.shape(), t.triton_dtype(), t.is_cpu()] for t in request.inputs()],
                "text": [v.decode() for v in s.as_numpy().tolist()],
                "missing": pb_utils.get_input_tensor_by_name(request, "nope") is None,
                "info_type": str(np.dtype(pb_utils.triton_string_to_numpy(
                    pb_utils.get_output_config_by_name(self.config, "INFO")["data_type"]))),
                "x_type": str(np.dtype(pb_utils.triton_string_to_numpy(
                    pb_utils.get_input_config_by_name(self.config, "X")["data_type"]))),
                "model": [request.model_name(), request.model_version()],
            }
            text = np.array([json.dumps(info).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", text), back]))
        return responses

    def finalize(self):
        path = self.config["parameters"]["marker"]["string_value"]
        with open(path, "w") as f:
            f.write("finalized")
"""

DECOUPLED = """
name: "countdown"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Answers from a thread of its own after execute returned, as Triton's decoupled examples do; N < 0 is
# answered with an error response.
DECOUPLED_PY = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.answer, args=(n, sender)).start()
        return None

    def answer(self, n, sender):
        if n < 0:
            error = pb_utils.TritonError("N must be at least 0")
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)
            return
        for i in range(n, 0, -1):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

BLS = """
name: "%s"
backend: "python"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 1, 4 ] },
  { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 1, 4 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""
# Calls TARGET (add_sub with X twice, asking for OUTPUT0 only) and answers its OUTPUT0; an error
# response from the call becomes this model's error response. COUNT: the answers of a decoupled call of
# countdown with N = 3.
BLS_SYNC_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            call = pb_utils.InferenceRequest(
                model_name=target,
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
                requested_output_names=["OUTPUT0"],
            )
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            names = [t.name() for t in answer.output_tensors()]
            assert names == ["OUTPUT0"], names
            countdown = pb_utils.InferenceRequest(
                model_name="countdown", inputs=[pb_utils.Tensor("N", np.array([3], np.int32))],
                requested_output_names=["I"],
            )
            count = len(list(countdown.exec(decoupled=True)))
            y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", y), pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
"""
BLS_ASYNC_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            calls = [
                pb_utils.InferenceRequest(
                    model_name=target,
                    inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
                    requested_output_names=["OUTPUT0"],
                ).async_exec()
                for _ in range(2)
            ]
            first, second = await asyncio.gather(*calls)
            if first.has_error():
                responses.append(pb_utils.InferenceResponse(error=first.error()))
                continue
            countdown = pb_utils.InferenceRequest(
                model_name="countdown", inputs=[pb_utils.Tensor("N", np.array([3], np.int32))],
                requested_output_names=["I"],
            )
            count = len([r async for r in await countdown.async_exec(decoupled=True)])
            y = pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
            assert (y == pb_utils.get_output_tensor_by_name(second, "OUTPUT0").as_numpy()).all()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", y), pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
"""

AUTO = """
name: "auto"
backend: "python"
"""
AUTO_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(16)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        answers = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values * 10)]))
        return answers
"""

FROM_IMPORT_PY = """
from triton_python_backend_utils import InferenceResponse, Tensor, get_input_tensor_by_name

class TritonPythonModel:
    def execute(self, requests):
        return [InferenceResponse([Tensor("OUTPUT0", get_input_tensor_by_name(r, "INPUT0").as_numpy() + 1)])
                for r in requests]
"""

WRONG_COUNT_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return []
"""
RAISES_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("the model gave up")
"""
ONE_OUTPUT = """
name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "finalized"


def in_mode(config: str, mode: str) -> str:
    """A python model's config run in `mode`: each instance a process, or threads of the server's."""
    return config + f'parameters {{ key: "EXECUTION_MODE" value: {{ string_value: "{mode}" }} }}\n'


# Every test of a model of this module runs with its instances in threads of the server and in processes
# of their own (server/backends/process.py).
@pytest.fixture(scope="module", params=["thread", "process"])
def server(
    tmp_path_factory: pytest.TempPathFactory, marker: Path, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("triton_models")
    mode = request.param

    def write_model(repository: Path, name: str, config: str, versions: dict) -> None:
        e2e_helpers.write_model(repository, name, in_mode(config, mode), versions)

    write_model(repository, "add_sub", ADD_SUB, {1: ADD_SUB_PY})
    write_model(repository, "add_sub_four", ADD_SUB_FOUR, {1: ADD_SUB_PY})
    write_model(repository, "introspect", INTROSPECT % marker, {1: INTROSPECT_PY})
    write_model(repository, "countdown", DECOUPLED, {1: DECOUPLED_PY})
    write_model(repository, "bls_sync", BLS % "bls_sync", {1: BLS_SYNC_PY})
    write_model(repository, "bls_async", BLS % "bls_async", {1: BLS_ASYNC_PY})
    write_model(repository, "auto", AUTO, {1: AUTO_PY})
    write_model(repository, "wrong_count", ONE_OUTPUT % "wrong_count", {1: WRONG_COUNT_PY})
    write_model(repository, "raises", ONE_OUTPUT % "raises", {1: RAISES_PY})
    write_model(repository, "from_import", ONE_OUTPUT % "from_import", {1: FROM_IMPORT_PY})
    log = tmp_path_factory.mktemp("triton_server") / "server.log"
    server = ServerProcess(repository, log).start()
    yield server
    stop_all([server])


def infer(server: ServerProcess, model: str, inputs: list[dict], **fields) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        return client.post(f"/v2/models/{model}/infer", json={"inputs": inputs, **fields})


def fp32(name: str, values: list, shape: list[int]) -> dict:
    return {"name": name, "datatype": "FP32", "shape": shape, "data": values}


def outputs_of(response: httpx.Response) -> dict[str, list]:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


# ------------------------------------------------------------------------------------------ execute


def test_execute_gets_the_requests_of_a_batch_apart_and_answers_each(server: ServerProcess) -> None:
    rows = [[float(i), 1.0, 2.0, 3.0] for i in range(8)]

    def one(row: list[float]) -> dict:
        return outputs_of(
            infer(server, "add_sub", [fp32("INPUT0", row, [1, 4]), fp32("INPUT1", [1.0] * 4, [1, 4])])
        )

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, rows))
    for row, answer in zip(rows, answers, strict=True):
        assert answer == {"OUTPUT0": [v + 1 for v in row], "OUTPUT1": [v - 1 for v in row]}
    stats = httpx.get(f"{server.base_url}/v2/models/add_sub/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 8
    assert stats["execution_count"] < 8  # several requests reached one execute(requests)


def test_an_error_response_fails_its_request_alone(server: ServerProcess) -> None:
    bad = [fp32("INPUT0", [-1.0] * 4, [1, 4]), fp32("INPUT1", [0.0] * 4, [1, 4])]
    good = [fp32("INPUT0", [1.0] * 4, [1, 4]), fp32("INPUT1", [1.0] * 4, [1, 4])]
    with ThreadPoolExecutor(4) as pool:  # the four share a batch (preferred_batch_size 4)
        answers = list(pool.map(lambda inputs: infer(server, "add_sub_four", inputs), [bad, good, good, bad]))
    assert_error(answers[0], 400, "INPUT0 must not be negative")
    assert_error(answers[3], 400, "INPUT0 must not be negative")
    assert outputs_of(answers[1]) == outputs_of(answers[2]) == {"OUTPUT0": [2.0] * 4, "OUTPUT1": [0.0] * 4}
    stats = httpx.get(f"{server.base_url}/v2/models/add_sub_four/stats").json()["model_stats"][0]
    assert stats["execution_count"] == 1, stats  # one execute(requests) for the four
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(4, 1)], stats


def test_a_wrong_number_of_responses_or_an_exception_fails_the_batch(server: ServerProcess) -> None:
    one = [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]
    assert_error(infer(server, "wrong_count", one), 500, "one InferenceResponse per request (1), got 0")
    assert_error(infer(server, "raises", one), 500, "model 'raises' version 1 failed", "the model gave up")


def test_names_imported_from_the_module_also_select_tritons_api(server: ServerProcess) -> None:
    one = [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [41]}]
    assert outputs_of(infer(server, "from_import", one)) == {"OUTPUT0": [42]}


def test_initialize_args_request_accessors_and_helpers(server: ServerProcess) -> None:
    response = infer(
        server,
        "introspect",
        [
            {"name": "X", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]},
            {"name": "S", "datatype": "BYTES", "shape": [1], "data": ["héllo"]},
        ],
        id="req-7",
        parameters={"temperature": 0.5, "mode": "fast"},
        outputs=[{"name": "INFO"}, {"name": "Y"}],
    )
    out = outputs_of(response)
    assert out["Y"] == [2, 4, 6]  # through torch by DLPack and back
    info = json.loads(out["INFO"][0])
    args = info["args"]
    assert args["model_name"] == "introspect" and args["model_version"] == "1"
    assert Path(args["model_repository"]).name == "introspect"
    assert (args["model_instance_kind"], args["model_instance_name"], args["model_instance_device_id"]) == (
        "CPU",
        "introspect_0",
        "0",
    )
    assert info["config_name"] == "introspect"
    assert info["request_id"] == "req-7"
    assert info["parameters"] == {"temperature": 0.5, "mode": "fast"}
    assert info["requested"] == ["INFO", "Y"]
    assert info["inputs"] == [["X", [3], 8, True], ["S", [1], 13, True]]  # TYPE_INT32 = 8, BYTES = 13
    assert info["text"] == ["héllo"] and info["missing"] is True
    assert (info["info_type"], info["x_type"]) == ("object", "int32")
    assert info["model"] == ["introspect", 1]
    log = server.log_path.read_text()
    assert "introspect initialized" in log and "introspect warns" in log and "introspect error level" in log


def test_finalize_runs_when_the_server_unloads_the_model(start_server, repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    write_model(repo, "introspect", INTROSPECT % marker, {1: INTROSPECT_PY})
    server = start_server(repo)
    assert not marker.exists()
    assert server.stop() == 0
    assert marker.read_text() == "finalized"


# ------------------------------------------------------------------------------------------ decoupled


def countdown_request(n: int, request_id: str) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="countdown",
        id=request_id,
        inputs=[tensor("N", "INT32", [1])],
        raw_input_contents=[np.array([n], np.int32).tobytes()],
    )


def test_a_decoupled_model_answers_over_model_stream_infer(server: ServerProcess) -> None:
    async def run(stub) -> list:
        requests = [countdown_request(3, "a"), countdown_request(-1, "bad"), countdown_request(2, "b")]
        return [m async for m in stub.model_stream_infer(requests, timeout=20)]

    answers = call(server, run)
    got = [
        (
            m.infer_response.id,
            m.error_message or np.frombuffer(m.infer_response.raw_output_contents[0], "<i4").tolist(),
        )
        for m in answers
    ]
    assert got == [
        ("a", [3]),
        ("a", [2]),
        ("a", [1]),
        ("bad", "N must be at least 0"),
        ("b", [2]),
        ("b", [1]),
    ]


def test_a_decoupled_model_streams_over_grps_and_refuses_plain_infer(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        body = {"model": "countdown", "gtensors": {"tensors": [gtensor("N", "DT_INT32", [1], [4])]}}
        answers = streamed(client, body)
    assert [a["gtensors"]["tensors"][0]["flat_int32"] for a in answers] == [[4], [3], [2], [1]]
    one = [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]
    assert_error(infer(server, "countdown", one), 400, "only streams its answers")


# ------------------------------------------------------------------------------------------------ BLS


@pytest.mark.parametrize("model", ["bls_sync", "bls_async"])
def test_bls_calls_another_model_of_the_server(server: ServerProcess, model: str) -> None:
    before = httpx.get(f"{server.base_url}/v2/models/add_sub/stats").json()["model_stats"][0][
        "inference_count"
    ]
    x = [1.0, 2.0, 3.0, 4.0]
    inputs = [
        fp32("X", x, [1, 4]),
        {"name": "TARGET", "datatype": "BYTES", "shape": [1], "data": ["add_sub"]},
    ]
    assert outputs_of(infer(server, model, inputs)) == {"Y": [2.0, 4.0, 6.0, 8.0], "COUNT": [3]}
    after = httpx.get(f"{server.base_url}/v2/models/add_sub/stats").json()["model_stats"][0][
        "inference_count"
    ]
    assert after - before == (1 if model == "bls_sync" else 2)  # through add_sub's own scheduler
    inputs[1]["data"] = ["no_such_model"]
    assert_error(infer(server, model, inputs), 404, "Request for unknown model: 'no_such_model' is not found")


# ---------------------------------------------------------------------------------------- auto-complete


def test_auto_complete_config_fills_the_config(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        config = client.get("/v2/models/auto/config").json()
        metadata = client.get("/v2/models/auto").json()
    assert config["max_batch_size"] == 16 and "dynamic_batching" in config
    assert [(e["name"], e["data_type"], e["dims"]) for e in config["input"]] == [("IN", "TYPE_INT64", [2])]
    assert metadata["outputs"] == [{"name": "OUT", "datatype": "INT64", "shape": [-1, 2]}]
    response = infer(
        server, "auto", [{"name": "IN", "datatype": "INT64", "shape": [2, 2], "data": [1, 2, 3, 4]}]
    )
    assert outputs_of(response) == {"OUT": [10, 20, 30, 40]}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_auto_complete_config_that_disagrees_with_the_config_fails_the_load(
    start_server, repo: Path, mode: str
) -> None:
    config = in_mode(AUTO + 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n', mode)
    write_model(repo, "auto", config, {1: AUTO_PY})
    server = start_server(repo)
    index = httpx.post(f"{server.base_url}/v2/repository/index").json()
    assert index[0]["state"] == "UNAVAILABLE"
    assert (
        "input 'IN': the configuration has data_type 'TYPE_FP32', auto-complete wants 'TYPE_INT64'"
        in (index[0]["reason"])
    )


# ------------------------------------------------------------------------------------- pb_utils alone


def test_pb_utils_helpers() -> None:
    strings = np.array([b"a", b"", "é".encode()], dtype=np.object_)
    serialized = pb_utils.serialize_byte_tensor(strings)
    assert serialized.tobytes() == b"\x01\x00\x00\x00a\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"
    assert pb_utils.deserialize_bytes_tensor(serialized.tobytes()).tolist() == strings.tolist()
    assert pb_utils.numpy_to_triton_type(np.float16) == 10 and pb_utils.triton_to_numpy_type(11) is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is np.bool_
    with pytest.raises(pb_utils.TritonModelException, match="use np.object_"):
        pb_utils.Tensor("s", np.array(["text"]))
    tensor = pb_utils.Tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert (tensor.name(), tensor.shape(), tensor.triton_dtype(), tensor.is_cpu()) == ("t", [2, 3], 11, True)
    assert (
        np.from_dlpack(pb_utils.Tensor.from_dlpack("u", tensor.as_numpy()).as_numpy()) == tensor.as_numpy()
    ).all()
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code(), str(error)) == ("nope", pb_utils.TritonError.NOT_FOUND, "nope")
    response = pb_utils.InferenceResponse(error=pb_utils.TritonError("x"))
    assert response.has_error() and response.output_tensors() == []
    with pytest.raises(pb_utils.TritonModelException, match="must be a list"):
        pb_utils.InferenceResponse(tensor)  # type: ignore[arg-type]


def test_a_response_sender_refuses_to_send_after_final() -> None:
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda response, flags: sent.append(flags))
    sender.send(pb_utils.InferenceResponse([]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="FINAL was sent already"):
        sender.send(pb_utils.InferenceResponse([]))
    assert sent == [0, 1]


def test_model_config_add_input_keeps_the_config_and_refuses_disagreement() -> None:
    config = pb_utils.ModelConfig({"name": "m", "input": [{"name": "A", "data_type": "TYPE_FP32"}]})
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})  # completes A
    config.add_input({"name": "B", "data_type": "TYPE_INT8", "dims": [1]})
    assert config.as_dict()["input"] == [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [3]},
        {"name": "B", "data_type": "TYPE_INT8", "dims": [1]},
    ]
    with pytest.raises(ValueError, match="has data_type 'TYPE_FP32', auto-complete wants 'TYPE_FP16'"):
        config.add_input({"name": "A", "data_type": "TYPE_FP16"})
    with pytest.raises(ValueError, match="max_batch_size 4, but auto-complete wants 0"):
        pb_utils.ModelConfig({"max_batch_size": 4}).set_max_batch_size(0)


def test_exec_from_the_event_loop_thread_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import types

    async def main() -> None:
        host = types.SimpleNamespace(loop=asyncio.get_running_loop())  # a Host: what pb_utils uses of it
        monkeypatch.setattr(pb_utils, "_host", host)
        with pytest.raises(pb_utils.TritonModelException, match="use `await request.async_exec"):
            pb_utils.InferenceRequest(model_name="m").exec()

    asyncio.run(main())
