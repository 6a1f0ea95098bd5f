"""Triton's example model repository served as Triton serves it (issue 29's "Why"), each item against a
copy of the affected example (tests/triton_examples.py): strings through ONNX Runtime (`simple_string`),
BYTES tensors in system shared memory, a load whose config override names no backend, the error texts
Triton's clients match, and the classification extension (`densenet_onnx` with its label file, `simple`
for batch rows, an ensemble over densenet)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest
from e2e_helpers import (
    ServerProcess,
    assert_error,
    binary_body,
    decode_bytes_elements,
    encode_bytes_elements,
    need_module,
    split_binary_response,
    stop_all,
)
from grpc_helpers import outputs, rest, tensor
from grpclib.const import Status
from shm_helpers import ALLOW, Segment, register, rest_doc, rpc, shm
from shm_helpers import grpc_request as shm_grpc_request
from triton_examples import CLASSES, DENSENET_LABELS, simple_onnx, write_examples

import tensorgate.proto.inference as pb

need_module("onnxruntime", "the onnx extra: pip install -e '.[onnx]' (make test installs it)")

A, B = list(range(16)), [3 * i - 20 for i in range(16)]
ENSEMBLE = """
name: "densenet_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 1000 ] } ]
ensemble_scheduling { step [ {
  model_name: "densenet_onnx" model_version: -1
  input_map { key: "data_0" value: "IMAGE" } output_map { key: "fc6_1" value: "SCORES" }
} ] }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("triton_examples") / "models"
    write_examples(repository)
    (repository / "densenet_ensemble" / "1").mkdir(parents=True)
    (repository / "densenet_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    args = ("--model-control-mode", "explicit", "--load-model", "*", *ALLOW)
    process = ServerProcess(repository, repository.parent / "server.log", extra_args=args).start()
    yield process
    stop_all([process])


def strings(values) -> list[str]:
    return [str(v) for v in values]


# ------------------------------------------------------------------------------ strings through ORT


def test_simple_string_through_onnx_runtime_over_rest_and_grpc(server: ServerProcess) -> None:
    """Triton's simple_string: decimal strings cast to INT32, added and subtracted, cast back (ORT
    refused the bytes it was handed: "stoll" in its Cast node)."""
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 16], "data": strings(A)},
            {"name": "INPUT1", "datatype": "BYTES", "shape": [1, 16], "data": strings(B)},
        ]
    }
    response = rest(server, "POST", "/v2/models/simple_string/infer", json=doc)
    assert response.status_code == 200, response.text
    answer = {o["name"]: o for o in response.json()["outputs"]}
    assert answer["OUTPUT0"]["datatype"] == "BYTES" and answer["OUTPUT0"]["shape"] == [1, 16]
    assert answer["OUTPUT0"]["data"] == strings(a + b for a, b in zip(A, B, strict=True))
    assert answer["OUTPUT1"]["data"] == strings(a - b for a, b in zip(A, B, strict=True))

    request = pb.ModelInferRequest(
        model_name="simple_string",
        inputs=[tensor("INPUT0", "BYTES", [1, 16]), tensor("INPUT1", "BYTES", [1, 16])],
        raw_input_contents=[encode_bytes_elements([s.encode() for s in strings(v)]) for v in (A, B)],
    )
    got = outputs(rpc(server, "model_infer", request))
    assert got["OUTPUT0"] == [s.encode() for s in strings(a + b for a, b in zip(A, B, strict=True))]


def test_bytes_that_are_not_utf8_are_refused_naming_the_input(server: ServerProcess) -> None:
    raw = encode_bytes_elements([b"\xff\xfe"] * 16)
    header = {
        "inputs": [
            {"name": n, "datatype": "BYTES", "shape": [1, 16], "parameters": {"binary_data_size": len(raw)}}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    body, headers = binary_body(header, raw, raw)
    response = rest(server, "POST", "/v2/models/simple_string/infer", content=body, headers=headers)
    assert_error(response, 400, "input 'INPUT0' holds bytes that are not UTF-8")


# ------------------------------------------------------------------------- BYTES in shared memory


def test_bytes_tensors_in_system_shared_memory_both_ways(server: ServerProcess) -> None:
    """As Triton's simple_*_shm_string_client: inputs serialized into a region (a 4-byte length before
    each element), outputs written into regions the same way, over REST and gRPC."""
    inputs = [encode_bytes_elements([s.encode() for s in strings(v)]) for v in (A, B)]
    sums = [s.encode() for s in strings(a + b for a, b in zip(A, B, strict=True))]
    diffs = [s.encode() for s in strings(a - b for a, b in zip(A, B, strict=True))]
    segment = Segment(4096)
    try:
        assert register(server, segment, "strings").status_code == 200
        segment.shm.buf[: len(inputs[0])] = inputs[0]
        segment.shm.buf[1024 : 1024 + len(inputs[1])] = inputs[1]
        regions = [shm("strings", len(inputs[0])), shm("strings", len(inputs[1]), 1024)]
        out = [("OUTPUT0", shm("strings", 1024, 2048)), ("OUTPUT1", shm("strings", 1024, 3072))]

        def read(offset: int) -> list[bytes]:
            raw, elements = bytes(segment.shm.buf[offset : offset + 1024]), []
            for _ in range(16):
                length = int.from_bytes(raw[:4], "little")
                elements.append(raw[4 : 4 + length])
                raw = raw[4 + length :]
            return elements

        doc = rest_doc(list(zip(("INPUT0", "INPUT1"), regions, strict=True)), out, datatype="BYTES")
        response = rest(server, "POST", "/v2/models/simple_string/infer", json=doc)
        assert response.status_code == 200, response.text
        assert [o["name"] for o in response.json()["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        assert (read(2048), read(3072)) == (sums, diffs)

        segment.shm.buf[2048:4096] = bytes(2048)
        request = shm_grpc_request(
            list(zip(("INPUT0", "INPUT1"), regions, strict=True)),
            out,
            model="simple_string",
            datatype="BYTES",
        )
        rpc(server, "model_infer", request)
        assert (read(2048), read(3072)) == (sums, diffs)

        short = rest_doc(
            [("INPUT0", shm("strings", len(inputs[0]) - 1)), ("INPUT1", regions[1])], out, "BYTES"
        )
        assert_error(rest(server, "POST", "/v2/models/simple_string/infer", json=short), 400, "BYTES")
    finally:
        rest(server, "POST", "/v2/systemsharedmemory/region/strings/unregister")
        segment.close()


# ------------------------------------------------------------------ a config naming no backend


def test_a_config_override_naming_no_backend_takes_it_from_the_model_file(server: ServerProcess) -> None:
    """Triton's auto-complete: model.onnx -> onnxruntime (REST, the model on disk), model.py -> python
    (gRPC, uploaded as a file override)."""
    override = {"max_batch_size": 8, "input": [], "output": []}  # inputs and outputs: from the graph
    response = rest(
        server,
        "POST",
        "/v2/repository/models/simple/load",
        json={"parameters": {"config": json.dumps(override)}},
    )
    assert (response.status_code, response.text) == (200, "")
    metadata = rest(server, "GET", "/v2/models/simple").json()
    assert metadata["platform"] == "onnxruntime_onnx"
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    doc = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": v}
            for n, v in (("INPUT0", A), ("INPUT1", B))
        ]
    }
    answer = rest(server, "POST", "/v2/models/simple/infer", json=doc).json()
    assert answer["outputs"][0]["data"] == [a + b for a, b in zip(A, B, strict=True)]

    python_model = (
        'class Model:\n    def execute(self, inputs):\n        return {"OUTPUT0": inputs["INPUT0"] * 3}\n'
    )
    python_config = {
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [2]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [2]}],
    }
    parameters = {
        "config": pb.ModelRepositoryParameter(string_param=json.dumps(python_config)),
        "file:1/model.py": pb.ModelRepositoryParameter(bytes_param=python_model.encode()),
    }
    rpc(
        server,
        "repository_model_load",
        pb.RepositoryModelLoadRequest(model_name="tripled", parameters=parameters),
    )
    config_doc = rest(server, "GET", "/v2/models/tripled/config").json()
    assert config_doc["backend"] == "python"
    answer = rest(
        server,
        "POST",
        "/v2/models/tripled/infer",
        json={"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [4, 5]}]},
    ).json()
    assert answer["outputs"][0]["data"] == [12, 15]


def test_a_config_naming_no_backend_and_no_model_file_says_so(server: ServerProcess) -> None:
    config = {"max_batch_size": 0, "input": [], "output": []}
    parameters = {"config": json.dumps(config), "file:1/notes.txt": base64.b64encode(b"no model").decode()}
    response = rest(server, "POST", "/v2/repository/models/nothing/load", json={"parameters": parameters})
    assert_error(
        response, 400, "must specify 'backend' or 'platform'", "model.onnx, model.pt, model.pt2, model.py"
    )


# ------------------------------------------------------------------------------- Triton's texts


def test_error_texts_clients_match_are_tritons(server: ServerProcess) -> None:
    assert_error(
        rest(server, "POST", "/v2/models/nope/infer", json={"inputs": []}),
        404,
        "Request for unknown model: 'nope' is not found",
    )
    message = rpc(
        server,
        "model_infer",
        pb.ModelInferRequest(model_name="nope", inputs=[tensor("X", "INT32", [1], int_contents=[1])]),
        error=Status.NOT_FOUND,
    )
    assert message == "Request for unknown model: 'nope' is not found"
    assert_error(rest(server, "GET", "/v2/models/simple/versions/9"), 404, "'simple' version 9 is not found")
    both = pb.ModelInferRequest(
        model_name="simple",
        inputs=[tensor("INPUT0", "INT32", [1, 16], int_contents=A), tensor("INPUT1", "INT32", [1, 16])],
        raw_input_contents=[np.array(B, "<i4").tobytes()],
    )
    message = rpc(server, "model_infer", both, error=Status.INVALID_ARGUMENT)
    assert message == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    )
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    message = assert_error(rest(server, "POST", "/v2/models/simple/infer", json=doc), 400)
    assert message == (
        "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model 'simple' "
        "expects 'INT32'"
    )
    doc = {"id": "7", "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A}]}
    message = assert_error(rest(server, "POST", "/v2/models/simple/infer", json=doc), 400)
    assert message == (
        "[request id: 7] expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


# ------------------------------------------------------------------------------- classification


def image(scale: float = 1.0) -> np.ndarray:
    return np.full((3, 224, 224), scale, np.float32)


def image_doc(model: str, outputs: list[dict], scale: float = 1.0) -> tuple[bytes, dict]:
    data = image(scale)
    name = "data_0" if model == "densenet_onnx" else "IMAGE"
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": "FP32",
                "shape": [3, 224, 224],
                "parameters": {"binary_data_size": data.nbytes},
            }
        ],
        "outputs": outputs,
    }
    return binary_body(header, data.tobytes())


def expected_classes(scores: np.ndarray, count: int, labels: list[str] | None = DENSENET_LABELS) -> list[str]:
    """What Triton answers: highest first, "%f" of the value, the index, the label."""
    order = sorted(range(len(scores)), key=lambda k: (-scores[k], k))[:count]
    return [f"{float(scores[k]):f}:{k}" + (f":{labels[k]}" if labels else "") for k in order]


def raw_scores(server: ServerProcess, model: str, output: str) -> np.ndarray:
    body, headers = image_doc(model, [{"name": output, "parameters": {"binary_data": True}}])
    response = rest(server, "POST", f"/v2/models/{model}/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    _, raw = split_binary_response(response)
    return np.frombuffer(raw[output], np.float32)


@pytest.mark.parametrize("binary", [False, True])
def test_densenet_classification_over_rest_json_and_binary(server: ServerProcess, binary: bool) -> None:
    """As Triton's image_client asks (class_count 3): the top 3 as "value:index:label", labels from the
    config's label_filename, shape [3] (densenet does not batch), BYTES."""
    scores = raw_scores(server, "densenet_onnx", "fc6_1")
    assert scores.shape == (CLASSES,) and scores.argmax() == CLASSES - 1
    parameters = {"classification": 3, "binary_data": binary}
    body, headers = image_doc("densenet_onnx", [{"name": "fc6_1", "parameters": parameters}])
    response = rest(server, "POST", "/v2/models/densenet_onnx/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    if binary:
        doc, raw = split_binary_response(response)
        got = [e.decode() for e in decode_bytes_elements(raw["fc6_1"])]
    else:
        doc = response.json()
        got = doc["outputs"][0]["data"]
    (entry,) = doc["outputs"]
    assert (entry["name"], entry["datatype"], entry["shape"]) == ("fc6_1", "BYTES", [3])
    assert got == expected_classes(scores, 3)
    assert got[0] == "0.999000:999:CLASS 999 LABEL"


def test_densenet_classification_over_grpc_and_into_shared_memory(server: ServerProcess) -> None:
    scores = raw_scores(server, "densenet_onnx", "fc6_1")
    request = pb.ModelInferRequest(
        model_name="densenet_onnx",
        inputs=[tensor("data_0", "FP32", [3, 224, 224])],
        raw_input_contents=[image().tobytes()],
        outputs=[
            pb.ModelInferRequestInferRequestedOutputTensor(
                name="fc6_1", parameters={"classification": pb.InferParameter(int64_param=5)}
            )
        ],
    )
    response = rpc(server, "model_infer", request)
    (meta,) = response.outputs
    assert (meta.datatype, meta.shape) == ("BYTES", [5])
    assert [e.decode() for e in outputs(response)["fc6_1"]] == expected_classes(scores, 5)

    segment = Segment(4096)
    try:  # written into a region in Triton's BYTES form (Triton refuses this; docs/protocols/v2-rest.md)
        assert register(server, segment, "classes").status_code == 200
        doc, headers = image_doc(
            "densenet_onnx", [{"name": "fc6_1", "parameters": {"classification": 2, **shm("classes", 4096)}}]
        )
        answer = rest(server, "POST", "/v2/models/densenet_onnx/infer", content=doc, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"] == [{"name": "fc6_1", "datatype": "BYTES", "shape": [2]}]
        expected = expected_classes(scores, 2)
        assert decode_bytes_elements(bytes(segment.shm.buf[: sum(4 + len(e) for e in expected)])) == [
            e.encode() for e in expected
        ]
    finally:
        rest(server, "POST", "/v2/systemsharedmemory/region/classes/unregister")
        segment.close()


def test_classification_per_batch_row_of_a_batching_model(server: ServerProcess) -> None:
    """`simple` batches: [2, 16] INT32 sums answer [2, N] classes, per row, integers as integers."""
    a = np.array([A, A[::-1]], np.int32)
    b = np.zeros((2, 16), np.int32)
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [2, 16], "data": a.ravel().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "data": b.ravel().tolist()},
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}, {"name": "OUTPUT1"}],
    }
    response = rest(server, "POST", "/v2/models/simple/infer", json=doc)
    assert response.status_code == 200, response.text
    first, second = response.json()["outputs"]
    assert (first["datatype"], first["shape"]) == ("BYTES", [2, 2])
    assert first["data"] == ["15:15", "14:14", "15:0", "14:1"]
    assert second["datatype"] == "INT32" and second["data"] == a.ravel().tolist()  # not asked: the tensor
    doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"classification": 40}}]  # more than there are
    (only,) = rest(server, "POST", "/v2/models/simple/infer", json=doc).json()["outputs"]
    assert only["shape"] == [2, 16]


def test_an_ensemble_output_takes_the_labels_of_the_step_that_produces_it(server: ServerProcess) -> None:
    scores = raw_scores(server, "densenet_ensemble", "SCORES")
    body, headers = image_doc("densenet_ensemble", [{"name": "SCORES", "parameters": {"classification": 2}}])
    response = rest(server, "POST", "/v2/models/densenet_ensemble/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == expected_classes(scores, 2)


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"classification": -1}, "Unable to set 'classification'"),
        ({"classification": "3"}, "Unable to set 'classification'"),
    ],
)
def test_a_bad_classification_count_is_tritons_400(
    server: ServerProcess, parameters: dict, fragment: str
) -> None:
    body, headers = image_doc("densenet_onnx", [{"name": "fc6_1", "parameters": parameters}])
    response = rest(server, "POST", "/v2/models/densenet_onnx/infer", content=body, headers=headers)
    assert_error(response, 400, fragment)


def test_a_label_file_outside_the_model_folder_fails_the_load(server: ServerProcess) -> None:
    config = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
        "output": [
            {
                "name": "OUTPUT0",
                "data_type": "TYPE_INT32",
                "dims": [16],
                "label_filename": "../../etc/passwd",
            },
            {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
        ],
    }
    files = {"file:1/model.onnx": base64.b64encode(simple_onnx().SerializeToString()).decode()}
    response = rest(
        server,
        "POST",
        "/v2/repository/models/leaky/load",
        json={"parameters": {"config": json.dumps(config), **files}},
    )
    assert_error(
        response, 400, "label file path '../../etc/passwd' for output 'OUTPUT0'", "outside model directory"
    )


def test_server_metadata_lists_the_classification_extension(server: ServerProcess) -> None:
    assert "classification" in rest(server, "GET", "/v2").json()["extensions"]
    assert "classification" in rpc(server, "server_metadata").extensions
