"""TF Serving REST API v1 end to end, over HTTP/1.1 and HTTP/2 (h2c), against real server processes: the
shared one on examples/model_repository and one on a repository of test models built here."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    ServerProcess,
    assert_connection_reused,
    assert_error,
    make_client,
    stop_all,
    write_model,
)

HPT = "/v1/models/half_plus_two"
MAX_BODY = 65536


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def read(response: httpx.Response):
    """The JSON answer, read with the json module (it reads NaN, Infinity and -Infinity)."""
    assert response.headers["content-type"] == "application/json"
    return json.loads(response.content)


def ok(response: httpx.Response):
    assert response.status_code == 200, response.text
    return read(response)


# ------------------------------------------------------------------------------------------ test models

CLASSIFIER_CONFIG = """
name: "classifier"
backend: "python"
max_batch_size: 8
version_policy: { all {} }
input [ { name: "feat" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [
  { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "classes" data_type: TYPE_STRING dims: [ 3 ] }
]
parameters { key: "version_labels" value { string_value: "stable=1, canary=2, gone=9" } }
parameters { key: "signature:scores_only" value { string_value: "scores" } }
"""


def classifier(version: int) -> str:
    return f"""
import numpy as np


class Model:
    def execute(self, inputs):
        feat = inputs["feat"]
        scores = np.stack([feat[:, 0], feat[:, 1], feat.sum(axis=1) + {version}], axis=1)
        classes = np.array([b"red", b"green", b"blue"] * len(feat), dtype=object).reshape(-1, 3)
        return {{"scores": scores, "classes": classes}}
"""


MULTI_CONFIG = """
name: "multi"
backend: "python"
max_batch_size: 8
input [
  { name: "a" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "blob" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "sum" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "echo_bytes" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "text" data_type: TYPE_STRING dims: [ 1 ] }
]
parameters { key: "signature:just_sum" value { string_value: "sum" } }
parameters { key: "signature:bytes_and_sum" value { string_value: "echo_bytes, sum" } }
"""
MULTI_MODEL = """
import numpy as np


class Model:
    def execute(self, inputs):
        blob = inputs["blob"]
        return {"sum": inputs["a"].sum(axis=1, keepdims=True), "echo_bytes": blob, "text": blob}
"""
TOTAL_CONFIG = """
name: "total"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "x" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "total" data_type: TYPE_FP32 dims: [ 1 ] }
]
"""
TOTAL_MODEL = """
import numpy as np


class Model:
    def execute(self, inputs):
        x = inputs["x"]
        return {"x": x, "total": np.array([x.sum()], dtype=np.float32)}
"""
BOOM_MODEL = """
class Model:
    def execute(self, inputs):
        raise RuntimeError("model code failed")
"""
BAD_PARAMETERS = """
name: "badparams"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "version_labels" value { string_value: "stable" } }
parameters { key: "signature:wrong" value { string_value: "nope" } }
"""
IDENTITY_X = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"]}
"""


def simple_config(name: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def build_repository(repo: Path) -> Path:
    write_model(repo, "classifier", CLASSIFIER_CONFIG, {1: classifier(1), 2: classifier(2)})
    write_model(repo, "multi", MULTI_CONFIG, {1: MULTI_MODEL})
    write_model(repo, "total", TOTAL_CONFIG, {1: TOTAL_MODEL})
    write_model(repo, "boom", simple_config("boom"), {1: BOOM_MODEL})
    write_model(repo, "broken", simple_config("broken"), {1: "raise ImportError('no such thing')\n"})
    write_model(repo, "badparams", BAD_PARAMETERS, {1: IDENTITY_X})
    return repo


@pytest.fixture(scope="module")
def tf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("tfserving")
    repo = build_repository(base / "models")
    server = ServerProcess(
        repo, base / "server.log", extra_args=("--max-request-bytes", str(MAX_BODY))
    ).start()
    yield server
    stop_all([server])


@pytest.fixture
def tf(tf_server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(tf_server.base_url, http_version) as c:
        yield c


# ------------------------------------------------------------------------------------------ half_plus_two


def test_half_plus_two_answers_all_three_verbs(client: httpx.Client) -> None:
    assert ok(client.post(HPT + ":predict", json={"instances": [1, 2, 5]})) == {
        "predictions": [2.5, 3.0, 4.5]
    }
    examples = {"examples": [{"x": 1}, {"x": 2.0}, {"x": [5]}]}
    for verb in ("regress", "classify"):
        doc = ok(client.post(f"{HPT}:{verb}", json=examples))
        assert doc["result"] == doc["results"]  # TF Serving's doc says one key, its code the other
        expected = [2.5, 3.0, 4.5] if verb == "regress" else [[["", 2.5]], [["", 3.0]], [["", 4.5]]]
        assert doc["results"] == expected


def test_predict_columnar_versions_and_signature_names(client: httpx.Client) -> None:
    for signature in ("", "serving_default", "tensorflow/serving/predict"):
        body = {"signature_name": signature, "inputs": [3.0, 4.0]}
        assert ok(client.post(HPT + "/versions/1:predict", json=body)) == {"outputs": [3.5, 4.0]}
    # the config's own dims ([-1, 1]) are accepted too; answers keep the model's shape
    assert ok(client.post(HPT + ":predict", json={"instances": [[1.0], [2.0]]})) == {
        "predictions": [2.5, 3.0]
    }


def test_non_finite_tokens_both_ways(client: httpx.Client) -> None:
    body = b'{"instances": [NaN, Infinity, -Infinity, 2]}'
    response = client.post(HPT + ":predict", content=body)
    assert response.status_code == 200, response.text
    assert response.content == b'{"predictions":[NaN,Infinity,-Infinity,3.0]}'
    regress = client.post(HPT + ":regress", content=b'{"examples": [{"x": -Infinity}]}')
    assert regress.content == b'{"result":[-Infinity],"results":[-Infinity]}'
    values = read(client.post(HPT + ":predict", content=b'{"inputs": [[NaN]]}'))["outputs"]
    assert len(values) == 1 and math.isnan(values[0])


def test_zero_row_batches(client: httpx.Client) -> None:
    assert ok(client.post(HPT + ":predict", json={"instances": []})) == {"predictions": []}
    assert ok(client.post(HPT + ":predict", json={"inputs": []})) == {"outputs": []}
    assert ok(client.post(HPT + ":regress", json={"examples": []})) == {"result": [], "results": []}


def test_deep_nesting_is_a_400_and_the_server_lives_on(client: httpx.Client) -> None:
    for value in (b"1", b"NaN"):
        body = b'{"instances": ' + b"[" * 5000 + value + b"]" * 5000 + b"}"
        response = client.post(HPT + ":predict", content=body)
        assert_error(response, 400, "JSON Parse error")
        assert_connection_reused(client, response)
    moderately = b'{"instances": ' + b"[" * 100 + b"1" + b"]" * 100 + b"}"
    assert_error(client.post(HPT + ":predict", content=moderately), 400, "nested more than")


def test_status_and_metadata(client: httpx.Client) -> None:
    status = {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    assert ok(client.get(HPT)) == status
    assert ok(client.get(HPT + "/versions/1")) == status
    doc = ok(client.get(HPT + "/metadata"))
    assert doc["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "1"}
    (name,) = doc["metadata"]["signature_def"]["signature_def"]
    signature = doc["metadata"]["signature_def"]["signature_def"][name]
    assert name == "serving_default" and signature["method_name"] == "tensorflow/serving/predict"
    shape = {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    assert signature["inputs"] == {"x": {"dtype": "DT_FLOAT", "tensor_shape": shape, "name": "x"}}
    assert signature["outputs"] == {"y": {"dtype": "DT_FLOAT", "tensor_shape": shape, "name": "y"}}
    assert ok(client.get(HPT + "/versions/1/metadata")) == doc


def test_metadata_of_a_multi_input_model(client: httpx.Client) -> None:
    signature = ok(client.get("/v1/models/simple_string/metadata"))["metadata"]["signature_def"]
    inputs = signature["signature_def"]["serving_default"]["inputs"]
    assert sorted(inputs) == ["INPUT0", "INPUT1"]
    assert inputs["INPUT0"]["dtype"] == "DT_STRING"
    assert [d["size"] for d in inputs["INPUT0"]["tensor_shape"]["dim"]] == ["-1", "16"]


# ------------------------------------------------------------------------------------------ example models


def test_row_objects_and_columnar_maps_on_simple(client: httpx.Client) -> None:
    a, b = list(range(16)), [2] * 16
    rows = ok(client.post("/v1/models/simple:predict", json={"instances": [{"INPUT0": a, "INPUT1": b}] * 2}))
    row = {"OUTPUT0": [x + 2 for x in a], "OUTPUT1": [x - 2 for x in a]}
    assert rows == {"predictions": [row, row]}
    columns = ok(client.post("/v1/models/simple:predict", json={"inputs": {"INPUT0": [a], "INPUT1": [b]}}))
    assert columns == {"outputs": {"OUTPUT0": [row["OUTPUT0"]], "OUTPUT1": [row["OUTPUT1"]]}}


def test_strings_and_b64_inputs(client: httpx.Client) -> None:
    words = [{"b64": b64(b"abc")}, "de"]
    doc = ok(client.post("/v1/models/simple_identity:predict", json={"instances": [words]}))
    assert doc == {"predictions": [["abc", "de"]]}


def test_unbatched_model_takes_instances_as_its_one_dimension(client: httpx.Client) -> None:
    doc = ok(client.post("/v1/models/identity_fp32:predict", json={"instances": [1, 2.5]}))
    assert doc == {"predictions": [1.0, 2.5]}


# ------------------------------------------------------------------------------------------ test models


def test_classify_labels_scores_and_version_labels(tf: httpx.Client) -> None:
    body = {"examples": [{"feat": [1, 2]}], "context": {"ignored": 1}}
    pairs = [["red", 1.0], ["green", 2.0], ["blue", 5.0]]
    assert ok(tf.post("/v1/models/classifier/labels/canary:classify", json=body))["results"] == [pairs]
    stable = ok(tf.post("/v1/models/classifier/labels/stable:classify", json=body))["result"]
    assert stable == [[["red", 1.0], ["green", 2.0], ["blue", 4.0]]]
    assert ok(tf.post("/v1/models/classifier/versions/1:classify", json=body))["results"] == stable
    assert ok(tf.post("/v1/models/classifier:classify", json=body))["results"] == [pairs]  # latest: 2
    only = ok(tf.post("/v1/models/classifier:classify", json={**body, "signature_name": "scores_only"}))
    assert only["results"] == [[["", 1.0], ["", 2.0], ["", 5.0]]]


def test_status_of_all_versions_and_by_label(tf: httpx.Client) -> None:
    available = {"error_code": "OK", "error_message": ""}
    doc = ok(tf.get("/v1/models/classifier"))
    assert [(s["version"], s["state"], s["status"]) for s in doc["model_version_status"]] == [
        ("2", "AVAILABLE", available),
        ("1", "AVAILABLE", available),
    ]
    (one,) = ok(tf.get("/v1/models/classifier/labels/stable"))["model_version_status"]
    assert one["version"] == "1"
    assert ok(tf.get("/v1/models/classifier/labels/canary/metadata"))["model_spec"]["version"] == "2"
    assert_error(tf.get("/v1/models/classifier/labels/gone"), 404, "Could not find version 9")
    assert_error(tf.post("/v1/models/classifier/labels/gone:predict", json={"instances": []}), 404, "9")
    assert_error(
        tf.get("/v1/models/classifier/labels/nope"), 400, "Unrecognized servable version label: nope"
    )


def test_metadata_lists_declared_signatures(tf: httpx.Client) -> None:
    signatures = ok(tf.get("/v1/models/multi/metadata"))["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == ["bytes_and_sum", "just_sum", "serving_default"]
    assert list(signatures["bytes_and_sum"]["outputs"]) == ["echo_bytes", "sum"]
    assert list(signatures["serving_default"]["outputs"]) == ["sum", "echo_bytes", "text"]
    assert signatures["just_sum"]["outputs"]["sum"]["dtype"] == "DT_INT64"
    assert list(signatures["just_sum"]["inputs"]) == ["a", "blob"]


def test_several_outputs_bytes_suffix_and_signatures(tf: httpx.Client) -> None:
    instances = [{"a": [1, 2], "blob": ["hi"]}, {"a": [3, 4], "blob": [{"b64": b64(b"\xff\x00")}]}]
    doc = ok(tf.post("/v1/models/multi:predict", json={"instances": instances}))
    assert doc == {
        "predictions": [
            # an output holding bytes that are no UTF-8 comes back as b64 too, all of it
            {"sum": [3], "echo_bytes": [{"b64": b64(b"hi")}], "text": [{"b64": b64(b"hi")}]},
            {"sum": [7], "echo_bytes": [{"b64": b64(b"\xff\x00")}], "text": [{"b64": b64(b"\xff\x00")}]},
        ]
    }
    text = ok(tf.post("/v1/models/multi:predict", json={"instances": instances[:1]}))["predictions"][0][
        "text"
    ]
    assert text == ["hi"]
    just_sum = ok(
        tf.post("/v1/models/multi:predict", json={"signature_name": "just_sum", "instances": instances})
    )
    assert just_sum == {"predictions": [[3], [7]]}
    columns = {"signature_name": "bytes_and_sum", "inputs": {"a": [[5, 5]], "blob": [["x"]]}}
    assert ok(tf.post("/v1/models/multi:predict", json=columns)) == {
        "outputs": {"echo_bytes": [[{"b64": b64(b"x")}]], "sum": [[10]]}
    }
    regress = {
        "signature_name": "just_sum",
        "context": {"blob": "c"},
        "examples": [{"a": [1, 1]}, {"a": [2, 5]}],
    }
    assert ok(tf.post("/v1/models/multi:regress", json=regress))["results"] == [2, 7]


def test_outputs_without_common_rows_are_columnar_only(tf: httpx.Client) -> None:
    doc = ok(tf.post("/v1/models/total:predict", json={"inputs": [1, 2, 3]}))
    assert doc == {"outputs": {"x": [1.0, 2.0, 3.0], "total": [6.0]}}
    response = tf.post("/v1/models/total:predict", json={"instances": [1, 2]})
    assert_error(response, 400, "disagree on dimension 0", "columnar")
    one = ok(tf.post("/v1/models/total:predict", json={"instances": [4]}))
    assert one == {"predictions": [{"x": 4.0, "total": 4.0}]}


def test_body_over_the_limit_is_413(tf: httpx.Client) -> None:
    body = b'{"instances": [' + b"[1, 2]," * MAX_BODY + b"[1, 2]]}"
    response = tf.post("/v1/models/classifier:predict", content=body)
    assert_error(response, 413, "--max-request-bytes")


# ------------------------------------------------------------------------------------------ errors

ERRORS = [
    ("GET", "/v1/models/nope", None, 404, "Request for unknown model: 'nope' is not found"),
    ("POST", "/v1/models/nope:predict", {"instances": [1]}, 404, "Request for unknown model"),
    ("POST", HPT + "/versions/7:predict", {"instances": [1]}, 404, "'half_plus_two' version 7 is not found"),
    ("GET", HPT + "/versions/7", None, 404, "Could not find version 7"),
    ("GET", HPT + "/versions/7/metadata", None, 404, "'half_plus_two' version 7 is not found"),
    ("POST", HPT + "/versions/HELLO:predict", {"instances": [1]}, 400, "Malformed request"),
    ("GET", HPT + ":predict", None, 400, "Malformed request: GET"),
    ("GET", "/v1/models", None, 400, "Missing model name"),
    ("GET", "/v1", None, 400, "Malformed request"),
    ("GET", "/v1/", None, 400, "Malformed request"),
    ("GET", "/v1/foo/bar", None, 400, "Malformed request"),
    ("POST", HPT + "/metadata", {}, 400, "Malformed request: POST"),
    ("POST", HPT + ":explain", {}, 400, "Malformed request"),
    ("POST", HPT + "/versions/1/labels/x:predict", {}, 400, "Malformed request"),
    ("PUT", HPT, {}, 400, "Malformed request: PUT"),
    ("DELETE", HPT + ":predict", None, 400, "Malformed request"),
    ("POST", HPT + ":predict", {"instances": [1], "inputs": [1]}, 400, "both 'instances'"),
    ("POST", HPT + ":predict", {}, 400, "neither 'instances'"),
    ("POST", HPT + ":predict", {"instances": ["x"]}, 400, "expected numbers for DT_FLOAT"),
    ("POST", HPT + ":predict", {"instances": [[1, 2], [3]]}, 400, "ragged"),
    ("POST", HPT + ":predict", {"instances": [{"x": 1}, [2]]}, 400, "item 1 is not an object"),
    ("POST", HPT + ":predict", {"instances": [{"z": 1}]}, 400, "unknown input(s) 'z'"),
    (
        "POST",
        HPT + ":predict",
        {"instances": list(range(65))},
        400,
        "inference request batch-size must be <= 64 for 'half_plus_two'",
    ),
    ("POST", HPT + ":predict", {"signature_name": 100, "instances": [1]}, 400, "must be a string value"),
    ("POST", HPT + ":predict", {"signature_name": "other", "instances": [1]}, 400, '"other" not found'),
    ("POST", HPT + ":predict", [1, 2], 400, "must be a JSON object"),
    ("POST", HPT + ":classify", {"examples": [{"x": 1}], "context": {"x": 2}}, 400, "both have"),
    ("POST", HPT + ":regress", {"examples": [{"y": 1}]}, 400, "has no feature 'x'"),
    ("POST", HPT + ":regress", {"instances": [1]}, 400, "no 'examples'"),
    ("POST", "/v1/models/simple:predict", {"instances": [[1] * 16]}, 400, "plain list"),
    (
        "POST",
        "/v1/models/simple:predict",
        {"inputs": {"INPUT0": [[1] * 16]}},
        400,
        "lacks the input(s) 'INPUT1'",
    ),
    ("POST", "/v1/models/simple_string:predict", {"inputs": [[1]]}, 400, "plain value or list"),
    (
        "POST",
        "/v1/models/simple:regress",
        {"examples": [{"INPUT0": [1] * 16, "INPUT1": [1] * 16}]},
        400,
        "'outputs'",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "fragment"), ERRORS)
def test_errors(client: httpx.Client, method: str, path: str, body, status: int, fragment: str) -> None:
    response = client.request(method, path, json=body) if body is not None else client.request(method, path)
    assert_error(response, status, fragment)
    assert_connection_reused(client, response)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "JSON Parse error"),
        (b"instances = [1, 2]", "JSON Parse error"),
        (b'{"instances": [nan]}', "JSON"),
    ],
)
def test_malformed_json(client: httpx.Client, body: bytes, fragment: str) -> None:
    assert_error(client.post(HPT + ":predict", content=body), 400, fragment)


def test_model_errors_and_unavailable_models(tf: httpx.Client, tf_server: ServerProcess) -> None:
    message = assert_error(tf.post("/v1/models/boom:predict", json={"instances": [[1.0]]}), 500, "boom")
    assert "Traceback" not in message
    assert_error(
        tf.post("/v1/models/broken:predict", json={"instances": [[1.0]]}),
        503,
        "'broken' has no available versions",
    )
    assert_error(tf.get("/v1/models/broken/metadata"), 503, "'broken' has no available versions")
    (status,) = ok(tf.get("/v1/models/broken"))["model_version_status"]
    assert status["state"] == "END" and status["status"]["error_code"] == "UNKNOWN"
    assert "no such thing" in status["status"]["error_message"]
    assert tf_server.running()


def test_bad_tf_parameters_in_a_config_are_500s_naming_them(tf: httpx.Client) -> None:
    assert_error(tf.get("/v1/models/badparams/labels/stable"), 500, "version_labels")
    assert_error(tf.post("/v1/models/badparams:predict", json={"instances": [[1]]}), 500, "signature:wrong")
    assert ok(tf.get("/v1/models/badparams"))["model_version_status"][0]["state"] == "AVAILABLE"
