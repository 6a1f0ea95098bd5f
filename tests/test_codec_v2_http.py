"""KServe v2 REST + Triton binary tensor data extension: decode_request / encode_response.

Requests are built here the way a client builds them (JSON header, binary tensors appended in input
order, Inference-Header-Content-Length = the header's size) and responses are read back the way a client
reads them (split at inference-header-content-length, np.frombuffer, BYTES length prefixes), with the
stdlib json module and a datatype table of the test's own, so the codec is checked against the protocol
and not against itself.
"""

import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from codec.errors import ErrorKind, InferError
from codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor
from codec.v2_http import decode_request, encode_response, parse_header_length

MODEL = "resnet-7"
INPUT = "pixel_in"

# The wire dtypes of the protocol (little-endian; BF16 travels as its uint16 bit pattern).
WIRE_DTYPES = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
}
ALL_DATATYPES = [*WIRE_DTYPES, "BYTES"]


# --- the client side -------------------------------------------------------------------------------


@dataclass
class ClientInput:
    name: str
    datatype: str
    array: np.ndarray
    binary: bool
    nested: bool = False


def length_prefixed(elements) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def objects(elements: list, shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def to_wire(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return length_prefixed(array.reshape(-1))
    if datatype == "BOOL":
        return array.astype(np.uint8).tobytes()
    return np.ascontiguousarray(array, dtype=WIRE_DTYPES[datatype]).tobytes()


def to_json_data(datatype: str, array: np.ndarray, nested: bool):
    if datatype == "BYTES":
        array = np.vectorize(lambda e: e.decode("utf-8"), otypes=[object])(array) if array.size else array
    if nested and array.ndim > 0:
        return array.tolist()
    return array.reshape(-1).tolist()


def client_request(
    inputs: list[ClientInput],
    *,
    request_id: str | None = None,
    parameters: dict | None = None,
    outputs: list | None = None,
    always_send_length: bool = False,
) -> tuple[bytes, int | None]:
    doc: dict = {}
    if request_id is not None:
        doc["id"] = request_id
    if parameters is not None:
        doc["parameters"] = parameters
    doc["inputs"] = []
    payload = []
    for i in inputs:
        entry = {"name": i.name, "datatype": i.datatype, "shape": list(i.array.shape)}
        if i.binary:
            raw = to_wire(i.datatype, i.array)
            payload.append(raw)
            entry["parameters"] = {"binary_data_size": len(raw)}
        else:
            entry["data"] = to_json_data(i.datatype, i.array, i.nested)
        doc["inputs"].append(entry)
    if outputs is not None:
        doc["outputs"] = outputs
    header = json.dumps(doc).encode()
    body = header + b"".join(payload)
    if payload or always_send_length:
        return body, len(header)
    return body, None


def parse_length_prefixed(raw: bytes, count: int) -> list[bytes]:
    out, offset = [], 0
    for _ in range(count):
        (n,) = struct.unpack_from("<I", raw, offset)
        out.append(raw[offset + 4 : offset + 4 + n])
        offset += 4 + n
    assert offset == len(raw), "BYTES output has trailing bytes"
    return out


@dataclass
class ClientResponse:
    headers: dict[bytes, bytes]
    doc: dict
    arrays: dict[str, np.ndarray]
    binary_outputs: list[str]


def client_response(encoded) -> ClientResponse:
    headers = dict(encoded.headers)
    assert len(headers) == len(encoded.headers), "duplicate response headers"
    body = b"".join(bytes(c) for c in encoded.chunks)
    assert int(headers[b"content-length"]) == len(body)
    if b"inference-header-content-length" in headers:
        assert headers[b"content-type"] == b"application/octet-stream"
        split = int(headers[b"inference-header-content-length"])
        assert split == len(bytes(encoded.chunks[0]))
    else:
        assert headers[b"content-type"] == b"application/json"
        split = len(body)
    doc = json.loads(body[:split])
    binary, offset = body[split:], 0
    arrays, binary_outputs = {}, []
    for out in doc["outputs"]:
        datatype, shape = out["datatype"], tuple(out["shape"])
        count = math.prod(shape)
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            assert "data" not in out
            raw = binary[offset : offset + size]
            assert len(raw) == size
            offset += size
            binary_outputs.append(out["name"])
            if datatype == "BYTES":
                array = objects(parse_length_prefixed(raw, count), shape)
            elif datatype == "BOOL":
                as_bytes = np.frombuffer(raw, np.uint8)
                assert set(as_bytes.tolist()) <= {0, 1}
                array = as_bytes.astype(bool).reshape(shape)
            else:
                array = np.frombuffer(raw, WIRE_DTYPES[datatype]).reshape(shape)
        else:
            data = out["data"]
            assert isinstance(data, list) and not any(isinstance(d, list) for d in data), "data must be flat"
            assert len(data) == count
            if datatype == "BYTES":
                assert all(isinstance(d, str) for d in data)
                array = objects([d.encode("utf-8") for d in data], shape)
            else:
                if datatype == "BOOL":
                    assert all(isinstance(d, bool) for d in data)
                array = np.array(data, dtype=WIRE_DTYPES[datatype]).reshape(shape)
        arrays[out["name"]] = array
    assert offset == len(binary), "response has binary bytes no output claims"
    return ClientResponse(headers, doc, arrays, binary_outputs)


def assert_same_tensor(actual: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    assert isinstance(actual, np.ndarray)
    assert actual.shape == expected.shape
    if datatype == "BYTES":
        assert actual.dtype == object
        assert all(type(e) is bytes for e in actual.reshape(-1))
        assert actual.tolist() == expected.tolist()
    else:
        assert actual.dtype == WIRE_DTYPES[datatype]
        # Bitwise: keeps -0.0, NaN payloads, inf, BF16 bit patterns.
        assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()


def assert_invalid(excinfo: pytest.ExceptionInfo, *names: str) -> str:
    error = excinfo.value
    assert error.kind is ErrorKind.INVALID_ARGUMENT
    for name in names:
        assert name in error.message, (name, error.message)
    return error.message


# --- strategies ----------------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
utf8_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=6)


@st.composite
def tensor_values(draw, datatype: str, binary: bool) -> np.ndarray:
    shape = draw(shapes)
    count = math.prod(shape)
    if datatype == "BYTES":
        if binary:
            elements = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        else:
            elements = [s.encode() for s in draw(st.lists(utf8_text, min_size=count, max_size=count))]
        return objects(elements, shape)
    dtype = WIRE_DTYPES[datatype]
    elements = None
    if dtype.kind == "f":
        # JSON has no NaN / Infinity; binary carries any bit pattern.
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=binary, allow_infinity=binary)
    return draw(hnp.arrays(dtype, shape, elements=elements))


ROUND_TRIP_CASES = [(d, b) for d in ALL_DATATYPES for b in (False, True) if not (d == "BF16" and not b)]


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
    encoded = encode_response(response, request)
    body = b"".join(bytes(c) for c in encoded.chunks)
    split = int(dict(encoded.headers)[b"inference-header-content-length"])
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
    a = np.array([1.25, -3.5, 8.0], dtype="<f4")
    b = np.array([[1, 2], [3, 4]], dtype="<u2")
    body, length = client_request(
        [
            ClientInput("odd", "UINT8", np.array([9], np.uint8), True),  # puts the next one off alignment
            ClientInput("a", "FP32", a, True),
            ClientInput("b", "UINT16", b, True),
        ]
    )
    body = bytearray(body)
    request = decode_request(body, length, MODEL)
    body_bytes = np.frombuffer(body, np.uint8)
    for tensor in request.inputs:
        assert np.shares_memory(tensor.data, body_bytes), tensor.name
    tensor_a = request.inputs[1]
    assert tensor_a.data.tolist() == [1.25, -3.5, 8.0]
    start = length + 1
    body[start : start + 4] = struct.pack("<f", 42.0)
    assert tensor_a.data[0] == 42.0  # a view, not a copy
    assert request.inputs[2].data.tolist() == [[1, 2], [3, 4]]


def test_binary_output_is_not_copied():
    data = np.arange(1000, dtype=np.float32)
    encoded = encode_response(
        InferResponse(MODEL, "1", [Tensor("o", "FP32", (1000,), data)]),
        InferRequest(MODEL, binary_output=True),
    )
    assert np.shares_memory(np.frombuffer(encoded.chunks[1], np.uint8), data)


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


# --- 4. every decode error -----------------------------------------------------------------------


def one_input(**fields) -> dict:
    entry = {"name": INPUT, "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    for key, value in fields.items():
        if value is ...:
            del entry[key]
        else:
            entry[key] = value
    return {"inputs": [entry]}


def decode_error(
    doc_or_body, binary: bytes = b"", *, header_length: int | None = None
) -> pytest.ExceptionInfo:
    # stdlib json: it writes integers past 64 bits, which a client may send
    header = doc_or_body if isinstance(doc_or_body, bytes) else json.dumps(doc_or_body).encode()
    if binary and header_length is None:
        header_length = len(header)
    with pytest.raises(InferError) as excinfo:
        decode_request(header + binary, header_length, MODEL)
    return excinfo


REQUEST_ERRORS = {
    # malformed / non-object JSON
    "empty-body": b"",
    "truncated-json": b'{"inputs": [',
    "not-json": b"inputs",
    "trailing-garbage": b'{"inputs": []} x',
    "invalid-utf8": b'{"id": "\xff", "inputs": [{"name": "i", "datatype": "INT8", "shape": [1], '
    b'"data": [1]}]}',
    "json-array": b"[]",
    "json-number": b"5",
    "json-string": b'"x"',
    "json-null": b"null",
    # inputs
    "no-inputs": {},
    "empty-inputs": {"inputs": []},
    "inputs-object": {"inputs": {"name": INPUT}},
    "inputs-null": {"inputs": None},
    "input-not-object": {"inputs": [5]},
    "input-without-name": {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1.0]}]},
    "input-name-int": {"inputs": [{"name": 5, "datatype": "FP32", "shape": [1], "data": [1.0]}]},
    # request fields
    "id-int": {"id": 5, **one_input()},
    "id-list": {"id": ["a"], **one_input()},
    "id-object": {"id": {}, **one_input()},
    "parameters-list": {"parameters": [], **one_input()},
    "parameters-string": {"parameters": "x", **one_input()},
    "binary_data_output-string": {"parameters": {"binary_data_output": "true"}, **one_input()},
    "binary_data_output-int": {"parameters": {"binary_data_output": 1}, **one_input()},
    "outputs-object": {**one_input(), "outputs": {"name": "o"}},
    "output-not-object": {**one_input(), "outputs": ["o"]},
    "output-without-name": {**one_input(), "outputs": [{"parameters": {"binary_data": True}}]},
    # lone surrogates cannot become UTF-8 BYTES (orjson rejects them while parsing)
    "bytes-lone-high-surrogate": b'{"inputs": [{"name": "pixel_in", "datatype": "BYTES", "shape": [1], '
    b'"data": ["\\ud800"]}]}',
    "bytes-lone-low-surrogate": b'{"inputs": [{"name": "pixel_in", "datatype": "BYTES", "shape": [1], '
    b'"data": ["a\\udc00"]}]}',
    "bytes-raw-surrogate-utf8": b'{"inputs": [{"name": "pixel_in", "datatype": "BYTES", "shape": [1], '
    b'"data": ["\xed\xa0\x80"]}]}',
}


@pytest.mark.parametrize("doc", REQUEST_ERRORS.values(), ids=REQUEST_ERRORS.keys())
def test_request_level_errors(doc):
    assert_invalid(decode_error(doc), MODEL)


def test_malformed_json_message_says_so():
    message = assert_invalid(decode_error(b'{"inputs": ['), MODEL)
    assert "JSON" in message


OUTPUT_ERRORS = {
    "binary_data-string": {"name": "probs", "parameters": {"binary_data": "yes"}},
    "binary_data-int": {"name": "probs", "parameters": {"binary_data": 1}},
    "parameters-list": {"name": "probs", "parameters": [True]},
}


@pytest.mark.parametrize("output", OUTPUT_ERRORS.values(), ids=OUTPUT_ERRORS.keys())
def test_requested_output_errors_name_the_output(output):
    assert_invalid(decode_error({**one_input(), "outputs": [output]}), MODEL, "probs")


def fp32_binary(**parameters) -> dict:
    return one_input(data=..., parameters=parameters)


INPUT_ERRORS = {
    # datatype
    "datatype-unknown": (one_input(datatype="FLOAT32"), b""),
    "datatype-lowercase": (one_input(datatype="fp32"), b""),
    "datatype-missing": (one_input(datatype=...), b""),
    "datatype-null": (one_input(datatype=None), b""),
    "datatype-int": (one_input(datatype=11), b""),
    # shape
    "shape-negative": (one_input(shape=[-1]), b""),
    "shape-negative-second-dim": (one_input(shape=[2, -1], data=[]), b""),
    "shape-float": (one_input(shape=[2.0]), b""),
    "shape-bool": (one_input(shape=[True, True]), b""),
    "shape-string": (one_input(shape="2"), b""),
    "shape-scalar-int": (one_input(shape=2), b""),
    "shape-nested": (one_input(shape=[[2]]), b""),
    "shape-missing": (one_input(shape=...), b""),
    "shape-null": (one_input(shape=None), b""),
    "shape-count-2**64": (one_input(shape=[2**63, 2]), b""),  # dims fit u64, the count mismatches
    # JSON data vs shape
    "data-too-many": (one_input(data=[1.0, 2.0, 3.0]), b""),
    "data-too-few": (one_input(data=[1.0]), b""),
    "data-empty": (one_input(data=[]), b""),
    "data-nested-too-many": (one_input(data=[[1.0, 2.0], [3.0, 4.0]]), b""),
    "data-ragged": (one_input(shape=[3], data=[[1.0, 2.0], [3.0]]), b""),
    "data-mixed-depth": (one_input(shape=[3], data=[1.0, [2.0, 3.0]]), b""),
    "data-null": (one_input(data=None), b""),
    "data-object": (one_input(data={"a": 1}), b""),
    "data-word-strings": (one_input(datatype="INT32", data=["a", "b"]), b""),
    "data-word-string-fp": (one_input(data=["one", "two"]), b""),
    "data-objects": (one_input(data=[{}, {}]), b""),
    "data-empty-lists": (one_input(data=[[], []]), b""),
    # out-of-range integers
    "uint8-256": (one_input(datatype="UINT8", data=[0, 256]), b""),
    "uint8-negative": (one_input(datatype="UINT8", data=[0, -1]), b""),
    "int8-128": (one_input(datatype="INT8", data=[0, 128]), b""),
    "int8--129": (one_input(datatype="INT8", data=[0, -129]), b""),
    "uint16-65536": (one_input(datatype="UINT16", data=[0, 65536]), b""),
    "int16-32768": (one_input(datatype="INT16", data=[0, 32768]), b""),
    "uint32-2**32": (one_input(datatype="UINT32", data=[0, 2**32]), b""),
    "uint32-negative": (one_input(datatype="UINT32", data=[0, -1]), b""),
    "int32-2**31": (one_input(datatype="INT32", data=[0, 2**31]), b""),
    "int64-2**63": (one_input(datatype="INT64", data=[0, 2**63]), b""),
    "uint64-negative": (one_input(datatype="UINT64", data=[0, -1]), b""),
    "uint64-2**64": (
        b'{"inputs":[{"name":"pixel_in","datatype":"UINT64","shape":[1],"data":[18446744073709551616]}]}',
        b"",
    ),
    # datatypes restricted to one representation
    "bf16-json": (one_input(datatype="BF16", data=[16256, 0]), b""),
    "bytes-int": (one_input(datatype="BYTES", data=["a", 1]), b""),
    "bytes-null": (one_input(datatype="BYTES", data=["a", None]), b""),
    "bytes-bool": (one_input(datatype="BYTES", data=[True, "a"]), b""),
    "bytes-object": (one_input(datatype="BYTES", data=["a", {"b": "c"}]), b""),
    "bytes-nested-int": (one_input(datatype="BYTES", data=[["a"], [2]]), b""),
    "bytes-count": (one_input(datatype="BYTES", data=["a", "b", "c"]), b""),
    # input parameters
    "parameters-list": (one_input(parameters=[1]), b""),
    # binary_data_size
    "size-vs-shape-short": (fp32_binary(binary_data_size=4), b"\x00" * 4),
    "size-vs-shape-long": (fp32_binary(binary_data_size=12), b"\x00" * 12),
    "size-not-multiple": (fp32_binary(binary_data_size=7), b"\x00" * 7),
    "size-past-body": (fp32_binary(binary_data_size=16), b"\x00" * 8),
    "size-negative": (fp32_binary(binary_data_size=-8), b"\x00" * 8),
    "size-float": (fp32_binary(binary_data_size=8.0), b"\x00" * 8),
    "size-bool": (fp32_binary(binary_data_size=True), b"\x00"),
    "size-string": (fp32_binary(binary_data_size="8"), b"\x00" * 8),
    "size-with-data": (one_input(parameters={"binary_data_size": 8}), b"\x00" * 8),
    "neither-data-nor-size": (one_input(data=...), b""),
    "bool-size-vs-shape": (one_input(datatype="BOOL", data=..., parameters={"binary_data_size": 1}), b"\x01"),
    "fp64-size-vs-shape": (
        one_input(datatype="FP64", data=..., parameters={"binary_data_size": 8}),
        b"\x00" * 8,
    ),
}


@pytest.mark.parametrize(("doc", "binary"), INPUT_ERRORS.values(), ids=INPUT_ERRORS.keys())
def test_input_errors_name_model_and_input(doc, binary):
    assert_invalid(decode_error(doc, binary), MODEL, INPUT)


def test_binary_input_without_header_length_is_invalid():
    header = orjson.dumps(fp32_binary(binary_data_size=8))
    # No Inference-Header-Content-Length: the whole body is the JSON, so there is no binary section...
    with pytest.raises(InferError) as excinfo:
        decode_request(header, None, MODEL)
    assert_invalid(excinfo, MODEL, INPUT)
    # ...and appended tensor bytes are junk after the JSON document.
    with pytest.raises(InferError) as excinfo:
        decode_request(header + b"\x00" * 8, None, MODEL)
    assert_invalid(excinfo, MODEL)


@pytest.mark.parametrize(
    ("doc", "binary"),
    [
        pytest.param(one_input(), b"\x00\x00\x00\x00", id="json-input-plus-binary"),
        pytest.param(fp32_binary(binary_data_size=8), b"\x00" * 9, id="one-byte-left-over"),
        pytest.param(fp32_binary(binary_data_size=8), b"\x00" * 16, id="a-whole-tensor-left-over"),
    ],
)
def test_leftover_binary_bytes_are_invalid(doc, binary):
    message = assert_invalid(decode_error(doc, binary), MODEL)
    assert str(len(binary)) in message


def test_second_input_is_named_in_its_error():
    doc = {
        "inputs": [
            {"name": "good", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}},
            {"name": "bad_one", "datatype": "INT16", "shape": [2], "parameters": {"binary_data_size": 2}},
        ]
    }
    message = assert_invalid(decode_error(doc, b"\x00" * 4), MODEL, "bad_one")
    assert "'good'" not in message


def test_binary_data_size_zero_for_empty_tensor_without_header_length():
    body = orjson.dumps(one_input(shape=[0, 3], data=..., parameters={"binary_data_size": 0}))
    (tensor,) = decode_request(body, None, MODEL).inputs
    assert tensor.shape == (0, 3) and tensor.data.shape == (0, 3) and tensor.data.dtype == np.float32


ODD_REQUESTS = [
    pytest.param(
        one_input(datatype=["FP32"]),
        b"",
        id="datatype-list",
    ),
    pytest.param(
        one_input(datatype={"v": "FP32"}),
        b"",
        id="datatype-object",
    ),
    pytest.param(
        one_input(shape=[0, 2**63], data=[]),
        b"",
        id="zero-size-huge-dim-json",
    ),
    pytest.param(
        one_input(shape=[2**63, 0], data=..., parameters={"binary_data_size": 0}),
        b"",
        id="zero-size-huge-dim-binary",
    ),
    pytest.param(
        one_input(shape=[1] * 65, data=[1.0]),
        b"",
        id="shape-65-dims",
    ),
    pytest.param(
        one_input(datatype="BYTES", shape=[2**40, 2**40], data=..., parameters={"binary_data_size": 0}),
        b"",
        id="bytes-binary-huge-shape",
    ),
]


@pytest.mark.parametrize(("doc", "binary"), ODD_REQUESTS)
def test_decode_never_raises_anything_but_infer_error(doc, binary):
    assert_invalid(decode_error(doc, binary), MODEL, INPUT)


def coerced(datatype: str, data: list, why: str):
    """JSON data numpy would silently coerce; `why` says what a lax decoder would make of it."""
    return pytest.param(datatype, data, id=f"{datatype}-{data!r}")


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        coerced("INT32", ["1", "2"], 'numeric strings are parsed: ["1","2"] -> [1, 2]'),
        coerced("FP32", ["1.5", "2"], 'numeric strings are parsed: ["1.5","2"] -> [1.5, 2.0]'),
        coerced(
            "BOOL", ["false", "false"], 'any non-empty string is True: ["false","false"] -> [True, True]'
        ),
        coerced("FP32", [None, 1.0], "null becomes NaN: [null, 1.0] -> [nan, 1.0]"),
        coerced("INT32", [1.5, 2.0], "floats are truncated: [1.5, 2.0] -> [1, 2]"),
        coerced("UINT8", [-0.5, 255.9], "floats are truncated into range: [-0.5, 255.9] -> [0, 255]"),
        coerced("INT32", [True, False], "booleans become integers: [true, false] -> [1, 0]"),
        coerced("BOOL", [2, 0], "numbers become booleans: [2, 0] -> [True, False]"),
        coerced(
            "INT64",
            [-9223372036854775809, 0],
            "orjson parses -2**63-1 as a float, which saturates to -2**63 instead of being out of range",
        ),
    ],
)
def test_json_data_must_have_the_datatype_json_type(datatype, data):
    assert_invalid(decode_error(one_input(datatype=datatype, data=data)), MODEL, INPUT)


def test_ragged_bytes_data_is_rejected_like_ragged_numeric_data():
    ragged = [["a"], ["b", "c", "d"]]
    assert_invalid(decode_error(one_input(datatype="BYTES", shape=[2, 2], data=ragged)), MODEL, INPUT)


# fuzz: structured junk requests either decode or raise INVALID_ARGUMENT, never anything else
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
)
json_data = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


@st.composite
def junk_inputs(draw):
    entry: dict = {"name": draw(st.sampled_from([INPUT, "", "x\u00e9"]))}
    if draw(st.booleans()):
        entry["datatype"] = draw(st.sampled_from([*ALL_DATATYPES, "FLOAT", "", "int32"]))
    if draw(st.booleans()):
        entry["shape"] = draw(st.one_of(st.lists(st.integers(-1, 4), max_size=3), json_leaf))
    if draw(st.booleans()):
        entry["data"] = draw(json_data)
    if draw(st.booleans()):
        entry["parameters"] = {"binary_data_size": draw(st.one_of(st.integers(-1, 24), json_leaf))}
    return entry


@settings(max_examples=200, deadline=None)
@given(
    inputs=st.lists(junk_inputs(), max_size=3),
    binary=st.binary(max_size=24),
    data=st.data(),
)
def test_junk_requests_decode_or_are_invalid_argument(inputs, binary, data):
    header = json.dumps({"inputs": inputs}).encode()  # stdlib: can write integers past 64 bits
    body = header + binary
    header_length = data.draw(st.one_of(st.none(), st.just(len(header)), st.integers(0, len(body))))
    try:
        request = decode_request(body, header_length, MODEL)
    except InferError as e:
        assert e.kind is ErrorKind.INVALID_ARGUMENT
        assert MODEL in e.message
    else:
        for tensor in request.inputs:
            assert tensor.data.shape == tensor.shape


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
                "parameters": {"binary_data_size": 1, "shared_memory_region": "none"},
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
    assert request.inputs[0].parameters == {"shared_memory_region": "none"}
    assert request.outputs == [
        RequestedOutput("a", None, {}),
        RequestedOutput("b", False, {"classification": 3}),
        RequestedOutput("c", True, {}),
    ]


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


def test_response_without_id_has_no_id_and_keeps_parameters():
    tensor = Tensor("o", "INT8", (2,), np.array([-1, 1], np.int8), {"note": "x"})
    response = InferResponse(MODEL, "4", [tensor], parameters={"sequence_end": True})
    reply = client_response(encode_response(response, InferRequest(MODEL)))
    assert "id" not in reply.doc
    assert reply.doc["parameters"] == {"sequence_end": True}
    assert reply.doc["outputs"] == [
        {"name": "o", "datatype": "INT8", "shape": [2], "parameters": {"note": "x"}, "data": [-1, 1]}
    ]


def test_encode_leaves_tensor_parameters_alone():
    tensor = Tensor("o", "INT8", (2,), np.array([-1, 1], np.int8), {"note": "x"})
    response = InferResponse(MODEL, "1", [tensor])
    first = client_response(encode_response(response, InferRequest(MODEL, binary_output=True)))
    assert first.doc["outputs"][0]["parameters"] == {"note": "x", "binary_data_size": 2}
    assert tensor.parameters == {"note": "x"}
    second = client_response(encode_response(response, InferRequest(MODEL, binary_output=False)))
    assert second.doc["outputs"][0]["parameters"] == {"note": "x"}
    assert second.arrays["o"].tolist() == [-1, 1]


def test_json_response_headers():
    response = InferResponse(MODEL, "1", [Tensor("o", "FP64", (1,), np.array([0.25]))])
    encoded = encode_response(response, InferRequest(MODEL))
    assert len(encoded.chunks) == 1
    headers = dict(encoded.headers)
    assert headers[b"content-type"] == b"application/json"
    assert b"inference-header-content-length" not in headers
    assert int(headers[b"content-length"]) == len(encoded.chunks[0])


# --- encode errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, False])
def test_non_utf8_bytes_output_as_json_is_invalid(requested):
    data = objects([b"ok", b"\xc3\x28"], (2,))
    response = InferResponse(MODEL, "1", [Tensor("text_out", "BYTES", (2,), data)])
    outputs = None if requested is None else [RequestedOutput("text_out", requested)]
    request = InferRequest(MODEL, outputs=outputs, binary_output=False)
    with pytest.raises(InferError) as excinfo:
        encode_response(response, request)
    assert_invalid(excinfo, MODEL, "text_out")
    # The same tensor is fine as binary.
    binary_request = InferRequest(MODEL, outputs=[RequestedOutput("text_out", True)])
    assert client_response(encode_response(response, binary_request)).arrays["text_out"].tolist() == [
        b"ok",
        b"\xc3\x28",
    ]


def test_bf16_output_as_json_is_invalid():
    response = InferResponse(MODEL, "1", [Tensor("emb", "BF16", (1,), np.array([0x3F80], np.uint16))])
    with pytest.raises(InferError) as excinfo:
        encode_response(response, InferRequest(MODEL))
    assert_invalid(excinfo, MODEL, "emb")
    reply = client_response(encode_response(response, InferRequest(MODEL, binary_output=True)))
    assert reply.arrays["emb"].tolist() == [0x3F80]


@pytest.mark.parametrize("binary", [True, False])
def test_big_endian_output_is_sent_little_endian(binary):
    response = InferResponse(MODEL, "1", [Tensor("o", "FP32", (1,), np.array([1.0], ">f4"))])
    reply = client_response(encode_response(response, InferRequest(MODEL, binary_output=binary)))
    assert reply.arrays["o"].tolist() == [1.0]
