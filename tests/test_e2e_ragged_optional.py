"""Ragged batching and optional inputs end to end, as Triton has them.

- `ragged`: our python API, INPUT `allow_ragged_batch` with batch inputs. Three requests of shapes [1, 3],
  [1, 4] and [1, 5] make one batch (preferred_batch_size 3): the model gets INPUT as the 12 elements in a
  row and the batch inputs that split them; it answers each request's sum, and records what it got.
- `ragged_triton`: Triton's python API (`execute(requests)`): the three requests come in one call, each
  with its own tensor.
- `optional`: Triton's python API, INPUT1 `optional`: a request may leave it out
  (`get_input_tensor_by_name` is then None); only requests giving the same inputs share a batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, assert_error, need_module, stop_all, write_model

RAGGED = """
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


class Model:
    def execute(self, inputs):
        x, ends = inputs["INPUT"], inputs["INDEX"]
        seen = {name: [array.shape, array.tolist()] for name, array in inputs.items() if name != "MAX"}
        seen["MAX"] = [inputs["MAX"].shape]
        (HERE / "batch.json").write_text(json.dumps({k: [list(v[0]), *v[1:]] for k, v in seen.items()}))
        sums = [x[start:end].sum() for start, end in zip([0, *ends[:-1]], ends)]
        return {"SUM": np.array(sums, dtype=np.float32).reshape(-1, 1)}
"""

RAGGED_CONFIG = """
name: "ragged"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ZERO" data_type: TYPE_INT32
    source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE target_name: "SHAPE" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT" data_type: TYPE_INT32 source_input: "INPUT" }
]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 30000000 }
"""

TRITON_RAGGED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out = np.array([[x.sum(), len(requests)]], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", out)]))
        return responses
"""

TRITON_RAGGED_CONFIG = """
name: "ragged_triton"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 30000000 }
"""

OPTIONAL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        given = {pb_utils.get_input_tensor_by_name(r, "INPUT1") is not None for r in requests}
        assert len(given) == 1, "a batch mixes requests with and without INPUT1"
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            extra = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            y = x + (extra.as_numpy() if extra is not None else 100)
            batch = np.full(x.shape, len(requests), dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y), pb_utils.Tensor("BATCH", batch)])
            )
        return responses
"""

OPTIONAL_CONFIG = """
name: "optional"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 2000000 }
"""

LENGTHS = (3, 4, 5)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ragged") / "models"
    repo.mkdir()
    write_model(repo, "ragged", RAGGED_CONFIG, {1: RAGGED})
    write_model(repo, "ragged_triton", TRITON_RAGGED_CONFIG, {1: TRITON_RAGGED})
    write_model(repo, "optional", OPTIONAL_CONFIG, {1: OPTIONAL})
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(repository, repository.parent / "server.log").start()
    yield process
    stop_all([process])


def infer(server: ServerProcess, model: str, inputs: list[dict]) -> httpx.Response:
    url = f"http://127.0.0.1:{server.port}/v2/models/{model}/infer"
    return httpx.post(url, json={"inputs": inputs}, timeout=60)


def ragged_input(length: int) -> list[dict]:
    data = [float(length * 10 + i) for i in range(length)]
    return [{"name": "INPUT", "datatype": "FP32", "shape": [1, length], "data": data}]


def all_at_once(server: ServerProcess, model: str, bodies: list[list[dict]]) -> list[dict]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda inputs: infer(server, model, inputs), bodies))
    for response in responses:
        assert response.status_code == 200, response.text
    return [{o["name"]: o for o in r.json()["outputs"]} for r in responses]


def test_requests_of_different_lengths_make_one_ragged_batch(server: ServerProcess, repository: Path) -> None:
    answers = all_at_once(server, "ragged", [ragged_input(n) for n in LENGTHS])
    for length, outputs in zip(LENGTHS, answers, strict=True):
        assert outputs["SUM"]["shape"] == [1, 1]
        assert outputs["SUM"]["data"] == [sum(length * 10 + i for i in range(length))]
    batch = json.loads((repository / "ragged" / "1" / "batch.json").read_text())
    order = [len(v) for v in _split(batch["INPUT"][1], batch["INDEX"][1])]  # the batch's request order
    assert sorted(order) == list(LENGTHS)
    accumulated = [sum(order[: i + 1]) for i in range(3)]
    assert batch["INPUT"][0] == [12]  # the 3 + 4 + 5 elements in a row
    assert batch["INDEX"] == [[3], accumulated]
    assert batch["COUNT"] == [[3], [float(n) for n in order]]
    assert batch["ZERO"] == [[4], [0, *accumulated]]
    assert batch["MAX"] == [[5]]
    assert batch["SHAPE"] == [[3, 1], [[n] for n in order]]
    assert batch["FLAT"] == [[3], order]


def _split(values: list[float], ends: list[int]) -> list[list[float]]:
    return [values[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def test_triton_api_model_gets_the_ragged_requests_in_one_call(server: ServerProcess) -> None:
    answers = all_at_once(server, "ragged_triton", [ragged_input(n) for n in LENGTHS])
    for length, outputs in zip(LENGTHS, answers, strict=True):
        assert outputs["SUM"]["data"] == [sum(length * 10 + i for i in range(length)), 3.0]


def optional_inputs(value: int, extra: int | None) -> list[dict]:
    inputs = [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}]
    if extra is not None:
        inputs.append({"name": "INPUT1", "datatype": "INT32", "shape": [1, 1], "data": [extra]})
    return inputs


@pytest.mark.parametrize("extra", [None, 7])
def test_requests_giving_the_same_inputs_batch_together(server: ServerProcess, extra: int | None) -> None:
    answers = all_at_once(server, "optional", [optional_inputs(1, extra), optional_inputs(2, extra)])
    added = 100 if extra is None else extra
    assert [a["OUTPUT0"]["data"] for a in answers] == [[1 + added], [2 + added]]
    assert [a["BATCH"]["data"] for a in answers] == [[2], [2]]


def test_requests_giving_different_inputs_do_not_share_a_batch(server: ServerProcess) -> None:
    answers = all_at_once(server, "optional", [optional_inputs(1, None), optional_inputs(2, 5)])
    assert [a["OUTPUT0"]["data"] for a in answers] == [[101], [7]]
    assert [a["BATCH"]["data"] for a in answers] == [[1], [1]]


def test_a_missing_required_input_gets_tritons_error(server: ServerProcess) -> None:
    inputs = [{"name": "INPUT1", "datatype": "INT32", "shape": [1, 1], "data": [1]}]
    assert_error(
        infer(server, "optional", inputs),
        400,
        "expected number of inputs between 1 and 2 but got 1 inputs for model 'optional'. Got input(s) "
        "['INPUT1'], but missing required input(s) ['INPUT0']. Please provide all required input(s).",
    )


ONNX_CONFIG = """
name: "ragged_onnx"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [
  { name: "ENDS" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] }
]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_FP32 source_input: "INPUT" }
]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 30000000 }
"""


def write_onnx_model(path: Path) -> None:
    """ENDS = INDEX as a column (each request's end in the batch), TOTAL = the sum of the whole 1-D
    INPUT, on each row: what the graph received, seen from each request's answer."""
    onnx = need_module("onnx", "the onnxruntime backend's model")
    need_module("onnxruntime", "the onnxruntime backend")
    helper, proto = onnx.helper, onnx.TensorProto
    shape = helper.make_tensor("column", proto.INT64, [2], [-1, 1])
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["INDEX", "column"], ["ENDS"]),
            helper.make_node("ReduceSum", ["INPUT"], ["sum"], keepdims=1),
            helper.make_node("Mul", ["ENDS", "zero"], ["zeros"]),
            helper.make_node("Add", ["zeros", "sum"], ["TOTAL"]),
        ],
        "ragged",
        [
            helper.make_tensor_value_info("INPUT", proto.FLOAT, ["n"]),
            helper.make_tensor_value_info("INDEX", proto.FLOAT, ["b"]),
        ],
        [
            helper.make_tensor_value_info("ENDS", proto.FLOAT, ["b", 1]),
            helper.make_tensor_value_info("TOTAL", proto.FLOAT, ["b", 1]),
        ],
        [shape, helper.make_tensor("zero", proto.FLOAT, [], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_onnx_model_gets_the_ragged_batch_in_a_row(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    write_model(repo, "ragged_onnx", ONNX_CONFIG, {1: None})
    write_onnx_model(repo / "ragged_onnx" / "1" / "model.onnx")
    process = ServerProcess(repo, tmp_path / "server.log").start()
    try:
        answers = all_at_once(process, "ragged_onnx", [ragged_input(n) for n in LENGTHS])
    finally:
        stop_all([process])
    total = sum(sum(n * 10 + i for i in range(n)) for n in LENGTHS)  # every element of the batch
    assert [a["TOTAL"]["data"] for a in answers] == [[total]] * 3
    # each request's row holds where its elements end in the batch (in the order the requests arrived)
    ends = sorted((a["ENDS"]["data"][0], n) for n, a in zip(LENGTHS, answers, strict=True))
    accumulated = [float(sum(n for _, n in ends[: i + 1])) for i in range(3)]
    assert [end for end, _ in ends] == accumulated
