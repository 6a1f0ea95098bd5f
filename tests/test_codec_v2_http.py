"""KServe v2 REST + Triton binary tensor data extension: round trips, the header split, request fields.

The client side lives in v2_client.py: the codec is checked against the protocol, not against itself.
"""

import json
import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from v2_client import (
    ALL_DATATYPES,
    INPUT,
    MODEL,
    ROUND_TRIP_CASES,
    ClientInput,
    assert_invalid,
    assert_same_tensor,
    client_request,
    client_response,
    objects,
    one_input,
    tensor_values,
)

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor
from tensorgate.codec.v2_http import decode_request, encode_response, parse_header_length

# --- 1. round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "binary"), ROUND_TRIP_CASES, ids=[f"{d}-{b}" for d, b in ROUND_TRIP_CASES]
)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_round_trip_every_datatype(datatype, binary, data):
    array = data.draw(tensor_values(datatype, binary))
    nested = data.draw(st.booleans())
    always_send_length = data.draw(st.booleans())
    body, length = client_request(
        [ClientInput(INPUT, datatype, array, binary, nested)],
        request_id="req-17",
        parameters={"binary_data_output": binary},
        always_send_length=always_send_length,
    )

    request = decode_request(body, length, MODEL, "3")
    assert (request.model_name, request.model_version, request.id) == (MODEL, "3", "req-17")
    assert request.binary_output is binary
    assert request.parameters == {}
    assert request.outputs is None
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == (INPUT, datatype, array.shape)
    assert tensor.parameters == {}
    assert_same_tensor(tensor.data, array, datatype)

    response = InferResponse(MODEL, "3", [Tensor("out0", datatype, tensor.shape, tensor.data)], id=request.id)
    reply = client_response(encode_response(response, request))
    assert reply.doc["model_name"] == MODEL and reply.doc["model_version"] == "3"
    assert reply.doc["id"] == "req-17"
    assert [o["name"] for o in reply.doc["outputs"]] == ["out0"]
    assert reply.doc["outputs"][0]["datatype"] == datatype
    assert reply.binary_outputs == (["out0"] if binary else [])
    assert_same_tensor(reply.arrays["out0"], array, datatype)


@st.composite
def mixed_requests(draw):
    inputs = []
    for i in range(draw(st.integers(1, 4))):
        datatype = draw(st.sampled_from(ALL_DATATYPES))
        binary = datatype == "BF16" or draw(st.booleans())
        # Values every output representation can carry back (UTF-8 BYTES, finite floats): the output of a
        # binary input may be requested as JSON.
        array = draw(tensor_values(datatype, binary=datatype == "BF16"))
        inputs.append(ClientInput(f"in{i}", datatype, array, binary, draw(st.booleans())))
    return inputs


@settings(max_examples=60, deadline=None)
@given(inputs=mixed_requests(), data=st.data())
def test_round_trip_mixed_inputs_and_per_output_binary_choice(inputs, data):
    default = data.draw(st.booleans(), label="binary_data_output")
    # Per output: None = follow binary_data_output, else the output's own binary_data wins.
    choices = [
        True if i.datatype == "BF16" else data.draw(st.sampled_from([None, True, False])) for i in inputs
    ]
    outputs = [
        {"name": f"out{k}"} if c is None else {"name": f"out{k}", "parameters": {"binary_data": c}}
        for k, c in enumerate(choices)
    ]
    body, length = client_request(inputs, parameters={"binary_data_output": default}, outputs=outputs)
    request = decode_request(body, length, MODEL)
    assert [t.name for t in request.inputs] == [i.name for i in inputs]
    for tensor, sent in zip(request.inputs, inputs, strict=True):
        assert tensor.datatype == sent.datatype and tensor.shape == sent.array.shape
        assert_same_tensor(tensor.data, sent.array, sent.datatype)
    assert request.outputs == [RequestedOutput(f"out{k}", c, {}) for k, c in enumerate(choices)]

    response = InferResponse(
        MODEL, "1", [Tensor(f"out{k}", t.datatype, t.shape, t.data) for k, t in enumerate(request.inputs)]
    )
    reply = client_response(encode_response(response, request))
    expected_binary = [f"out{k}" for k, c in enumerate(choices) if (default if c is None else c)]
    assert reply.binary_outputs == expected_binary
    for k, sent in enumerate(inputs):
        assert_same_tensor(reply.arrays[f"out{k}"], sent.array, sent.datatype)


@pytest.mark.parametrize("datatype", [d for d in ALL_DATATYPES if d != "BF16"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_nested_and_flat_json_data_give_the_same_tensor(datatype, data):
    array = data.draw(tensor_values(datatype, binary=False))
    decoded = []
    for nested in (False, True):
        body, length = client_request([ClientInput(INPUT, datatype, array, False, nested)])
        decoded.append(decode_request(body, length, MODEL).inputs[0].data)
    assert_same_tensor(decoded[0], array, datatype)
    assert_same_tensor(decoded[1], array, datatype)


def test_json_data_is_row_major():
    body = orjson.dumps(
        {"inputs": [{"name": INPUT, "datatype": "INT16", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]}
    )
    data = decode_request(body, None, MODEL).inputs[0].data
    assert data.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_bool_binary_and_json_agree():
    array = np.array([[True, False], [False, True]])
    binary_body, length = client_request([ClientInput(INPUT, "BOOL", array, True)])
    assert binary_body[length:] == b"\x01\x00\x00\x01"
    json_body, _ = client_request([ClientInput(INPUT, "BOOL", array, False, nested=True)])
    for body, hl in ((binary_body, length), (json_body, None)):
        assert decode_request(body, hl, MODEL).inputs[0].data.tolist() == array.tolist()


def test_fp16_binary_carries_values_json_cannot():
    array = np.array([np.inf, -np.inf, np.nan, -0.0, 65504, 6e-8], dtype="<f2")
    body, length = client_request([ClientInput(INPUT, "FP16", array, True)])
    data = decode_request(body, length, MODEL).inputs[0].data
    assert data.tobytes() == array.tobytes()


@pytest.mark.parametrize(("default", "override"), [(True, False), (False, True), (True, None), (False, None)])
def test_per_output_binary_data_overrides_binary_data_output(default, override):
    values = np.array([1.5, -2.0], dtype="<f4")
    body, length = client_request(
        [ClientInput(INPUT, "FP32", values, True)],
        parameters={"binary_data_output": default},
        outputs=[
            {"name": "a"} if override is None else {"name": "a", "parameters": {"binary_data": override}}
        ],
    )
    request = decode_request(body, length, MODEL)
    response = InferResponse(
        MODEL, "1", [Tensor("a", "FP32", (2,), values), Tensor("b", "FP32", (2,), values * 2)]
    )
    reply = client_response(encode_response(response, request))
    a_binary = default if override is None else override
    assert reply.binary_outputs == [n for n, b in (("a", a_binary), ("b", default)) if b]
    assert reply.arrays["a"].tolist() == [1.5, -2.0]
    assert reply.arrays["b"].tolist() == [3.0, -4.0]
    if not reply.binary_outputs:
        assert b"inference-header-content-length" not in reply.headers


def test_binary_outputs_are_appended_in_output_order():
    request = InferRequest(MODEL, binary_output=True)
    response = InferResponse(
        MODEL,
        "1",
        [
            Tensor("first", "UINT8", (3,), np.array([1, 2, 3], np.uint8)),
            Tensor("middle", "INT32", (1,), np.array([7], np.int32)),
            Tensor("last", "BYTES", (1,), objects([b"zz"], (1,))),
        ],
    )
    headers, chunks = encode_response(response, request)
    body = b"".join(bytes(c) for c in chunks)
    split = int(dict(headers)[b"inference-header-content-length"])
    assert body[split:] == b"\x01\x02\x03" + b"\x07\x00\x00\x00" + b"\x02\x00\x00\x00zz"
    sizes = [o["parameters"]["binary_data_size"] for o in json.loads(body[:split])["outputs"]]
    assert sizes == [3, 4, 6]


@pytest.mark.parametrize("binary", [False, True])
def test_non_contiguous_output_is_sent_row_major(binary):
    data = np.arange(6, dtype=np.int32).reshape(2, 3).T  # logical [[0, 3], [1, 4], [2, 5]]
    response = InferResponse(MODEL, "1", [Tensor("t", "INT32", (3, 2), data)])
    reply = client_response(encode_response(response, InferRequest(MODEL, binary_output=binary)))
    assert reply.arrays["t"].tolist() == [[0, 3], [1, 4], [2, 5]]


@pytest.mark.parametrize("body_type", [bytes, bytearray, memoryview])
def test_body_types_accepted(body_type):
    values = np.array([1, -2, 3], dtype="<i8")
    body, length = client_request([ClientInput(INPUT, "INT64", values, True)])
    data = decode_request(body_type(bytearray(body)), length, MODEL).inputs[0].data
    assert data.tolist() == [1, -2, 3]


def test_binary_inputs_are_zero_copy_views_of_the_body():
    a = np.arange(300, dtype="<f4")  # over SMALL_COPY bytes: a view even where it is not aligned
    body, length = client_request(
        [
            ClientInput("odd", "UINT8", np.array([9], np.uint8), True),  # puts the next one off alignment
            ClientInput("a", "FP32", a, True),
        ]
    )
    body = bytearray(body)
    request = decode_request(body, length, MODEL)
    body_bytes = np.frombuffer(body, np.uint8)
    tensor_odd, tensor_a = request.inputs
    assert np.shares_memory(tensor_a.data, body_bytes)
    assert not np.shares_memory(tensor_odd.data, body_bytes)  # one byte: copied (SMALL_COPY)
    assert tensor_a.data.tolist() == a.tolist()
    start = length + 1
    body[start : start + 4] = struct.pack("<f", 42.0)
    assert tensor_a.data[0] == 42.0  # a view, not a copy


def test_a_small_binary_input_off_alignment_is_an_aligned_copy():
    # numpy runs ufuncs on unaligned data through a buffered loop (~3x the time for `simple`'s inputs)
    b = np.array([[1, 2], [3, 4]], dtype="<i4")
    for lead in range(1, 5):  # a UINT8 input of `lead` bytes first: one of them puts `b` off alignment
        body, length = client_request(
            [
                ClientInput("lead", "UINT8", np.zeros(lead, np.uint8), True),
                ClientInput("b", "INT32", b, True),
            ]
        )
        if (length + lead) % 4:
            break
    body = bytearray(body)
    assert np.frombuffer(body, np.uint8)[length + lead :].ctypes.data % 4, "b's bytes are off alignment"
    tensor = decode_request(body, length, MODEL).inputs[1]
    assert tensor.data.flags.aligned
    assert tensor.data.tolist() == [[1, 2], [3, 4]]
    assert not np.shares_memory(tensor.data, np.frombuffer(body, np.uint8))


def test_binary_output_is_not_copied():
    data = np.arange(1000, dtype=np.float32)
    _, chunks = encode_response(
        InferResponse(MODEL, "1", [Tensor("o", "FP32", (1000,), data)]),
        InferRequest(MODEL, binary_output=True),
    )
    assert np.shares_memory(np.frombuffer(chunks[1], np.uint8), data)


# --- 2/3. the header split -----------------------------------------------------------------------


def rich_request() -> tuple[bytes, int, list[ClientInput]]:
    inputs = [
        ClientInput("entr\u00e9e", "BYTES", objects([b"", b"\xff\x00", b"ab"], (3,)), True),
        ClientInput("dense", "FP32", np.array([[0.5, -1.0]], "<f4"), True),
        ClientInput("ids", "INT32", np.array([3, 1, 4], "<i4"), False),
        ClientInput("flags", "BOOL", np.array([True, False]), True),
    ]
    body, length = client_request(inputs, request_id="\u00e9t\u00e9")
    return body, length, inputs


def test_only_the_true_header_length_decodes():
    body, true_length, inputs = rich_request()
    for header_length in [None, *range(len(body) + 1)]:
        if header_length == true_length:
            request = decode_request(body, header_length, MODEL)
            assert request.id == "\u00e9t\u00e9"
            for tensor, sent in zip(request.inputs, inputs, strict=True):
                assert tensor.name == sent.name
                assert_same_tensor(tensor.data, sent.array, sent.datatype)
            continue
        with pytest.raises(InferError) as excinfo:
            decode_request(body, header_length, MODEL)
        assert_invalid(excinfo, MODEL)


@settings(max_examples=15, deadline=None)
@given(inputs=mixed_requests())
def test_every_wrong_header_length_is_invalid_argument(inputs):
    body, true_length = client_request(inputs, always_send_length=True)
    for header_length in range(len(body) + 1):
        if header_length == true_length:
            assert len(decode_request(body, header_length, MODEL).inputs) == len(inputs)
            continue
        with pytest.raises(InferError) as excinfo:
            decode_request(body, header_length, MODEL)
        assert excinfo.value.kind is ErrorKind.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("value", "body_length", "expected"),
    [(None, 10, None), ("0", 10, 0), ("7", 10, 7), ("10", 10, 10), (b"10", 10, 10), (b"0", 0, 0)],
)
def test_parse_header_length_valid(value, body_length, expected):
    assert parse_header_length(value, body_length) == expected


@pytest.mark.parametrize(
    ("value", "body_length"),
    [
        ("11", 10),
        ("1", 0),
        ("-1", 10),
        ("", 10),
        ("abc", 10),
        ("1.5", 10),
        ("1e1", 10),
        ("0x5", 10),
        (b"\xff", 10),
        ("9" * 5000, 10),
    ],
)
def test_parse_header_length_invalid(value, body_length):
    with pytest.raises(InferError) as excinfo:
        parse_header_length(value, body_length)
    assert_invalid(excinfo, "Inference-Header-Content-Length")


@pytest.mark.parametrize("value", ["1_0", "\u0661\u0660"])
def test_parse_header_length_only_ascii_digits(value):
    with pytest.raises(InferError):
        parse_header_length(value, 100)


# --- 5. id, parameters, outputs ------------------------------------------------------------------


def test_id_parameters_and_outputs_are_kept():
    doc = {
        "id": "abc-123",
        "parameters": {"binary_data_output": True, "priority": 2, "trace": {"on": [1, "x"]}},
        "inputs": [
            {
                "name": INPUT,
                "datatype": "UINT8",
                "shape": [1],
                "parameters": {"binary_data_size": 1, "note": "kept as given"},
            }
        ],
        "outputs": [
            {"name": "a"},
            {"name": "b", "parameters": {"binary_data": False, "classification": 3}},
            {"name": "c", "parameters": {"binary_data": True}},
        ],
    }
    header = orjson.dumps(doc)
    request = decode_request(header + b"\x05", len(header), MODEL, "2")
    assert request.id == "abc-123"
    assert request.model_version == "2"
    assert request.parameters == {"priority": 2, "trace": {"on": [1, "x"]}}
    assert request.binary_output is True
    assert request.inputs[0].parameters == {"note": "kept as given"}
    assert request.outputs == [
        RequestedOutput("a", None, {}),
        RequestedOutput("b", False, {}, class_count=3),  # Triton's classification extension
        RequestedOutput("c", True, {}),
    ]


def test_a_request_naming_a_shared_memory_region_says_so():
    """The endpoint serves only these through the server's regions; every other goes to the model."""
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    plain = {"name": INPUT, "datatype": "FP32", "shape": [1], "data": [1.0]}
    in_region = {"name": INPUT, "datatype": "FP32", "shape": [1], "parameters": region}
    cases = [
        ({"inputs": [plain]}, False),
        ({"inputs": [plain], "outputs": [{"name": "o", "parameters": {"binary_data": True}}]}, False),
        ({"inputs": [in_region]}, True),
        ({"inputs": [plain], "outputs": [{"name": "o"}, {"name": "p", "parameters": region}]}, True),
    ]
    for doc, names_region in cases:
        assert decode_request(orjson.dumps(doc), None, MODEL).shared_memory is names_region, doc


def test_absent_optional_fields():
    request = decode_request(orjson.dumps(one_input()), None, MODEL)
    assert request.id is None
    assert request.parameters == {}
    assert request.binary_output is False
    assert request.outputs is None
    assert request.model_version == ""


def test_empty_id_is_kept_and_echoed():
    request = decode_request(orjson.dumps({"id": "", **one_input()}), None, MODEL)
    assert request.id == ""
    response = InferResponse(MODEL, "1", [Tensor("o", "FP32", (2,), request.inputs[0].data)], id=request.id)
    assert client_response(encode_response(response, request)).doc["id"] == ""


def test_response_without_id_has_no_id_and_keeps_its_parameters():
    tensor = Tensor("o", "INT8", (2,), np.array([-1, 1], np.int8), {"note": "x"})
    response = InferResponse(MODEL, "4", [tensor], parameters={"sequence_end": True})
    reply = client_response(encode_response(response, InferRequest(MODEL)))
    assert "id" not in reply.doc
    assert reply.doc["parameters"] == {"sequence_end": True}
    assert reply.doc["outputs"] == [{"name": "o", "datatype": "INT8", "shape": [2], "data": [-1, 1]}]


def test_encode_leaves_tensor_parameters_alone():
    tensor = Tensor("o", "INT8", (2,), np.array([-1, 1], np.int8), {"note": "x"})
    response = InferResponse(MODEL, "1", [tensor])
    first = client_response(encode_response(response, InferRequest(MODEL, binary_output=True)))
    assert first.doc["outputs"][0]["parameters"] == {"note": "x", "binary_data_size": 2}
    assert tensor.parameters == {"note": "x"}
    second = client_response(encode_response(response, InferRequest(MODEL, binary_output=False)))
    assert "parameters" not in second.doc["outputs"][0]  # Triton's C++ client wants binary_data_size there
    assert second.arrays["o"].tolist() == [-1, 1]


def test_non_finite_floats_are_the_tokens_triton_reads_and_writes():
    """Triton (rapidjson with NaN and Infinity allowed) and its C++ client write NaN, Infinity and
    -Infinity as bare tokens; orjson alone would refuse them in requests and write null in answers."""
    body = b'{"inputs":[{"name":"%s","datatype":"FP32","shape":[4],"data":[NaN,Infinity,-Infinity,1.5]}]}' % (
        INPUT.encode()
    )
    data = decode_request(body, None, MODEL).inputs[0].data
    assert np.isnan(data[0]) and data[1:].tolist() == [np.inf, -np.inf, 1.5]
    tensor = Tensor("o", "FP32", (4,), data)
    header = encode_response(InferResponse(MODEL, "1", [tensor]), InferRequest(MODEL))[1][0]
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in bytes(header)
    assert json.loads(header)["outputs"][0]["shape"] == [4]  # the json module reads the tokens too


def test_json_response_headers():
    response = InferResponse(MODEL, "1", [Tensor("o", "FP64", (1,), np.array([0.25]))])
    fields, chunks = encode_response(response, InferRequest(MODEL))
    assert len(chunks) == 1
    headers = dict(fields)
    assert headers[b"content-type"] == b"application/json"
    assert b"inference-header-content-length" not in headers
    assert int(headers[b"content-length"]) == len(chunks[0])
