"""TF Serving REST codec without a server: row and columnar predict, classify/regress, b64, non-finite
tokens, errors, status and metadata documents.

Answers are read back with the json module (which reads NaN / Infinity tokens), not with the codec.
"""

import base64
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorgate.codec import tfserving
from tensorgate.codec.datatypes import BY_V2
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferResponse, Tensor
from tensorgate.codec.tfserving import TensorInfo
from tensorgate.codec.tfserving_json import loads, to_array

MODEL = "m"
# half_plus_two: the config says dims [1] with reshape [], so TF clients see x as [-1].
X = TensorInfo("x", "FP32", (-1,), (-1, 1))
Y = TensorInfo("y", "FP32", (-1,), (-1, 1))
A = TensorInfo("a", "INT32", (-1, 2), (-1, 2))
S = TensorInfo("s", "BYTES", (-1,), (-1,))
OPT = TensorInfo("opt", "FP32", (-1,), (-1,), optional=True)


def decode(doc: dict, inputs: list[TensorInfo], outputs: list[str] | None = None):
    return tfserving.decode_predict(doc, inputs, MODEL, "1", outputs)


def assert_invalid(call, *fragments: str) -> str:
    with pytest.raises(InferError) as info:
        call()
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT, info.value.message
    for fragment in fragments:
        assert fragment in info.value.message, (fragment, info.value.message)
    return info.value.message


def response(*tensors: tuple[str, str, np.ndarray]) -> InferResponse:
    return InferResponse(MODEL, "1", [Tensor(n, d, a.shape, a) for n, d, a in tensors])


def read(body: bytes):
    return json.loads(body)  # the json module reads NaN, Infinity and -Infinity


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# ------------------------------------------------------------------------------------------ parsing


def test_loads_reads_non_finite_tokens_and_plain_json():
    assert loads(b'{"instances": [1, 2.5]}', "body") == {"instances": [1, 2.5]}
    doc = loads(memoryview(b'{"instances": [NaN, Infinity, -Infinity, 1.5]}'), "body")
    values = doc["instances"]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 1.5]


@pytest.mark.parametrize(
    "body",
    [b"", b"instances = [1, 2]", b'{"instances": [1,', b'{"instances": [nan]}', b"[" * 5000 + b"]" * 5000],
    ids=["empty", "not-json", "truncated", "lowercase-nan", "deep"],
)
def test_loads_refuses_malformed_json(body):
    assert_invalid(lambda: loads(body, "the request body"), "JSON Parse error")


def test_a_lone_surrogate_beside_non_finite_tokens_is_refused():
    """The json module (the fallback for NaN tokens) lets "\\ud800" through; answering it would crash."""
    body = b'{"signature_name": "\\ud800", "instances": [NaN]}'
    assert_invalid(lambda: loads(body, "the request body"), "surrogates not allowed")


def test_deep_nesting_with_non_finite_tokens_is_refused_not_a_crash():
    body = b'{"instances": ' + b"[" * 20000 + b"NaN" + b"]" * 20000 + b"}"
    assert_invalid(lambda: loads(body, "the request body"), "nested too deeply")


# ------------------------------------------------------------------------------- predict: row format


def test_row_format_single_input_takes_integers_for_floats_and_reshapes_to_the_config_dims():
    request, columnar = decode({"instances": [1, 2, 5]}, [X])
    assert columnar is False
    (tensor,) = request.inputs
    assert (request.model_name, request.model_version, request.outputs) == (MODEL, "1", None)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "FP32", (3, 1))
    assert tensor.data.dtype == np.float32
    assert tensor.data.ravel().tolist() == [1.0, 2.0, 5.0]


def test_row_format_accepts_the_config_dims_too():
    request, _ = decode({"instances": [[1.5], [2.5]]}, [X])
    assert request.inputs[0].shape == (2, 1)
    assert request.inputs[0].data.ravel().tolist() == [1.5, 2.5]


def test_row_format_objects_feed_several_inputs_sharing_dimension_0():
    doc = {"instances": [{"a": [1, 2], "s": "one"}, {"a": [3, 4], "s": {"b64": b64(b"\x00\xff")}}]}
    request, _ = decode(doc, [A, S])
    tensors = {t.name: t for t in request.inputs}
    assert tensors["a"].shape == (2, 2) and tensors["a"].data.tolist() == [[1, 2], [3, 4]]
    assert tensors["a"].data.dtype == np.int32
    assert tensors["s"].shape == (2,) and tensors["s"].data.tolist() == [b"one", b"\x00\xff"]


def test_row_format_b64_values_for_a_single_bytes_input():
    request, _ = decode({"instances": [{"b64": b64(b"\x01\x02")}, "text"]}, [S])
    assert request.inputs[0].data.tolist() == [b"\x01\x02", b"text"]


def test_row_format_optional_input_may_be_left_out():
    request, _ = decode({"instances": [{"x": 1.0}]}, [X, OPT])
    assert [t.name for t in request.inputs] == ["x"]


def test_empty_instances_need_no_model_run():
    assert decode({"instances": []}, [X]) == (None, False)
    assert tfserving.encode_predict(None, {}, False) == b'{"predictions":[]}'


def test_signature_outputs_become_requested_outputs():
    request, _ = decode({"instances": [1]}, [X], ["y"])
    assert [o.name for o in request.outputs] == ["y"]


@pytest.mark.parametrize(
    ("doc", "inputs", "fragments"),
    [
        ({"instances": [1], "inputs": [1]}, [X], ["both 'instances'", "'inputs'"]),
        ({"signature_name": ""}, [X], ["neither 'instances'"]),
        ({"instances": {"x": 1}}, [X], ["'instances' must be a list"]),
        ({"instances": [{"a": [1, 2], "s": "x"}, [1, 2]]}, [A, S], ["item 1 is not an object"]),
        ({"instances": [{"a": [1, 2], "s": "x"}, {"a": [1, 2]}]}, [A, S], ["item 1 has the keys ['a']"]),
        ({"instances": [{"x": 1, "z": 2}]}, [X], ["unknown input(s) 'z'"]),
        ({"instances": [{"a": [1, 2]}]}, [A, S], ["lacks the input(s) 's'"]),
        ({"instances": [[1, 2]]}, [A, S], ["plain list", "2 inputs (a, s)"]),
        ({"instances": [1, {"x": 2}]}, [X], ["expected numbers for DT_FLOAT, got an object"]),
        ({"instances": [[1], [1, 2]]}, [X], ["ragged"]),
        ({"instances": [[1], 2]}, [X], ["ragged"]),
        ({"instances": ["1.5"]}, [X], ["expected numbers for DT_FLOAT, got str '1.5'"]),
        ({"instances": [1, None]}, [X], ["got null"]),
        ({"instances": [True]}, [X], ["got bool True"]),
        ({"instances": [[1.5, 2]]}, [A], ["expected integers for DT_INT32, got float 1.5"]),
        ({"instances": [[1, 2**40]]}, [A], ["outside the range of DT_INT32"]),
        ({"instances": [1e300]}, [X], ["outside the range of DT_FLOAT"]),
        ({"instances": [[1, 2, 3]]}, [A], ["has shape [1, 3], the model expects [-1, 2]"]),
        ({"instances": [[[1]]]}, [X], ["has shape [1, 1, 1]"]),
        ({"instances": [3]}, [S], ["expected strings or {'b64': ...} objects for DT_STRING, got int 3"]),
        ({"instances": [{"b64": "not base64!"}]}, [S], ["is not valid base64"]),
        ({"instances": [{"b64": "QQ=="}, {"b64": 1}]}, [S], ["got an object"]),
        ({"instances": ["a", ["b"]]}, [S], ["ragged"]),
        (
            {"instances": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
            [X],
            ["nested"],
        ),
    ],
)
def test_row_format_errors_name_the_problem(doc, inputs, fragments):
    assert_invalid(lambda: decode(doc, inputs), *fragments)


def test_a_lone_surrogate_string_is_refused():
    assert_invalid(lambda: decode({"instances": ["\ud800"]}, [S]), "not valid UTF-8")


# ------------------------------------------------------------------------------- predict: columnar


def test_columnar_bare_value_for_the_one_input():
    request, columnar = decode({"inputs": [3.0, 4.0]}, [X])
    assert columnar is True
    assert request.inputs[0].shape == (2, 1)


def test_columnar_object_inputs_may_differ_in_dimension_0():
    b = TensorInfo("b", "INT64", (-1,), (-1,))
    request, _ = decode({"inputs": {"a": [[1, 2]], "b": [1, 2, 3]}}, [A, b])
    shapes = {t.name: t.shape for t in request.inputs}
    assert shapes == {"a": (1, 2), "b": (3,)}


def test_columnar_single_b64_object_is_a_value_not_a_map():
    scalar = TensorInfo("s", "BYTES", (), ())
    request, _ = decode({"inputs": {"b64": b64(b"\xfe")}}, [scalar])
    assert request.inputs[0].shape == () and request.inputs[0].data[()] == b"\xfe"


def test_columnar_zero_rows_are_a_tensor():
    request, _ = decode({"inputs": []}, [X])
    assert request.inputs[0].shape == (0, 1)


@pytest.mark.parametrize(
    ("doc", "inputs", "fragments"),
    [
        ({"inputs": [1, 2]}, [A, S], ["'inputs' is a plain value or list", "send an object"]),
        ({"inputs": {"a": [[1, 2]]}}, [A, S], ["'inputs' lacks the input(s) 's'"]),
        ({"inputs": {"x": [1], "q": 1}}, [X], ["unknown input(s) 'q'"]),
        ({"inputs": 5}, [X], ["has shape [], the model expects [-1]"]),
    ],
)
def test_columnar_errors(doc, inputs, fragments):
    assert_invalid(lambda: decode(doc, inputs), *fragments)


def test_signature_name_must_be_a_string():
    assert tfserving.signature_name({"signature_name": "serving_default"}) == "serving_default"
    assert tfserving.signature_name({}) == ""
    assert_invalid(lambda: tfserving.signature_name({"signature_name": 100}), "must be a string value")
    assert_invalid(lambda: tfserving.signature_name([1]), "must be a JSON object")


# ------------------------------------------------------------------------------------------ datatypes


@pytest.mark.parametrize(
    ("datatype", "value", "expected"),
    [
        ("BOOL", [True, False], [True, False]),
        ("UINT8", [0, 255], [0, 255]),
        ("INT8", [-128, 127], [-128, 127]),
        ("UINT64", [0, 2**64 - 1], [0, 2**64 - 1]),
        ("INT64", [[-(2**63)], [2**63 - 1]], [[-(2**63)], [2**63 - 1]]),
        ("FP16", [1, 0.5], [1.0, 0.5]),
        ("FP64", [[1, 2.25]], [[1.0, 2.25]]),
        ("FP32", 7, 7.0),
        ("INT32", [], []),
    ],
)
def test_json_values_fill_every_numeric_datatype(datatype, value, expected):
    array = to_array(value, BY_V2[datatype], "t")
    assert array.dtype == BY_V2[datatype].numpy
    assert array.tolist() == expected


@pytest.mark.parametrize(
    ("datatype", "value", "fragment"),
    [
        ("UINT8", [256], "outside the range of DT_UINT8"),
        ("UINT64", [-1], "outside the range of DT_UINT64"),
        ("INT64", [2**64], "outside the range of DT_INT64"),
        ("BOOL", [1], "expected booleans for DT_BOOL"),
        ("INT32", [[True]], "expected integers for DT_INT32, got bool"),
        ("FP16", [70000], "outside the range of DT_HALF"),
        ("FP32", [1.0] * 100 + [1e300], "outside the range of DT_FLOAT"),
        ("FP32", [float("nan"), -1e300], "outside the range of DT_FLOAT"),
        ("FP32", [[1e300]], "outside the range of DT_FLOAT"),
    ],
)
def test_json_values_out_of_type_or_range(datatype, value, fragment):
    assert_invalid(lambda: to_array(value, BY_V2[datatype], "t"), fragment)


def test_non_finite_inputs_stay_non_finite():
    array = to_array([float("nan"), float("inf"), -float("inf"), 1e38], BY_V2["FP32"], "t")
    assert np.isnan(array[0]) and array[1:].tolist() == [np.inf, -np.inf, np.float32(1e38)]


def test_bf16_inputs_round_to_nearest_even_bit_patterns():
    bits = to_array([1.0, -2.0, 1.00390625, float("nan")], BY_V2["BF16"], "t")
    assert bits.dtype == np.uint16
    assert bits[:3].tolist() == [0x3F80, 0xC000, 0x3F80]  # 1 + 2**-8 is halfway: rounds to even
    assert bits[3] == 0x7FC0


# ------------------------------------------------------------------------------- predict answers


def test_row_answer_bare_values_for_one_output_in_the_models_own_shape():
    y = np.array([[2.5], [3.0], [4.5]], dtype=np.float32)  # the config's dims; the model's own is [3]
    body = tfserving.encode_predict(response(("y", "FP32", y)), {"y": Y}, columnar=False)
    assert read(body) == {"predictions": [2.5, 3.0, 4.5]}


def test_row_answer_objects_for_several_outputs():
    out = response(
        ("sum", "INT32", np.array([[1, 2], [3, 4]], dtype=np.int32)),
        ("name", "BYTES", np.array([b"a", b"b"], dtype=object)),
    )
    body = tfserving.encode_predict(out, {}, columnar=False)
    assert read(body) == {"predictions": [{"sum": [1, 2], "name": "a"}, {"sum": [3, 4], "name": "b"}]}


def test_columnar_answer_keyed_by_name_and_bare_for_one():
    two = response(("p", "FP64", np.array([0.5, 1.0])), ("q", "BOOL", np.array([[True], [False]])))
    assert read(tfserving.encode_predict(two, {}, True)) == {
        "outputs": {"p": [0.5, 1.0], "q": [[True], [False]]}
    }
    one = response(("p", "UINT64", np.array(2**64 - 1, dtype=np.uint64)))
    assert read(tfserving.encode_predict(one, {}, True)) == {"outputs": 2**64 - 1}


def test_bytes_outputs_named_bytes_answer_b64_and_other_binary_too():
    raw = np.array([[b"\x00\x01", b"ok"]], dtype=object)
    out = response(
        ("image_bytes", "BYTES", raw), ("text", "BYTES", np.array([[b"\xff", b"x"]], dtype=object))
    )
    doc = read(tfserving.encode_predict(out, {}, columnar=False))
    (row,) = doc["predictions"]
    assert row["image_bytes"] == [{"b64": b64(b"\x00\x01")}, {"b64": b64(b"ok")}]
    # not UTF-8 and not named *_bytes: base64 as well, rather than mangled text
    assert row["text"] == [{"b64": b64(b"\xff")}, {"b64": b64(b"x")}]
    plain = response(("text", "BYTES", np.array([b"caf\xc3\xa9"], dtype=object)))
    assert read(tfserving.encode_predict(plain, {}, True)) == {"outputs": ["café"]}


def test_non_finite_values_are_written_as_bare_tokens():
    values = np.array([[np.nan, 1.5], [np.inf, -np.inf]], dtype=np.float32)
    body = tfserving.encode_predict(response(("y", "FP32", values)), {}, columnar=True)
    assert body == b'{"outputs":[[NaN,1.5],[Infinity,-Infinity]]}'
    rows = response(("y", "FP32", values), ("n", "INT32", np.array([7, 8], dtype=np.int32)))
    body = tfserving.encode_predict(rows, {}, columnar=False)
    assert body == b'{"predictions":[{"y":[NaN,1.5],"n":7},{"y":[Infinity,-Infinity],"n":8}]}'
    scalar = response(("y", "FP64", np.array(np.nan)))
    assert tfserving.encode_predict(scalar, {}, columnar=True) == b'{"outputs":NaN}'


def test_bf16_outputs_are_answered_as_floats():
    bits = np.array([0x3F80, 0xC040], dtype=np.uint16)
    assert read(tfserving.encode_predict(response(("b", "BF16", bits)), {}, True)) == {"outputs": [1.0, -3.0]}


def test_non_contiguous_outputs_are_written():
    array = np.arange(6, dtype=np.int64).reshape(2, 3).T
    assert read(tfserving.encode_predict(response(("t", "INT64", array)), {}, False)) == {
        "predictions": [[0, 3], [1, 4], [2, 5]]
    }


def test_row_answer_needs_rows_that_agree():
    scalar = response(("s", "FP32", np.array(1.0, dtype=np.float32)))
    assert_invalid(lambda: tfserving.encode_predict(scalar, {}, False), "is a scalar", "columnar")
    ragged = response(("a", "FP32", np.zeros(2, np.float32)), ("b", "FP32", np.zeros(3, np.float32)))
    assert_invalid(lambda: tfserving.encode_predict(ragged, {}, False), "disagree on dimension 0")


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64]),
        shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),  # [] has no inner dims
        elements={"allow_nan": True, "allow_infinity": True},
    ),
    st.booleans(),
)
def test_float_tensors_round_trip_through_json_with_non_finite_values(array, columnar):
    name, datatype = "t", "FP32" if array.dtype == np.float32 else "FP64"
    info = TensorInfo(name, datatype, (-1,) + array.shape[1:], (-1,) + array.shape[1:])
    body = tfserving.encode_predict(response((name, datatype, array)), {name: info}, columnar)
    sent = read(body)["outputs" if columnar else "predictions"]
    # what the answer says is what a client sends back: the same tensor comes out
    request, _ = decode({"inputs" if columnar else "instances": sent}, [info])
    back = request.inputs[0].data
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back.reshape(array.shape), array)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(dtype=np.int32, shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3)))
def test_nested_rows_decode_to_their_shape(array):
    info = TensorInfo("t", "INT32", (-1,) * array.ndim, (-1,) * array.ndim)
    request, _ = decode({"instances": array.tolist()}, [info])
    np.testing.assert_array_equal(request.inputs[0].data, array)


# ------------------------------------------------------------------------------- classify, regress


def examples(doc: dict, inputs: list[TensorInfo], outputs: list[str]):
    return tfserving.decode_examples(doc, inputs, MODEL, "1", outputs)


def test_examples_become_rows_merged_with_the_context():
    b = TensorInfo("b", "INT64", (-1,), (-1,))
    doc = {"context": {"b": 7}, "examples": [{"x": 1.0, "unused": "z"}, {"x": [2]}]}
    request = examples(doc, [X, b], ["y"])
    tensors = {t.name: t for t in request.inputs}
    assert tensors["x"].shape == (2, 1) and tensors["x"].data.ravel().tolist() == [1.0, 2.0]
    assert tensors["b"].data.tolist() == [7, 7]
    assert [o.name for o in request.outputs] == ["y"]


def test_flat_feature_lists_fill_a_fixed_row_shape():
    grid = TensorInfo("g", "FP32", (-1, 2, 2), (-1, 2, 2))
    request = examples({"examples": [{"g": [1, 2, 3, 4]}]}, [grid], ["y"])
    assert request.inputs[0].data.tolist() == [[[1, 2], [3, 4]]]


def test_no_examples_need_no_model_run():
    assert examples({"examples": []}, [X], ["y"]) is None
    assert read(tfserving.encode_classify(None, ["y"], {})) == {"result": [], "results": []}
    assert read(tfserving.encode_regress(None, ["y"], {})) == {"result": [], "results": []}


@pytest.mark.parametrize(
    ("doc", "fragments"),
    [
        ({}, ["no 'examples' list"]),
        ({"examples": {"x": 1}}, ["'examples' must be a list"]),
        ({"examples": [1]}, ["example 0 must be an object"]),
        ({"context": [1], "examples": [{"x": 1}]}, ["'context' must be an object"]),
        ({"context": {"x": 1}, "examples": [{"x": 2}]}, ["example 0 and the context both have", "'x'"]),
        ({"examples": [{"x": 1}, {"z": 2}]}, ["example 1 has no feature 'x'"]),
        ({"examples": [{"x": "one"}]}, ["feature 'x'", "expected numbers"]),
        ({"examples": [{"x": [1, 2]}]}, ["has shape [1, 2]"]),
    ],
)
def test_example_errors(doc, fragments):
    assert_invalid(lambda: examples(doc, [X], ["y"]), *fragments)


def test_classify_and_regress_pick_their_outputs():
    assert tfserving.classify_outputs(["y"], MODEL) == ["y"]
    assert tfserving.classify_outputs(["classes", "scores", "z"], MODEL) == ["scores", "classes"]
    assert_invalid(lambda: tfserving.classify_outputs(["a", "b"], MODEL), "no 'scores' output")
    assert tfserving.regress_output(["y"], MODEL) == ["y"]
    assert tfserving.regress_output(["a", "outputs"], MODEL) == ["outputs"]
    assert_invalid(lambda: tfserving.regress_output(["a", "b"], MODEL), "none named 'outputs'")


def test_classify_answers_label_score_pairs_under_both_keys():
    scores = np.array([[0.75, 0.25], [np.nan, 1.0]], dtype=np.float32)
    classes = np.array([[b"cat", b"dog"], [b"cat", b"dog"]], dtype=object)
    out = response(("scores", "FP32", scores), ("classes", "BYTES", classes))
    body = tfserving.encode_classify(out, ["scores", "classes"], {})
    expected = [[["cat", 0.75], ["dog", 0.25]], [["cat", "NaN"], ["dog", 1.0]]]
    doc = read(body.replace(b"NaN", b'"NaN"'))  # the token is bare in the body
    assert doc == {"result": expected, "results": expected}
    assert b'["cat",NaN]' in body


def test_classify_without_classes_has_empty_labels():
    out = response(("y", "FP32", np.array([[2.5], [3.0]], dtype=np.float32)))
    body = tfserving.encode_classify(out, ["y"], {"y": Y})
    assert read(body)["results"] == [[["", 2.5]], [["", 3.0]]]


def test_classify_shape_errors():
    scores = response(("scores", "FP32", np.zeros((2, 2, 2), np.float32)))
    assert_invalid(lambda: tfserving.encode_classify(scores, ["scores"], {}), "[examples] or [examples, n]")
    mismatch = response(
        ("scores", "FP32", np.zeros((2, 2), np.float32)),
        ("classes", "BYTES", np.array([[b"a"]] * 2, dtype=object)),
    )
    assert_invalid(
        lambda: tfserving.encode_classify(mismatch, ["scores", "classes"], {}), "'classes' has shape"
    )


def test_regress_answers_one_number_per_example():
    out = response(("y", "FP32", np.array([[2.5], [np.inf]], dtype=np.float32)))
    assert (
        tfserving.encode_regress(out, ["y"], {"y": Y})
        == b'{"result":[2.5,Infinity],"results":[2.5,Infinity]}'
    )
    wide = response(("y", "FP32", np.zeros((2, 3), np.float32)))
    assert_invalid(lambda: tfserving.encode_regress(wide, ["y"], {}), "one number per example")


# ------------------------------------------------------------------------------- errors, status, metadata


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (ErrorKind.INVALID_ARGUMENT, 400),
        (ErrorKind.NOT_FOUND, 404),
        (ErrorKind.UNAVAILABLE, 503),
        (ErrorKind.RESOURCE_EXHAUSTED, 429),
        (ErrorKind.UNIMPLEMENTED, 501),
        (ErrorKind.INTERNAL, 500),
    ],
)
def test_error_body_and_status(kind, status):
    assert tfserving.error_body(InferError(kind, 'bad "thing"')) == (status, b'{"error":"bad \\"thing\\""}')


def test_model_status_document():
    statuses = [tfserving.version_status(2, "AVAILABLE"), tfserving.version_status(1, "END", "it broke")]
    assert read(tfserving.model_status(statuses)) == {
        "model_version_status": [
            {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
            {
                "version": "1",
                "state": "END",
                "status": {"error_code": "UNKNOWN", "error_message": "it broke"},
            },
        ]
    }


def test_model_metadata_document():
    body = tfserving.model_metadata("half_plus_two", "1", {"serving_default": ([X], [Y])})
    x_info = {
        "dtype": "DT_FLOAT",
        "tensor_shape": {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False},
        "name": "x",
    }
    doc = read(body)
    assert doc["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "1"}
    signature = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"] == {"x": x_info}
    assert signature["outputs"]["y"]["dtype"] == "DT_FLOAT"
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert signature["defaults"] == {}


@pytest.mark.parametrize("value", [[True, 2, 3], [[1.5], [False]]], ids=["flat", "nested"])
def test_booleans_among_numbers_are_refused(value: list) -> None:
    assert_invalid(lambda: to_array(value, BY_V2["FP32"], "input 'x'"), "input 'x'", "booleans", "DT_FLOAT")
