"""Model warmup end to end: `model_warmup` samples run through the model while it loads, before it is
ready (a load through the repository API returns after them), with zero, random and file data, `count`
and `batch_size` as Triton runs them; a sample that fails, or does not fit the model, fails the load
with a message naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import (
    ServerProcess,
    assert_error,
    encode_bytes_elements,
    need_module,
    stop_all,
    write_model,
)
from grpc_helpers import rest

# Records each execute: the rows of each input (as lists) and, for BYTES, the decoded strings.
RECORDING = """
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent

class Model:
    def execute(self, inputs):
        record = {}
        for name, array in inputs.items():
            record[name] = [e.decode() if isinstance(e, bytes) else e for e in array.reshape(-1).tolist()]
            record[name + ".shape"] = list(array.shape)
        with open(HERE / "calls.log", "a") as log:
            log.write(json.dumps(record) + "\\n")
        if any(v == 13 for v in record.get("X", [])):
            raise ValueError("13 is unlucky")
        rows = len(inputs["X"])
        return {"Y": inputs["X"].astype(np.float32) * 2, "T": inputs["S"].reshape(rows, -1)}
"""
CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 4
input [
  { name: "X" data_type: TYPE_INT32 dims: [ 3 ] },
  { name: "S" data_type: TYPE_STRING dims: [ 2 ] }
]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "T" data_type: TYPE_STRING dims: [ 2 ] }
]
model_warmup [ %s ]
"""
ZEROS = """{
  name: "zeros" batch_size: 2 count: 3
  inputs { key: "X" value: { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true } }
  inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } }
}"""
FILES = """{
  name: "from files" batch_size: 1
  inputs { key: "X" value: { data_type: TYPE_INT32 dims: [ 3 ] input_data_file: "x.bin" } }
  inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } }
}"""
RANDOM = """{
  name: "random" batch_size: 4
  inputs { key: "X" value: { data_type: TYPE_INT32 dims: [ 3 ] random_data: true } }
  inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }
}"""
TRITON_API = """
import numpy as np
import triton_python_backend_utils as pb_utils
from pathlib import Path

class TritonPythonModel:
    def execute(self, requests):
        with open(Path(__file__).parent / "calls.log", "a") as log:
            log.write(f"{len(requests)}\\n")
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("warm me not")) for _ in requests]
"""
DECOUPLED = """
name: "%s"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_warmup [ {
  name: "countdown" batch_size: 2
  inputs { key: "N" value: { data_type: TYPE_INT32 dims: [ 1 ] input_data_file: "n.bin" } }
} ]
"""
# Sends N answers from a thread of its own, each logged; N = 13 is answered with an error.
DECOUPLED_PY = """
import threading
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils

HERE = Path(__file__).parent

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self.answer, args=(n, request.get_response_sender())).start()

    def answer(self, n, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if n == 13:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("13 is unlucky")), flags=final)
            return
        for i in range(n):
            with open(HERE / "sent.log", "a") as log:
                log.write(f"{i}\\n")
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
        sender.send(flags=final)
"""
ENSEMBLE = f"""
name: "warm_ensemble"
platform: "ensemble"
max_batch_size: 4
input [
  {{ name: "X" data_type: TYPE_INT32 dims: [ 3 ] }}, {{ name: "S" data_type: TYPE_STRING dims: [ 2 ] }}
]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "warm" model_version: -1
  input_map [ {{ key: "X" value: "X" }}, {{ key: "S" value: "S" }} ] output_map {{ key: "Y" value: "Y" }}
}} ] }}
model_warmup [ {ZEROS} ]
"""


ASYNC = RECORDING.replace("    def execute(self, inputs):", "    async def execute(self, inputs):")


def model(repo: Path, name: str, samples: str, code: str = RECORDING) -> Path:
    directory = write_model(repo, name, CONFIG % (name, samples), {1: code})
    (directory / "warmup").mkdir()
    (directory / "warmup" / "x.bin").write_bytes(np.array([7, 8, 9, 99], "<i4").tobytes())  # one extra
    (directory / "warmup" / "s.bin").write_bytes(encode_bytes_elements([b"hello", b"w\xc3\xb6rld"]))
    return directory


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("warmup") / "models"
    repo.mkdir()
    model(repo, "warm", ", ".join((ZEROS, FILES, RANDOM)))
    model(repo, "at_start", ZEROS)
    model(repo, "failing", ZEROS.replace("zero_data: true", 'input_data_file: "x13.bin"', 1))
    (repo / "failing" / "warmup" / "x13.bin").write_bytes(np.array([13, 0, 0], "<i4").tobytes())
    model(repo, "unknown_input", ZEROS.replace('key: "S"', 'key: "NOPE"'))
    model(repo, "wrong_type", ZEROS.replace("TYPE_INT32 dims: [ 3 ] zero", "TYPE_FP32 dims: [ 3 ] zero"))
    model(repo, "short_file", FILES.replace('"x.bin"', '"tiny.bin"'))
    (repo / "short_file" / "warmup" / "tiny.bin").write_bytes(b"\0" * 8)
    model(repo, "escaping_file", FILES.replace('"x.bin"', '"../config.pbtxt"'))
    model(repo, "too_big", ZEROS.replace("batch_size: 2", "batch_size: 5"))
    model(repo, "triton_api", ZEROS, TRITON_API)
    write_model(repo, "warm_ensemble", ENSEMBLE, {1: None})
    model(repo, "warm_async", ZEROS, ASYNC)
    for name, n in (("warm_decoupled", 3), ("failing_decoupled", 13)):
        directory = write_model(repo, name, DECOUPLED % name, {1: DECOUPLED_PY})
        (directory / "warmup").mkdir()
        (directory / "warmup" / "n.bin").write_bytes(np.array([n], "<i4").tobytes())
    return repo  # the ONNX models are written by their test: they need onnx, the others do not


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    args = ("--model-control-mode", "explicit", "--load-model", "at_start")
    process = ServerProcess(repo, repo.parent / "server.log", extra_args=args).start()
    yield process
    stop_all([process])


def calls(repo: Path, name: str) -> list:
    log = repo / name / "1" / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def load(server: ServerProcess, name: str):
    return rest(server, "POST", f"/v2/repository/models/{name}/load")


def test_samples_run_at_load_before_the_model_is_ready(server: ServerProcess, repo: Path) -> None:
    assert calls(repo, "warm") == []
    response = load(server, "warm")
    assert (response.status_code, response.text) == (200, "")
    made = calls(repo, "warm")  # the load answered once every sample had run
    zeros, files, random = made[:3], made[3], made[4]
    assert len(made) == 5
    # zeros: 3 runs of a batch of 2 one-row requests; BYTES random data is empty strings, as Triton's
    assert zeros == [{"X": [0] * 6, "X.shape": [2, 3], "S": [""] * 4, "S.shape": [2, 2]}] * 3
    # files: the numeric file's first 12 bytes, the BYTES file in Triton's serialized form
    assert files == {"X": [7, 8, 9], "X.shape": [1, 3], "S": ["hello", "wörld"], "S.shape": [1, 2]}
    assert random["X.shape"] == [4, 3] and random["S"] == [""] * 8
    # now ready: requests are served, and the statistics count no warmup run
    doc = {
        "inputs": [
            {"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]},
            {"name": "S", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]},
        ]
    }
    answer = rest(server, "POST", "/v2/models/warm/infer", json=doc)
    assert answer.status_code == 200, answer.text
    (stats,) = rest(server, "GET", "/v2/models/warm/stats").json()["model_stats"]
    assert stats["execution_count"] == 1


def test_a_model_loaded_at_start_is_warmed_before_the_server_listens(
    server: ServerProcess, repo: Path
) -> None:
    assert len(calls(repo, "at_start")) == 3  # already there when the server said where it listens
    assert rest(server, "GET", "/v2/models/at_start/ready").status_code == 200


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("failing", ["failed to run warmup sample 'zeros'", "13 is unlucky"]),
        ("unknown_input", ["failed to run warmup sample 'zeros'", "no data for input(s) 'S'"]),
        ("wrong_type", ["failed to run warmup sample 'zeros'", "input 'X' is TYPE_FP32", "TYPE_INT32"]),
        ("short_file", ["failed to run warmup sample 'from files'", "expects 12 bytes", "only has 8 bytes"]),
        (
            "escaping_file",
            ["failed to run warmup sample 'from files'", "must name a file in the model's warmup/"],
        ),
        ("too_big", ["failed to run warmup sample 'zeros'", "batch_size 5 is over max_batch_size 4"]),
        ("triton_api", ["failed to run warmup sample 'zeros'", "warm me not"]),
    ],
)
def test_a_failing_or_misfit_sample_fails_the_load_naming_it(
    server: ServerProcess, repo: Path, name: str, fragments: list[str]
) -> None:
    assert_error(load(server, name), 400, f"failed to load '{name}'", *fragments)
    (entry,) = [e for e in rest(server, "POST", "/v2/repository/index").json() if e["name"] == name]
    assert entry["state"] == "UNAVAILABLE" and fragments[0] in entry["reason"]
    assert rest(server, "GET", f"/v2/models/{name}/ready").status_code != 200


def test_tritons_api_gets_batch_size_requests_in_one_execute(server: ServerProcess, repo: Path) -> None:
    log = repo / "triton_api" / "1" / "calls.log"
    before = log.read_text().split() if log.exists() else []
    load(server, "triton_api")
    assert log.read_text().split()[len(before) :] == ["2"]  # one execute of 2 requests; it failed: no more


def test_an_ensemble_takes_no_warmup(server: ServerProcess) -> None:
    assert_error(
        load(server, "warm_ensemble"), 400, "model_warmup can not be specified for ensemble 'warm_ensemble'"
    )


def test_an_async_execute_warms_up_on_the_servers_loop(server: ServerProcess, repo: Path) -> None:
    response = load(server, "warm_async")
    assert (response.status_code, response.text) == (200, "")
    assert len(calls(repo, "warm_async")) == 3
    assert rest(server, "GET", "/v2/models/warm_async/ready").status_code == 200


# Gather(DATA, INDEX) over DATA = [10, 20, 30, 40]: ONNX Runtime itself refuses an index out of range, at
# run time, which no check of the server's can see at load: a sample with one fails the load only if it
# ran in ONNX Runtime.
GATHER_CONFIG = """
name: "%s"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INDEX" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_warmup [ %s ]
"""
IN_RANGE = """{ name: "in range" batch_size: 3 count: 2
  inputs { key: "INDEX" value: { data_type: TYPE_INT64 dims: [ 1 ] zero_data: true } } }"""
OUT_OF_RANGE = """{ name: "out of range" batch_size: 1
  inputs { key: "INDEX" value: { data_type: TYPE_INT64 dims: [ 1 ] input_data_file: "99.bin" } } }"""


def gather_onnx_model(repo: Path, name: str, samples: str) -> None:
    need_module("onnx", "builds the ONNX models")
    need_module("onnxruntime", "the onnxruntime backend")
    from onnx import TensorProto, numpy_helper
    from onnx.helper import make_node
    from triton_examples import _model, save

    graph = _model(
        [make_node("Gather", ["DATA", "INDEX"], ["OUT"], axis=0)],
        [("INDEX", TensorProto.INT64, ["batch", 1])],
        [("OUT", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([10, 20, 30, 40], np.float32), "DATA")],
    )
    directory = write_model(repo, name, GATHER_CONFIG % (name, samples), {})
    save(graph, directory / "1" / "model.onnx")
    (directory / "warmup").mkdir()
    (directory / "warmup" / "99.bin").write_bytes(np.array([99], "<i8").tobytes())


def test_onnx_runtime_runs_the_samples_in_its_threads(server: ServerProcess, repo: Path) -> None:
    """The samples run through ONNX Runtime's session (in the backend's worker threads): those that fit
    leave the model ready; one that ONNX Runtime refuses at run time fails the load, naming it."""
    gather_onnx_model(repo, "warm_onnx", IN_RANGE)
    gather_onnx_model(repo, "warm_onnx_refused", f"{IN_RANGE}, {OUT_OF_RANGE}")
    response = load(server, "warm_onnx")
    assert (response.status_code, response.text) == (200, "")
    assert rest(server, "GET", "/v2/models/warm_onnx/ready").status_code == 200
    doc = {"inputs": [{"name": "INDEX", "datatype": "INT64", "shape": [2, 1], "data": [3, 1]}]}
    answer = rest(server, "POST", "/v2/models/warm_onnx/infer", json=doc)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [40.0, 20.0]
    assert_error(
        load(server, "warm_onnx_refused"),
        400,
        "failed to load 'warm_onnx_refused'",
        "failed to run warmup sample 'out of range'",
        "out of data bounds",  # ONNX Runtime's own words
    )


def test_a_model_that_only_streams_warms_up_through_its_stream(server: ServerProcess, repo: Path) -> None:
    """A decoupled model: each request of the sample read to its FINAL answer (2 requests x 3 answers);
    an error answer fails the load."""
    response = load(server, "warm_decoupled")
    assert (response.status_code, response.text) == (200, "")
    assert (repo / "warm_decoupled" / "1" / "sent.log").read_text().split() == ["0", "1", "2"] * 2
    assert_error(
        load(server, "failing_decoupled"), 400, "failed to run warmup sample 'countdown'", "13 is unlucky"
    )
