"""KServe v2 REST codec: every decode and encode error is INVALID_ARGUMENT naming the model and input."""

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from v2_client import ALL_DATATYPES, INPUT, MODEL, assert_invalid, client_response, objects, one_input

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor
from tensorgate.codec.v2_http import decode_request, encode_response

# --- 4. every decode error -----------------------------------------------------------------------


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
        assert_read_alike(request, inputs, body[header_length:] if header_length is not None else b"")


def _flat(value) -> list:
    return [v for item in value for v in _flat(item)] if isinstance(value, list) else [value]


def assert_read_alike(request: InferRequest, inputs: list[dict], binary: bytes) -> None:
    """What decoded must say what the JSON said, read independently: each input's name, datatype and
    shape, and its values (from `data`, or its slice of the binary part)."""
    assert len(request.inputs) == len(inputs)
    offset = 0
    for tensor, sent in zip(request.inputs, inputs, strict=True):
        assert (tensor.name, tensor.datatype, list(tensor.shape)) == (
            sent["name"],
            sent["datatype"],
            sent["shape"],
        )
        assert tensor.data.shape == tuple(sent["shape"])
        values = np.asarray(tensor.data).ravel().tolist()
        size = sent.get("parameters", {}).get("binary_data_size")
        if size is not None:
            chunk = binary[offset : offset + size]
            offset += size
            if tensor.datatype == "BYTES":
                assert b"".join(len(v).to_bytes(4, "little") + v for v in values) == chunk
            else:
                assert np.ascontiguousarray(tensor.data).tobytes() == chunk
        elif tensor.datatype == "BYTES":
            assert values == [v.encode() if isinstance(v, str) else v for v in _flat(sent["data"])]
        else:
            assert values == pytest.approx(_flat(sent["data"]), nan_ok=True)
    assert offset == len(binary)


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


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("INT32", [True, 2]), ("FP32", [[True], [2.5]]), ("UINT8", [[0], [False]])],
    ids=["int-flat", "float-nested", "uint-nested"],
)
def test_booleans_among_numbers_are_refused(datatype: str, data: list) -> None:
    """numpy reads [true, 2] as integers; Triton refuses a boolean in a numeric tensor, and so do we."""
    body = orjson.dumps(one_input(datatype=datatype, data=data))
    with pytest.raises(InferError) as excinfo:
        decode_request(body, None, MODEL)
    assert_invalid(excinfo, INPUT, "booleans", datatype)


@st.composite
def wellformed_inputs(draw) -> tuple[dict, bytes]:
    """One input that must decode: a numeric or BYTES tensor as JSON `data` or as binary tensor data."""
    datatype = draw(st.sampled_from(["INT32", "INT64", "UINT8", "FP32", "FP64", "BOOL", "BYTES"]))
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    count = int(np.prod(shape))
    if datatype == "BOOL":
        values = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    elif datatype == "BYTES":
        values = draw(st.lists(st.text(max_size=5), min_size=count, max_size=count))
    elif datatype.startswith("FP"):
        values = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=count, max_size=count))
    else:
        low, high = (0, 255) if datatype == "UINT8" else (-(2**31), 2**31 - 1)
        values = draw(st.lists(st.integers(low, high), min_size=count, max_size=count))
    entry = {"name": draw(st.sampled_from([INPUT, "x\u00e9", "b"])), "datatype": datatype, "shape": shape}
    if not draw(st.booleans()):
        entry["data"] = values
        return entry, b""
    if datatype == "BYTES":
        raw = b"".join(len(v.encode()).to_bytes(4, "little") + v.encode() for v in values)
    else:
        numpy_type = {
            "INT32": "<i4",
            "INT64": "<i8",
            "UINT8": "u1",
            "FP32": "<f4",
            "FP64": "<f8",
            "BOOL": "?",
        }
        raw = np.array(values, dtype=numpy_type[datatype]).tobytes()
    entry["parameters"] = {"binary_data_size": len(raw)}
    return entry, raw


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(wellformed_inputs(), min_size=1, max_size=3))
def test_wellformed_requests_decode_to_what_they_say(parts) -> None:
    inputs = [entry for entry, _ in parts]
    binary = b"".join(raw for _, raw in parts)
    header = json.dumps({"inputs": inputs}).encode()
    request = decode_request(header + binary, len(header) if binary else None, MODEL)
    assert_read_alike(request, inputs, binary)
