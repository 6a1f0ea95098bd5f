"""codec.grps, codec.grps_mapping, codec.grps_yaml without a server: GrpsMessage JSON and protobuf in,
InferRequest for a model out; InferResponse in, the answer as grps JSON and GrpsMessage out."""

from dataclasses import dataclass

import betterproto2
import numpy as np
import orjson
import pytest

import tensorgate.proto.grps.protos.v1 as pb
from tensorgate.codec import grps as wire
from tensorgate.codec import grps_answers as answers
from tensorgate.codec import grps_mapping as mapping
from tensorgate.codec.datatypes import BY_V2, DataType
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.grps_yaml import dump
from tensorgate.codec.tensor import InferResponse, Tensor


@dataclass
class Spec:
    name: str
    dtype: DataType
    shape: tuple[int, ...]


def spec(name: str, v2: str, *shape: int) -> Spec:
    return Spec(name, BY_V2[v2], shape)


def by_name(*specs: Spec) -> dict[str, Spec]:
    """A model's inputs as the mapping takes them: by name, in order."""
    return {s.name: s for s in specs}


def decode(doc: object) -> wire.Payload:
    return wire.payload_from_json(orjson.dumps(doc))


def refused(call, *fragments: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT) -> str:
    with pytest.raises(InferError) as caught:
        call()
    assert caught.value.kind is kind, caught.value.message
    for fragment in fragments:
        assert fragment in caught.value.message, (fragment, caught.value.message)
    return caught.value.message


def response(*tensors: Tensor) -> InferResponse:
    return InferResponse("m", "1", list(tensors))


def t(name: str, v2: str, values: object, shape: tuple[int, ...] | None = None) -> Tensor:
    array = np.array(values, dtype=BY_V2[v2].numpy)
    if shape is not None:
        array = array.reshape(shape)
    return Tensor(name, v2, array.shape, array)


# ------------------------------------------------------------------------------ JSON requests


def test_gtensors_in_both_spellings_and_enum_forms_decode_alike() -> None:
    snake = decode(
        {
            "model": "simple-1",
            "gtensors": {
                "tensors": [{"name": "a", "dtype": "DT_INT32", "shape": [2, 2], "flat_int32": [1, 2, 3, 4]}]
            },
        }
    )
    camel = decode(
        {
            "model": "simple-1",
            "gtensors": {"tensors": [{"name": "a", "dtype": 4, "shape": [2, 2], "flatInt32": [1, 2, 3, 4]}]},
        }
    )
    for payload in (snake, camel):
        assert payload.model == "simple-1" and payload.kind == "gtensors"
        (tensor,) = payload.tensors
        assert (tensor.name, tensor.datatype, tensor.shape) == ("a", "INT32", (2, 2))
        assert tensor.data.dtype == np.int32 and tensor.data.tolist() == [[1, 2], [3, 4]]


def test_every_grps_dtype_decodes_to_its_datatype() -> None:
    tensors = [
        {"name": "u8", "dtype": "DT_UINT8", "flat_uint8": [0, 255]},
        {"name": "i8", "dtype": "DT_INT8", "flat_int8": [-128, 127]},
        {"name": "i16", "dtype": "DT_INT16", "flat_int16": [-3, 4]},
        {"name": "i64", "dtype": "DT_INT64", "flat_int64": ["-9223372036854775808", 5]},
        {"name": "f16", "dtype": "DT_FLOAT16", "flat_float16": [0.5, 2]},
        {"name": "f32", "dtype": "DT_FLOAT32", "flat_float32": ["NaN", "-Infinity", 1.25]},
        {"name": "f64", "dtype": "DT_FLOAT64", "flatFloat64": [0.1, "Infinity"]},
        {"name": "s", "dtype": "DT_STRING", "flat_string": ["héllo", ""]},
    ]
    decoded = {x.name: x for x in decode({"gtensors": {"tensors": tensors}}).tensors}
    assert {n: x.datatype for n, x in decoded.items()} == {
        "u8": "UINT8", "i8": "INT8", "i16": "INT16", "i64": "INT64",
        "f16": "FP16", "f32": "FP32", "f64": "FP64", "s": "BYTES",
    }  # fmt: skip
    assert decoded["i64"].data.tolist() == [-(2**63), 5]
    assert np.isnan(decoded["f32"].data[0]) and decoded["f32"].data[1] == -np.inf
    assert decoded["f64"].data.tolist() == [0.1, np.inf]
    assert decoded["s"].data.tolist() == ["héllo".encode(), b""]
    # without a shape, the values are a flat vector
    assert {x.shape for n, x in decoded.items() if n != "f32"} == {(2,)} and decoded["f32"].shape == (3,)


def test_a_gtensor_without_dtype_takes_the_dtype_of_its_values() -> None:
    (tensor,) = decode({"gtensors": {"tensors": [{"shape": [1, 2], "flat_float64": [1, 2]}]}}).tensors
    assert (tensor.name, tensor.datatype, tensor.shape) == ("", "FP64", (1, 2))


def test_ndarray_is_one_fp32_tensor_shaped_as_its_nesting() -> None:
    payload = decode({"ndarray": [[[1, 2, 3]], [[4, 5.5, 6]]]})
    (tensor,) = payload.tensors
    assert (payload.kind, tensor.datatype, tensor.shape) == ("ndarray", "FP32", (2, 1, 3))
    assert tensor.data.dtype == np.float32 and tensor.data[1, 0, 1] == 5.5


def test_str_bin_and_gmap_decode_to_single_elements() -> None:
    assert decode({"str_data": "hello grps"}).tensors[0].data[()] == b"hello grps"
    assert decode({"strData": ""}).tensors[0].data[()] == b""
    assert decode({"bin_data": "AAEC/w=="}).tensors[0].data[()] == b"\x00\x01\x02\xff"
    assert decode({"binData": "AAEC_w"}).tensors[0].data[()] == b"\x00\x01\x02\xff"  # URL-safe, unpadded
    gmap = decode(
        {
            "gmap": {
                "s_s": {"a": "x"},
                "sB": {"b": "/w=="},
                "s_i32": {"c": 3},
                "s_i64": {"d": "-4"},
                "sF": {"e": 1.5},
                "s_d": {"f": "NaN"},
            }
        }
    )
    found = {x.name: (x.datatype, x.shape, x.data[()]) for x in gmap.tensors}
    assert found["a"] == ("BYTES", (), b"x") and found["b"] == ("BYTES", (), b"\xff")
    assert (
        found["c"] == ("INT32", (), 3) and found["d"] == ("INT64", (), -4) and found["e"] == ("FP32", (), 1.5)
    )
    assert found["f"][0] == "FP64" and np.isnan(found["f"][2])


def test_octet_stream_bodies_are_bin_data() -> None:
    payload = wire.payload_from_bytes(memoryview(b"\x00raw\xff"))
    assert (payload.kind, payload.model, payload.tensors[0].data[()]) == ("bin_data", "", b"\x00raw\xff")


def test_unknown_fields_and_nulls_are_ignored_and_status_is_not_data() -> None:
    payload = decode({"status": {"code": 200}, "whatever": [1], "gmap": None, "str_data": "x", "model": None})
    assert (payload.kind, payload.model) == ("str_data", "")


@pytest.mark.parametrize(
    "doc",
    [
        {"str_data": "a b"},
        {"bin_data": "aGk="},
        {"gmap": {"s_s": {"k": "v"}, "s_i64": {"n": "12"}, "s_d": {"x": 0.25}}},
        {
            "gtensors": {
                "tensors": [{"name": "x", "dtype": "DT_INT64", "shape": [2], "flat_int64": ["1", "-2"]}]
            }
        },
        {"model": "m-3", "gtensors": {"tensors": [{"dtype": 7, "shape": [1, 1], "flatFloat32": [0.5]}]}},
    ],
)
def test_our_json_reading_agrees_with_protobuf_json_via_betterproto2(doc: dict) -> None:
    ours = decode(doc)
    theirs = wire.payload_from_message(pb.GrpsMessage.from_dict(doc))
    assert (ours.model, ours.kind) == (theirs.model, theirs.kind)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape)
        assert a.data.tolist() == b.data.tolist()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "body is empty"),
        (b"{", "malformed JSON"),
        (b"[1]", "must be a JSON object"),
        (b"{}", "carries no data"),
        (b'{"model": 3, "str_data": "x"}', "'model' must be a string"),
        (b'{"str_data": "x", "gmap": {"s_s": {"a": "b"}}}', "data_oneof holds one"),
        (b'{"str_data": 5}', "str_data must be a string"),
        (b'{"bin_data": "***"}', "not valid base64"),
        (b'{"gtensors": {"tensors": []}}', "non-empty list 'tensors'"),
        (b'{"gtensors": {"tensors": [{"dtype": "DT_BOOL", "flat_uint8": [1]}]}}', "unknown dtype 'DT_BOOL'"),
        (b'{"gtensors": {"tensors": [{"dtype": 42, "flat_uint8": [1]}]}}', "unknown dtype 42"),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_INT32", "flat_float32": [1]}]}}',
            "values are in flat_float32",
        ),
        (b'{"gtensors": {"tensors": [{"flat_int32": [1], "flat_int64": [1]}]}}', "no dtype, and 2 flat_*"),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": 4, "shape": [3], "flat_int32": [1, 2]}]}}',
            "holds 2 values, its shape [3] needs 3",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": 4, "shape": [-1], "flat_int32": [1]}]}}',
            "non-negative integers",
        ),
        # every flat_* field that is set (not null) must be a list, even a falsy one
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_INT32", "flat_int32": 0}]}}',
            "gtensor 'a': flat_int32 must be a list",
        ),
        (b'{"gtensors": {"tensors": [{"flatInt32": ""}]}}', "flat_int32 must be a list"),
        (
            b'{"gtensors": {"tensors": [{"dtype": "DT_INT32", "flat_int32": [1], "flat_float32": false}]}}',
            "flat_float32 must be a list",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_INT8", "flat_int8": [300]}]}}',
            "outside the range of DT_INT8",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_INT32", "flat_int32": [1.5]}]}}',
            "expected integers, got float 1.5",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_INT32", "flat_int32": [true]}]}}',
            "expected integers, got bool",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_FLOAT32", "flat_float32": [1e39]}]}}',
            "outside the range of DT_FLOAT32",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_FLOAT32", "flat_float32": ["x"]}]}}',
            "expected numbers, got str",
        ),
        (
            b'{"gtensors": {"tensors": [{"name": "a", "dtype": "DT_STRING", "flat_string": [1]}]}}',
            "must be a string",
        ),
        (b'{"ndarray": []}', "non-empty"),
        (b'{"ndarray": [[1, 2], [3]]}', "every row of the same length"),
        (b'{"ndarray": [["a"]]}', "array of numbers"),
        (b'{"ndarray": [true]}', "array of numbers"),
        (b'{"ndarray": [[true], [2]]}', "array of numbers"),
        (b'{"ndarray": [[1], [1e39]]}', "ndarray holds values outside the range of DT_FLOAT32"),
        (b'{"gmap": {}}', "gmap holds no values"),
        (b'{"gmap": {"s_s": {"k": "a"}, "s_i32": {"k": 1}}}', "gmap key 'k' is given twice"),
        (b'{"gmap": {"s_i32": {"k": 4294967296}}}', "outside the range of DT_INT32"),
    ],
)
def test_bad_json_requests_are_refused_with_a_message_naming_the_problem(body: bytes, fragment: str) -> None:
    refused(lambda: wire.payload_from_json(body), fragment)


# --------------------------------------------------------------------------- protobuf requests


def test_messages_decode_to_payloads() -> None:
    tensor = pb.GenericTensor(name="a", dtype=pb.DataType.DT_INT16, shape=[2], flat_int16=[-1, 7])
    payload = wire.payload_from_message(
        pb.GrpsMessage(model="m", gtensors=pb.GenericTensorData(tensors=[tensor]))
    )
    assert payload.model == "m" and payload.tensors[0].datatype == "INT16"
    assert payload.tensors[0].data.tolist() == [-1, 7]
    assert wire.payload_from_message(pb.GrpsMessage(bin_data=b"")).tensors[0].data[()] == b""
    assert wire.payload_from_message(pb.GrpsMessage(str_data="é")).tensors[0].data[()] == "é".encode()
    gmap = wire.payload_from_message(
        pb.GrpsMessage(gmap=pb.GenericMapData(s_b={"k": b"\xff"}, s_f={"f": 0.5}))
    )
    assert {x.name: x.data[()] for x in gmap.tensors} == {"k": b"\xff", "f": 0.5}


def test_messages_without_data_or_with_ndarray_are_refused() -> None:
    refused(lambda: wire.payload_from_message(pb.GrpsMessage()), "carries no data")
    refused(lambda: wire.payload_from_message(pb.GrpsMessage(ndarray=pb.NdArrayData())), "only in HTTP JSON")
    out_of_range = pb.GenericTensor(name="a", dtype=pb.DataType.DT_UINT8, flat_uint8=[256])
    message = pb.GrpsMessage(gtensors=pb.GenericTensorData(tensors=[out_of_range]))
    refused(lambda: wire.payload_from_message(message), "outside the range of DT_UINT8")


# ------------------------------------------------------------------------------ mapping to models


def test_gtensors_go_to_inputs_by_name_or_position_converted_to_their_datatype() -> None:
    payload = decode(
        {
            "gtensors": {
                "tensors": [
                    {"dtype": "DT_INT32", "flat_int32": [1, 2]},
                    {"name": "B", "dtype": "DT_INT32", "flat_int32": [0, 1]},
                ]
            }
        }
    )
    inputs = by_name(spec("A", "FP64", -1), spec("B", "BOOL", -1))
    request = mapping.to_infer_request(payload, "m", "2", inputs)
    assert (request.model_name, request.model_version) == ("m", "2")
    a, b = request.inputs
    assert (a.name, a.datatype, a.data.dtype, a.data.tolist()) == ("A", "FP64", np.float64, [1.0, 2.0])
    assert (b.name, b.datatype, b.data.tolist()) == ("B", "BOOL", [False, True])


def test_inputs_without_a_grps_dtype_take_the_one_that_carries_them() -> None:
    payload = decode(
        {
            "gtensors": {
                "tensors": [
                    {"name": "u16", "dtype": "DT_INT32", "flat_int32": [65535]},
                    {"name": "u64", "dtype": "DT_INT64", "flat_int64": ["9223372036854775807"]},
                    {"name": "bf", "dtype": "DT_FLOAT32", "flat_float32": [1.0, -2.5]},
                ]
            }
        }
    )
    inputs = by_name(spec("u16", "UINT16", -1), spec("u64", "UINT64", -1), spec("bf", "BF16", -1))
    u16, u64, bf = mapping.to_infer_request(payload, "m", "", inputs).inputs
    assert u16.data.dtype == np.uint16 and u16.data.tolist() == [65535]
    assert u64.data.dtype == np.uint64 and u64.data.tolist() == [2**63 - 1]
    assert bf.datatype == "BF16" and bf.data.tolist() == [0x3F80, 0xC020]  # bfloat16 bit patterns


@pytest.mark.parametrize(
    ("dtype", "values", "target", "fragment"),
    [
        ("DT_FLOAT32", [1.5], "INT32", "floating-point values (DT_FLOAT32) cannot fill it"),
        ("DT_INT64", [2**40], "INT32", "outside its range"),
        ("DT_INT32", [-1], "UINT8", "outside its range"),
        ("DT_UINT8", [2], "BOOL", "outside its range"),
        ("DT_INT32", [1], "BYTES", "DT_INT32 values cannot fill it"),
        ("DT_STRING", ["1"], "INT32", "DT_STRING values cannot fill it"),
        ("DT_FLOAT64", [1e6], "FP16", "is FP16: the values are outside its range"),
        ("DT_INT64", [2**40], "FP16", "is FP16: the values are outside its range"),
        ("DT_FLOAT64", [1e300], "FP32", "is FP32: the values are outside its range"),
        ("DT_FLOAT64", [-1e300], "BF16", "is BF16: the values are outside its range"),
    ],
)
@pytest.mark.filterwarnings("error")  # refused before anything overflows
def test_values_a_datatype_cannot_hold_are_refused(
    dtype: str, values: list, target: str, fragment: str
) -> None:
    payload = decode(
        {"gtensors": {"tensors": [{"name": "x", "dtype": dtype, wire.flat_field(dtype): values}]}}
    )
    refused(
        lambda: mapping.to_infer_request(payload, "m", "", by_name(spec("x", target, -1))),
        "model 'm', input 'x'",
        fragment,
    )


@pytest.mark.filterwarnings("error")  # nothing overflows
def test_floats_narrow_to_float_inputs_and_infinities_stay_infinite() -> None:
    payload = decode(
        {
            "gtensors": {
                "tensors": [
                    {"name": "s", "dtype": "DT_FLOAT64", "flat_float64": [1.5, "Infinity", "NaN"]},
                    {"name": "b", "dtype": "DT_FLOAT64", "flat_float64": [-2.5, "-Infinity"]},
                    {"name": "h", "dtype": "DT_INT64", "flat_int64": [2048]},
                ]
            }
        }
    )
    inputs = by_name(spec("s", "FP32", -1), spec("b", "BF16", -1), spec("h", "FP16", -1))
    s, b, h = mapping.to_infer_request(payload, "m", "", inputs).inputs
    assert s.data.dtype == np.float32 and s.data[:2].tolist() == [1.5, np.inf] and np.isnan(s.data[2])
    assert b.data.tolist() == [0xC020, 0xFF80]  # bfloat16 bit patterns of -2.5 and -inf
    assert h.data.dtype == np.float16 and h.data.tolist() == [2048.0]


def test_unknown_names_are_left_for_the_model_to_refuse_and_missing_positions_are_refused() -> None:
    payload = decode({"gmap": {"s_i32": {"nope": 1}}})
    (tensor,) = mapping.to_infer_request(payload, "m", "", by_name(spec("x", "INT32", -1))).inputs
    assert (tensor.name, tensor.shape) == ("nope", (1,))
    unnamed = decode({"gtensors": {"tensors": [{"flat_int32": [1]}, {"flat_int32": [2]}]}})
    refused(
        lambda: mapping.to_infer_request(unnamed, "m", "", by_name(spec("x", "INT32", -1))),
        "gtensor 1 needs a name",
    )


def test_single_elements_take_the_shape_the_input_wants() -> None:
    text = mapping.to_infer_request(
        decode({"str_data": "hi"}), "m", "", by_name(spec("N", "INT32", 1), spec("T", "BYTES", -1, 1))
    )
    (tensor,) = text.inputs
    assert (tensor.name, tensor.shape, tensor.data.tolist()) == ("T", (1, 1), [[b"hi"]])
    gmap = mapping.to_infer_request(
        decode({"gmap": {"s_f": {"x": 2}}}), "m", "", by_name(spec("x", "FP32", -1, 1))
    )
    assert gmap.inputs[0].shape == (1, 1) and gmap.inputs[0].data.tolist() == [[2.0]]
    binary = mapping.to_infer_request(
        wire.payload_from_bytes(b"\xff"), "m", "", by_name(spec("B", "BYTES", -1))
    )
    assert binary.inputs[0].data.tolist() == [b"\xff"]


def test_ndarray_fills_the_only_floating_input_and_str_data_the_only_bytes_input() -> None:
    nd = mapping.to_infer_request(
        decode({"ndarray": [[1, 2]]}), "m", "", by_name(spec("X", "FP16", -1, 2), spec("I", "INT32", 1))
    )
    assert (nd.inputs[0].name, nd.inputs[0].datatype, nd.inputs[0].shape) == ("X", "FP16", (1, 2))
    two = by_name(spec("A", "FP32", -1), spec("B", "FP32", -1))
    refused(
        lambda: mapping.to_infer_request(decode({"ndarray": [1]}), "m", "", two),
        "only floating-point input",
        "has 2",
    )
    refused(
        lambda: mapping.to_infer_request(decode({"str_data": "x"}), "m", "", by_name(spec("A", "INT32", 1))),
        "only BYTES input",
        "inputs: A (INT32)",
    )


def test_model_selection_by_name_or_name_version() -> None:
    known = {"simple", "my-model", "my-model-2"}.__contains__
    assert mapping.split_model("simple", known) == ("simple", "")
    assert mapping.split_model("simple-3", known) == ("simple", "3")
    assert mapping.split_model("my-model", known) == ("my-model", "")
    assert mapping.split_model("my-model-2", known) == ("my-model-2", "")  # a whole name wins
    assert mapping.split_model("my-model-1.0.0", known) == ("my-model", "1.0.0")
    refused(
        lambda: mapping.split_model("other-1", known), "unknown model 'other-1'", kind=ErrorKind.NOT_FOUND
    )


# ------------------------------------------------------------------------------------------ answers


def assert_json_matches_message(answer: answers.Answer) -> dict:
    """The JSON answer is the protobuf JSON of the GrpsMessage answer (read back by betterproto2)."""
    doc = orjson.loads(answers.answer_json(answer))
    assert list(doc)[0] == "status" and doc["status"] == {"code": 200, "msg": "OK", "status": "SUCCESS"}
    assert bytes(pb.GrpsMessage.from_dict(doc)) == bytes(answers.answer_message(answer))
    return doc


def test_answers_take_the_request_form_when_the_outputs_fit_it() -> None:
    one_string = response(t("T", "BYTES", [b"hello"]))
    assert assert_json_matches_message(answers.to_answer(one_string, "str_data"))["str_data"] == "hello"
    binary = answers.to_answer(one_string, "bin_data")
    assert (binary.kind, binary.data) == ("bin_data", b"hello")
    assert assert_json_matches_message(binary)["bin_data"] == "aGVsbG8="
    several = answers.to_answer(response(t("T", "BYTES", [b"a", b"b"])), "str_data")
    assert assert_json_matches_message(several)["gtensors"] == {
        "tensors": [{"name": "T", "dtype": "DT_STRING", "shape": [2], "flat_string": ["a", "b"]}]
    }


def test_gmap_answers_put_each_output_in_the_map_of_its_type() -> None:
    outputs = response(
        t("s", "BYTES", [b"text"]),
        t("b", "BYTES", [b"\xff"]),
        t("flag", "BOOL", [True]),
        t("u32", "UINT32", [4000000000]),
        t("h", "FP16", [0.5]),
        t("d", "FP64", [np.nan]),
    )
    doc = assert_json_matches_message(answers.to_answer(outputs, "gmap"))
    assert doc["gmap"] == {
        "s_s": {"s": "text"},
        "s_b": {"b": "/w=="},
        "s_i32": {"flag": 1},
        "s_i64": {"u32": "4000000000"},
        "s_f": {"h": 0.5},
        "s_d": {"d": "NaN"},
    }
    many = answers.to_answer(response(t("x", "INT32", [1, 2])), "gmap")
    assert many.kind == "gtensors"


def test_gtensors_answers_carry_every_datatype_in_its_grps_dtype() -> None:
    outputs = response(
        t("bool", "BOOL", [[True, False]]),
        t("u16", "UINT16", [65535]),
        t("u64", "UINT64", [2**63 - 1]),
        t("i64", "INT64", [-5]),
        t("bf", "BF16", [0x3F80, 0xFF80]),
        t("h", "FP16", [1.5]),
        t("f", "FP32", [np.inf, 0.1]),
        t("scalar", "INT8", 7),
    )
    doc = assert_json_matches_message(answers.to_answer(outputs, "gtensors"))
    found = {x["name"]: x for x in doc["gtensors"]["tensors"]}
    assert found["bool"] == {"name": "bool", "dtype": "DT_UINT8", "shape": [1, 2], "flat_uint8": [1, 0]}
    assert found["u16"]["dtype"] == "DT_INT32" and found["u16"]["flat_int32"] == [65535]
    assert found["u64"]["dtype"] == "DT_INT64" and found["u64"]["flat_int64"] == [str(2**63 - 1)]
    assert found["i64"]["flat_int64"] == ["-5"]
    assert found["bf"]["dtype"] == "DT_FLOAT32" and found["bf"]["flat_float32"] == [1.0, "-Infinity"]
    assert found["h"]["dtype"] == "DT_FLOAT16" and found["h"]["flat_float16"] == [1.5]
    assert found["f"]["flat_float32"] == ["Infinity", pytest.approx(0.1)]
    assert found["scalar"]["shape"] == [] and found["scalar"]["flat_int8"] == [7]


def test_return_ndarray_writes_the_one_float_output_as_a_nested_array() -> None:
    answer = answers.to_answer(response(t("y", "FP32", [[1.5], [np.nan]])), "gtensors", return_ndarray=True)
    assert orjson.loads(answers.answer_json(answer))["ndarray"] == [[1.5], ["NaN"]]
    refused(
        lambda: answers.to_answer(response(t("y", "INT32", [1])), "ndarray", return_ndarray=True),
        "return-ndarray needs one floating-point output",
        "y (INT32)",
    )
    refused(lambda: answers.answer_message(answer), "only in HTTP JSON", kind=ErrorKind.INTERNAL)


def test_outputs_grps_cannot_carry_are_internal_errors() -> None:
    refused(
        lambda: answers.to_answer(response(t("T", "BYTES", [b"\xff"])), "str_data"),
        "not UTF-8",
        kind=ErrorKind.INTERNAL,
    )
    refused(
        lambda: answers.to_answer(response(t("T", "BYTES", [b"\xff", b"a"])), "gtensors"),
        "flat_string",
        kind=ErrorKind.INTERNAL,
    )
    refused(
        lambda: answers.to_answer(response(t("u", "UINT64", [2**64 - 1])), "gtensors"),
        "past DT_INT64",
        kind=ErrorKind.INTERNAL,
    )


def test_status_and_errors_carry_http_codes() -> None:
    assert orjson.loads(answers.status_json(200, "OK")) == {
        "status": {"code": 200, "msg": "OK", "status": "SUCCESS"}
    }
    codes = {kind: answers.status_code(InferError(kind, "x")) for kind in ErrorKind}
    assert codes == {
        ErrorKind.INVALID_ARGUMENT: 400, ErrorKind.NOT_FOUND: 404, ErrorKind.UNAVAILABLE: 503,
        ErrorKind.UNIMPLEMENTED: 501, ErrorKind.RESOURCE_EXHAUSTED: 413, ErrorKind.INTERNAL: 500,
    }  # fmt: skip
    error = InferError(ErrorKind.NOT_FOUND, "unknown model 'x'")
    assert orjson.loads(answers.error_json(error)) == {
        "status": {"code": 404, "msg": "unknown model 'x'", "status": "FAILURE"}
    }
    message = answers.error_message(error)
    assert betterproto2.which_one_of(message, "data_oneof") == ("", None)
    assert (message.status.code, message.status.status) == (404, pb.StatusStatusFlag.FAILURE)


# --------------------------------------------------------------------------------------------- YAML


def test_yaml_of_metadata_shapes() -> None:
    doc = {
        "name": "simple",
        "versions": ["1", "2"],
        "inputs": [{"name": "INPUT0", "shape": [-1, 16]}, {"name": "on", "shape": []}],
        "ready": True,
        "default_model": None,
        "params": {},
        "ratio": 0.5,
        "text": "a: b # c",
    }
    assert dump(doc) == (
        "name: simple\n"
        "versions:\n"
        '  - "1"\n'
        '  - "2"\n'
        "inputs:\n"
        "  - name: INPUT0\n"
        "    shape:\n"
        "      - -1\n"
        "      - 16\n"
        '  - name: "on"\n'
        "    shape: []\n"
        "ready: true\n"
        "default_model: null\n"
        "params: {}\n"
        "ratio: 0.5\n"
        'text: "a: b # c"\n'
    )
