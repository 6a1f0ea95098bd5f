"""KServe v2 over gRPC, the codec alone: ModelInferRequest bytes -> InferRequest, InferResponse -> bytes.

Requests are built, and answers read back, with the betterproto2 messages generated from proto/ (the
wire format's source of truth), so the hand-written wire codec is checked against the protocol and not
against itself.
"""

import math
import struct

import betterproto2
import numpy as np
import pytest
from grpclib.const import Status
from hypothesis import given, settings
from hypothesis import strategies as st
from v2_client import (
    ALL_DATATYPES,
    MODEL,
    WIRE_DTYPES,
    assert_invalid,
    assert_same_tensor,
    objects,
    tensor_values,
)

import tensorgate.proto.inference as pb
from tensorgate.batcher.stats import ModelStats
from tensorgate.codec import v2_grpc, v2_grpc_request
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferResponse, Tensor

INPUT = "pixel_in"

# The typed contents field a client fills for each datatype (FP16 and BF16 have none: raw only).
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def raw_bytes(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(e)) + e for e in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=WIRE_DTYPES[datatype]).tobytes()


def typed_contents(datatype: str, array: np.ndarray) -> pb.InferTensorContents:
    values = array.reshape(-1).tolist()
    return pb.InferTensorContents(**{TYPED_FIELD[datatype]: values})


def input_tensor(name: str, datatype: str, shape, contents=None, parameters=None):
    return pb.ModelInferRequestInferInputTensor(
        name=name, datatype=datatype, shape=list(shape), contents=contents, parameters=parameters or {}
    )


def request_bytes(*inputs, raw=(), **fields) -> bytes:
    return bytes(
        pb.ModelInferRequest(model_name=MODEL, inputs=list(inputs), raw_input_contents=list(raw), **fields)
    )


def decode(data: bytes):
    return v2_grpc_request.decode_request(data)


def invalid(data: bytes, *fragments: str) -> str:
    with pytest.raises(InferError) as excinfo:
        decode(data)
    return assert_invalid(excinfo, *fragments)


# --- 1. every datatype, raw and typed ---------------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_raw_input_contents_every_datatype(datatype, data):
    array = data.draw(tensor_values(datatype, binary=True))
    message = request_bytes(input_tensor(INPUT, datatype, array.shape), raw=[raw_bytes(datatype, array)])
    request = decode(message)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == (INPUT, datatype, array.shape)
    assert_same_tensor(tensor.data, array, datatype)


TYPED = [d for d in ALL_DATATYPES if d not in ("FP16", "BF16")]


@pytest.mark.parametrize("datatype", TYPED)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_typed_contents_every_datatype(datatype, data):
    array = data.draw(tensor_values(datatype, binary=True))
    if array.dtype.kind == "f":  # through Python floats: no NaN payloads to compare bitwise
        array = np.nan_to_num(array, nan=1.5)
    contents = typed_contents(datatype, array)
    request = decode(request_bytes(input_tensor(INPUT, datatype, array.shape, contents)))
    (tensor,) = request.inputs
    assert (tensor.datatype, tensor.shape) == (datatype, array.shape)
    assert_same_tensor(tensor.data, array, datatype)


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("INT8", [-128, -1, 0, 127]),
        ("INT16", [-32768, 32767]),
        ("INT32", [-(2**31), 2**31 - 1, -5]),
        ("INT64", [-(2**63), 2**63 - 1, -1]),
        ("UINT8", [0, 255]),
        ("UINT16", [0, 65535]),
        ("UINT32", [0, 2**32 - 1]),
        ("UINT64", [0, 2**64 - 1, 2**63]),
        ("BOOL", [True, False, True]),
    ],
)
def test_typed_contents_extremes(datatype, values):
    array = np.array(values, dtype=WIRE_DTYPES[datatype])
    request = decode(
        request_bytes(input_tensor(INPUT, datatype, array.shape, typed_contents(datatype, array)))
    )
    assert request.inputs[0].data.tolist() == values


def test_raw_inputs_are_zero_copy_views_of_the_message():
    # both over SMALL_COPY bytes (smaller ones are copied: test_a_small_raw_input_...)
    a, b = np.arange(1000, dtype="<f4"), np.arange(240, dtype="<i8").reshape(2, 3, 40)
    message = request_bytes(
        input_tensor("a", "FP32", a.shape),
        input_tensor("b", "INT64", b.shape),
        raw=[a.tobytes(), b.tobytes()],
    )
    start = np.frombuffer(message, np.uint8).ctypes.data
    for tensor, expected in zip(decode(message).inputs, (a, b), strict=True):
        assert np.array_equal(tensor.data, expected)
        address = tensor.data.ctypes.data
        assert start <= address and address + tensor.data.nbytes <= start + len(message), "data was copied"
        assert not tensor.data.flags.writeable


def test_a_small_raw_input_off_alignment_is_an_aligned_copy():
    # numpy runs ufuncs on unaligned data through a buffered loop (~3x the time for `simple`'s inputs)
    b = np.arange(16, dtype="<i4").reshape(1, 16)
    for name in ("b", "bb", "bbb", "bbbb"):  # a longer name moves the raw contents along the message
        message = request_bytes(input_tensor(name, "INT32", b.shape), raw=[b.tobytes()])
        offset = message.rindex(b.tobytes())
        if offset % 4:
            break
    assert (np.frombuffer(message, np.uint8).ctypes.data + offset) % 4, "the raw bytes are off alignment"
    for _ in range(2):  # the second read comes from the remembered skeleton
        tensor = decode(message).inputs[0]
        assert tensor.data.flags.aligned
        assert np.array_equal(tensor.data, b)


def test_packed_fp32_contents_are_zero_copy_too():
    values = np.linspace(-1, 1, 64, dtype="<f4")
    message = request_bytes(
        input_tensor(INPUT, "FP32", [8, 8], pb.InferTensorContents(fp32_contents=values.tolist()))
    )
    tensor = decode(message).inputs[0]
    start = np.frombuffer(message, np.uint8).ctypes.data
    assert start <= tensor.data.ctypes.data < start + len(message)
    assert np.array_equal(tensor.data, values.reshape(8, 8))


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers as their 64-bit two's complement, as protobuf writes them
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def test_unpacked_repeated_numbers_decode_like_packed_ones():
    """proto3 parsers must accept repeated scalars written one by one (proto2 style), and a mix."""
    floats, ints = [1.5, -2.0, 3.25], [7, -3, 300]
    unpacked_fp32 = b"".join(b"\x35" + struct.pack("<f", v) for v in floats)  # field 6, wire type 5
    mixed_int = bytes(pb.InferTensorContents(int_contents=ints[:1]))  # a packed chunk, then single ones
    mixed_int += b"".join(b"\x10" + varint(v) for v in ints[1:])  # field 2, wire type 0
    single_first = b"\x10" + varint(ints[0]) + bytes(pb.InferTensorContents(int_contents=ints[1:]))
    cases = (("FP32", unpacked_fp32, floats), ("INT32", mixed_int, ints), ("INT32", single_first, ints))
    for datatype, contents, expected in cases:
        header = bytes(pb.ModelInferRequestInferInputTensor(name=INPUT, datatype=datatype, shape=[3]))
        body = header + b"\x2a" + varint(len(contents)) + contents  # field 5: contents
        message = bytes(pb.ModelInferRequest(model_name=MODEL)) + b"\x2a" + varint(len(body)) + body
        assert decode(message).inputs[0].data.tolist() == expected
    # an fp32 element written as a varint is no float at all
    header = bytes(pb.ModelInferRequestInferInputTensor(name=INPUT, datatype="FP32", shape=[1]))
    body = header + b"\x2a\x02\x30\x01"
    invalid(bytes(pb.ModelInferRequest(model_name=MODEL)) + b"\x2a" + varint(len(body)) + body, "wire type")


def test_several_inputs_mixing_raw_is_all_or_nothing():
    a = np.arange(4, dtype="<i4")
    raw_a = input_tensor("a", "INT32", [4])
    typed_b = input_tensor("b", "INT32", [4], pb.InferTensorContents(int_contents=[1, 2, 3, 4]))
    message = invalid(request_bytes(raw_a, typed_b, raw=[a.tobytes(), a.tobytes()]), "'b'", MODEL)
    assert (
        message
        == f"contents field must not be specified when using raw_input_contents for 'b' for model '{MODEL}'"
    )
    message = invalid(request_bytes(raw_a, input_tensor("b", "INT32", [4]), raw=[a.tobytes()]), "'b'")
    assert message == f"unable to find data for input tensor 'b' for model '{MODEL}' in request."
    # one input's contents beside another's raw data: Triton's text, whatever the count of raw entries
    message = invalid(request_bytes(raw_a, typed_b, raw=[a.tobytes()]), "'b'")
    assert message.startswith("contents field must not be specified when using raw_input_contents")


# --- 2. request fields --------------------------------------------------------------------------


PARAMETERS = {
    "flag": pb.InferParameter(bool_param=False),
    "count": pb.InferParameter(int64_param=-42),
    "big": pb.InferParameter(uint64_param=2**64 - 1),
    "label": pb.InferParameter(string_param="héllo"),
    "ratio": pb.InferParameter(double_param=0.25),
    "empty": pb.InferParameter(),
}
PLAIN = {"flag": False, "count": -42, "big": 2**64 - 1, "label": "héllo", "ratio": 0.25, "empty": None}


def test_id_version_parameters_and_requested_outputs_are_kept():
    outputs = [
        pb.ModelInferRequestInferRequestedOutputTensor(
            name="out_b",
            parameters={"tag": PARAMETERS["count"], "classification": pb.InferParameter(int64_param=3)},
        ),
        pb.ModelInferRequestInferRequestedOutputTensor(name="out_a"),
    ]
    message = request_bytes(
        input_tensor(INPUT, "INT32", [1], pb.InferTensorContents(int_contents=[5]), parameters=PARAMETERS),
        model_version="3",
        id="req-17",
        parameters=PARAMETERS,
        outputs=outputs,
    )
    request = decode(message)
    assert (request.model_name, request.model_version, request.id) == (MODEL, "3", "req-17")
    assert request.parameters == PLAIN
    assert type(request.parameters["flag"]) is bool and type(request.parameters["count"]) is int
    assert request.inputs[0].parameters == PLAIN
    assert [(o.name, o.parameters, o.class_count) for o in request.outputs] == [
        ("out_b", {"tag": -42}, 3),  # Triton's classification extension: the top 3 classes
        ("out_a", {}, 0),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (pb.InferParameter(int64_param=0), "invalid value for 'classification' parameter, expected >= 0"),
        (pb.InferParameter(int64_param=-2), "invalid value for 'classification' parameter, expected >= 0"),
        (
            pb.InferParameter(string_param="3"),
            "invalid value type for 'classification' parameter, expected int64_param",
        ),
    ],
)
def test_a_bad_classification_parameter_gets_tritons_text(value: pb.InferParameter, message: str) -> None:
    output = pb.ModelInferRequestInferRequestedOutputTensor(name="o", parameters={"classification": value})
    raw = [np.zeros(1, "<i4").tobytes()]
    assert invalid(request_bytes(input_tensor(INPUT, "INT32", [1]), raw=raw, outputs=[output])) == message


def test_a_request_naming_a_shared_memory_region_says_so():
    """The endpoints serve only these through the server's regions; every other goes to the model."""
    region = {
        "shared_memory_region": pb.InferParameter(string_param="r"),
        "shared_memory_byte_size": pb.InferParameter(int64_param=4),
    }
    plain = input_tensor(INPUT, "INT32", [1], pb.InferTensorContents(int_contents=[5]))
    output = pb.ModelInferRequestInferRequestedOutputTensor
    cases = [
        (request_bytes(plain), False),
        (request_bytes(plain, outputs=[output(name="o")]), False),
        (request_bytes(input_tensor(INPUT, "INT32", [1], parameters=region)), True),
        (request_bytes(plain, outputs=[output(name="o"), output(name="p", parameters=region)]), True),
    ]
    for message, names_region in cases:
        assert decode(message).shared_memory is names_region


def test_absent_fields():
    request = decode(
        request_bytes(input_tensor(INPUT, "INT32", [1], pb.InferTensorContents(int_contents=[5])))
    )
    assert (request.model_version, request.id, request.outputs, request.parameters) == ("", None, None, {})


def test_unknown_fields_are_skipped():
    extra = (
        b"\x98\x06\x07" + b"\xa2\x06\x03abc" + b"\xad\x06\x00\x00\x00\x00" + b"\xa9\x06" + bytes(8)
    )  # 99-101
    message = (
        request_bytes(input_tensor(INPUT, "INT32", [1], pb.InferTensorContents(int_contents=[5]))) + extra
    )
    assert decode(message).inputs[0].data.tolist() == [5]


def test_remembered_input_headers_do_not_leak_between_requests():
    header = input_tensor(INPUT, "INT32", [2])
    first = decode(request_bytes(header, raw=[np.array([1, 2], "<i4").tobytes()]))
    second = decode(request_bytes(header, raw=[np.array([3, 4], "<i4").tobytes()]))
    assert first.inputs[0].data.tolist() == [1, 2] and second.inputs[0].data.tolist() == [3, 4]
    second.inputs[0].parameters["x"] = 1
    third = decode(request_bytes(header, raw=[np.array([5, 6], "<i4").tobytes()]))
    assert third.inputs[0].parameters == {}
    # a header remembered as valid still needs its data, and says which model it was sent to
    other = bytes(pb.ModelInferRequest(model_name="other", inputs=[header]))
    assert invalid(other, "unable to find data for input tensor", "for model 'other' in request")


def test_requests_sharing_a_remembered_skeleton_decode_as_each_says():
    """A request read once is remembered up to its raw_input_contents; the next ones that start the same
    must still decode exactly as their own bytes say (new data, fields after the raw data, bad sizes)."""
    headers = [input_tensor("a", "INT32", [2]), input_tensor("b", "FP32", [1])]

    def message(a: list[int], b: float, **extra) -> bytes:
        raw = [np.array(a, "<i4").tobytes(), np.array([b], "<f4").tobytes()]
        return bytes(pb.ModelInferRequest(model_name=MODEL, inputs=headers, raw_input_contents=raw, **extra))

    for a, b in (([1, 2], 0.5), ([3, 4], 1.5), ([5, 6], -2.0)):
        request = decode(message(a, b))
        assert [t.name for t in request.inputs] == ["a", "b"] and request.id is None
        assert request.inputs[0].data.tolist() == a and request.inputs[1].data.tolist() == [b]
        assert request.inputs[1].datatype == "FP32" and request.inputs[1].shape == (1,)
    # fields written after the raw data (protobuf allows any order): the full read honours them
    tail = bytes(pb.ModelInferRequest(id="late", model_version="2"))
    request = decode(message([7, 8], 3.0) + tail)
    assert (request.id, request.model_version) == ("late", "2")
    assert request.inputs[0].data.tolist() == [7, 8]
    # a raw size that does not fit the remembered shape, one raw entry too few or too many
    short = bytes(pb.ModelInferRequest(model_name=MODEL, inputs=headers, raw_input_contents=[b"\0" * 8]))
    assert invalid(short, "unable to find data for input tensor 'b'")
    wrong = bytes(
        pb.ModelInferRequest(model_name=MODEL, inputs=headers, raw_input_contents=[b"\0" * 4, b"\0" * 4])
    )
    assert invalid(wrong, "input 'a'", "4 bytes")
    extra = message([1, 2], 0.5) + bytes(pb.ModelInferRequest(raw_input_contents=[b"\0" * 4]))
    assert invalid(extra, "number of inputs (2)", "raw_input_contents (3)")
    # a message cut inside its raw data is malformed, as without a skeleton
    assert invalid(message([1, 2], 0.5)[:-2], "malformed ModelInferRequest")


# --- 3. errors -----------------------------------------------------------------------------------


def test_request_errors_name_the_model_and_input():
    int_input = input_tensor(INPUT, "INT32", [4])
    four = np.zeros(4, "<i4").tobytes()
    invalid(request_bytes(), "non-empty 'inputs'", MODEL)
    invalid(
        request_bytes(input_tensor(INPUT, "INT33", [1]), raw=[b"\0" * 4]), "unknown datatype 'INT33'", INPUT
    )
    invalid(request_bytes(input_tensor(INPUT, "INT32", [-1]), raw=[four]), "non-negative", INPUT)
    invalid(request_bytes(input_tensor(INPUT, "INT32", [1] * 33), raw=[four]), "at most 32")
    invalid(request_bytes(input_tensor(INPUT, "INT32", [2**62, 4]), raw=[four]), "too many elements")
    message = invalid(request_bytes(int_input, raw=[four[:12]]), INPUT, MODEL)
    assert message.endswith("raw_input_contents holds 12 bytes, shape [4] of INT32 needs 16")
    invalid(request_bytes(int_input), f"unable to find data for input tensor '{INPUT}'")
    strings = input_tensor(INPUT, "BYTES", [3])
    invalid(request_bytes(strings, raw=[b"\1\0\0\0a"]), "cannot hold the 3 elements")
    strings.shape = [2]
    invalid(request_bytes(strings, raw=[b"\5\0\0\0abcde"]), "fewer than the 2 elements")


@pytest.mark.parametrize(
    ("datatype", "contents", "fragments"),
    [
        ("INT32", pb.InferTensorContents(int_contents=[1, 2, 3]), ["contents hold 3 elements", "needs 4"]),
        ("INT32", pb.InferTensorContents(fp32_contents=[1.0] * 4), ["fp32_contents", "takes int_contents"]),
        ("FP32", pb.InferTensorContents(int_contents=[1] * 4), ["int_contents", "takes fp32_contents"]),
        ("INT8", pb.InferTensorContents(int_contents=[1, 2, 3, 128]), ["outside the range of INT8"]),
        ("UINT16", pb.InferTensorContents(uint_contents=[1, 2, 3, 65536]), ["outside the range of UINT16"]),
        ("FP16", pb.InferTensorContents(fp32_contents=[1.0] * 4), ["FP16 data can only be sent in raw"]),
        ("BF16", pb.InferTensorContents(), ["BF16 data can only be sent in raw"]),
        ("BYTES", pb.InferTensorContents(bytes_contents=[b"a"]), ["contents hold 1 elements"]),
    ],
)
def test_typed_contents_errors(datatype, contents, fragments):
    invalid(request_bytes(input_tensor(INPUT, datatype, [4], contents)), INPUT, *fragments)


def test_malformed_protobuf_is_invalid_argument():
    good = request_bytes(input_tensor(INPUT, "INT32", [1], pb.InferTensorContents(int_contents=[5])))
    for cut in (1, 5, len(good) - 1):
        invalid(good[:cut], "malformed ModelInferRequest")
    invalid(b"\x0a\x02\xff\xfe" + good, "malformed", "UTF-8")  # model_name of invalid UTF-8
    invalid(b"\x0b" + good, "malformed")  # wire type 3 (group) does not exist in proto3
    invalid(b"\x08" + b"\xff" * 11, "malformed", "10 bytes")


def assert_read_alike(data: bytes) -> None:
    """Our decoding of `data`, or an INVALID_ARGUMENT; what decodes must read as betterproto2's generated
    message reads the same bytes (the independent reading): names, datatypes, shapes, the data."""
    try:
        request = decode(data)
    except InferError as e:
        assert e.kind is ErrorKind.INVALID_ARGUMENT
        return
    try:
        message = pb.ModelInferRequest().parse(data)
    except (
        Exception
    ):  # betterproto2 cannot read it (a known field with another wire type): nothing to compare
        return
    assert (request.model_name, request.model_version, request.id or "") == (
        message.model_name,
        message.model_version,
        message.id,
    )
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        (i.name, i.datatype, list(i.shape)) for i in message.inputs
    ]
    for index, (tensor, sent) in enumerate(zip(request.inputs, message.inputs, strict=True)):
        if message.raw_input_contents:
            expected = message.raw_input_contents[index]
            assert tensor_bytes(tensor) == expected
        elif tensor.datatype != "BYTES":
            contents = sent.contents
            values = [
                v
                for name in ("bool_contents", "int_contents", "int64_contents", "uint_contents",
                             "uint64_contents", "fp32_contents", "fp64_contents")
                for v in getattr(contents, name)
            ]  # fmt: skip
            assert np.asarray(tensor.data).ravel().tolist() == pytest.approx(values, nan_ok=True)


def tensor_bytes(tensor: Tensor) -> bytes:
    if tensor.datatype == "BYTES":
        return b"".join(len(e).to_bytes(4, "little") + bytes(e) for e in np.asarray(tensor.data).ravel())
    return np.ascontiguousarray(tensor.data).tobytes()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_fail_cleanly(data):
    assert_read_alike(data)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_corrupted_requests_decode_or_fail_cleanly(data):
    array = np.arange(6, dtype="<i4")
    good = bytearray(request_bytes(input_tensor(INPUT, "INT32", [6], typed_contents("INT32", array))))
    for _ in range(data.draw(st.integers(1, 3))):
        good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    assert_read_alike(bytes(good))


def test_grpc_status_of_every_error_kind():
    expected = {
        ErrorKind.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
        ErrorKind.NOT_FOUND: Status.NOT_FOUND,
        ErrorKind.UNAVAILABLE: Status.UNAVAILABLE,
        ErrorKind.UNIMPLEMENTED: Status.UNIMPLEMENTED,
        ErrorKind.RESOURCE_EXHAUSTED: Status.RESOURCE_EXHAUSTED,
        ErrorKind.INTERNAL: Status.INTERNAL,
    }
    assert {kind: v2_grpc.grpc_status(kind) for kind in ErrorKind} == expected


# --- 4. responses --------------------------------------------------------------------------------


def read_response(data: bytes) -> tuple[pb.ModelInferResponse, dict[str, np.ndarray]]:
    """As a client reads it: output metadata, then raw_output_contents in the same order."""
    message = pb.ModelInferResponse.parse(data)
    assert len(message.raw_output_contents) == len(message.outputs)
    arrays = {}
    for output, raw in zip(message.outputs, message.raw_output_contents, strict=True):
        assert output.contents is None
        shape = tuple(output.shape)
        if output.datatype == "BYTES":
            elements, offset = [], 0
            for _ in range(math.prod(shape)):
                (n,) = struct.unpack_from("<I", raw, offset)
                elements.append(raw[offset + 4 : offset + 4 + n])
                offset += 4 + n
            assert offset == len(raw)
            arrays[output.name] = objects(elements, shape)
        else:
            arrays[output.name] = np.frombuffer(raw, WIRE_DTYPES[output.datatype]).reshape(shape)
    return message, arrays


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_response_every_datatype(datatype, data):
    array = data.draw(tensor_values(datatype, binary=True))
    other = np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2]  # not contiguous: sent row-major
    response = InferResponse(
        MODEL,
        "2",
        [Tensor("out", datatype, array.shape, array), Tensor("idx", "INT64", (2, 2), other)],
        "r-1",
    )
    message, arrays = read_response(v2_grpc.encode_response(response))
    assert (message.model_name, message.model_version, message.id) == (MODEL, "2", "r-1")
    assert [(o.name, o.datatype, o.shape) for o in message.outputs] == [
        ("out", datatype, list(array.shape)),
        ("idx", "INT64", [2, 2]),
    ]
    assert_same_tensor(arrays["out"], array, datatype)
    assert arrays["idx"].tolist() == [[0, 2], [3, 5]]


def parameters_from_proto(parameters: dict[str, pb.InferParameter]) -> dict:
    """map<string, InferParameter> of a betterproto2 message -> plain values."""
    out = {}
    for key, parameter in parameters.items():
        out[key] = None
        for name in ("bool_param", "int64_param", "string_param", "double_param", "uint64_param"):
            value = getattr(parameter, name)
            if value is not None:
                out[key] = value
    return out


def test_response_parameters_every_kind():
    values = {"flag": True, "n": -7, "huge": 2**64 - 1, "big": 2**63 - 1, "s": "x", "f": 2.5, "other": [1]}
    tensor = Tensor("out", "INT32", (1,), np.array([1], np.int32), parameters={"p": 3})
    message, _ = read_response(v2_grpc.encode_response(InferResponse(MODEL, "1", [tensor], None, values)))
    plain = parameters_from_proto(message.parameters)
    assert plain == {**values, "other": "[1]"}
    assert parameters_from_proto(message.outputs[0].parameters) == {"p": 3}
    assert message.id == ""


def test_stream_responses():
    body = v2_grpc.encode_response(InferResponse(MODEL, "1", [], "a"))
    answer = pb.ModelStreamInferResponse.parse(v2_grpc.encode_stream_response(body))
    assert answer.error_message == "" and answer.infer_response.id == "a"
    failed = pb.ModelStreamInferResponse.parse(v2_grpc.encode_stream_error("it broke", "b"))
    assert (failed.error_message, failed.infer_response.id) == ("it broke", "b")
    anonymous = pb.ModelStreamInferResponse.parse(v2_grpc.encode_stream_error("it broke"))
    assert (anonymous.error_message, anonymous.infer_response.id) == ("it broke", "")


def test_decode_then_encode_through_a_model_like_step():
    """A request decoded here, turned into outputs by numpy, and encoded, as the server does it."""
    a, b = np.arange(16, dtype="<i4").reshape(1, 16), np.full((1, 16), 3, "<i4")
    request = decode(
        request_bytes(
            input_tensor("INPUT0", "INT32", [1, 16]),
            input_tensor("INPUT1", "INT32", [1, 16]),
            raw=[a.tobytes(), b.tobytes()],
            id="x",
        )
    )
    x, y = (t.data for t in request.inputs)
    response = InferResponse(MODEL, "1", [Tensor("SUM", "INT32", x.shape, x + y)], request.id)
    message, arrays = read_response(v2_grpc.encode_response(response))
    assert message.id == "x" and arrays["SUM"].tolist() == (a + b).tolist()


# --- 5. the other messages -----------------------------------------------------------------------


def test_model_metadata_message():
    doc = {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "python",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "BYTES", "shape": [1]}],
    }
    message = pb.ModelMetadataResponse.parse(bytes(v2_grpc.model_metadata(doc)))
    assert message.to_dict(casing=betterproto2.Casing.SNAKE) == {
        **doc,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "3"]}],
        "outputs": [{"name": "y", "datatype": "BYTES", "shape": ["1"]}],
    }


def test_model_config_message_leaves_out_what_the_subset_lacks():
    config = {
        "name": "m",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}],
        "output": [{"name": "y", "data_type": "TYPE_STRING", "dims": [-1]}],
        "some_future_setting": {"a": 1},
    }
    message = pb.ModelConfigResponse.parse(bytes(v2_grpc.model_config(config))).config
    assert (message.name, message.backend, message.max_batch_size) == ("m", "python", 8)
    assert message.input[0].data_type == pb.DataType.TYPE_FP32 and message.output[0].dims == [-1]


def test_model_statistics_message():
    stats = ModelStats()
    stats.record_batch(4, 10, 20, 30)
    stats.record_success(2, 100, 5, 10, 20, 30)
    stats.record_failure(1, 7)
    message = pb.ModelStatistics.parse(bytes(v2_grpc.model_statistics("m", "3", stats.as_dict())))
    assert (message.name, message.version, message.inference_count, message.execution_count) == (
        "m",
        "3",
        4,
        1,
    )
    assert (message.inference_stats.success.count, message.inference_stats.success.ns) == (2, 100)
    assert (message.inference_stats.fail.count, message.inference_stats.fail.ns) == (1, 7)
    assert message.inference_stats.compute_infer.ns == 40
    assert [(b.batch_size, b.compute_output.ns) for b in message.batch_stats] == [(4, 30)]


def test_repository_load_parameters():
    config, files = v2_grpc.repository_parameters(
        {
            "config": pb.ModelRepositoryParameter(string_param='{"backend": "python"}'),
            "file:1/model.py": pb.ModelRepositoryParameter(bytes_param=b"class Model: ..."),
            "ignored": pb.ModelRepositoryParameter(int64_param=1),
        }
    )
    assert (config, files) == ('{"backend": "python"}', {"1/model.py": b"class Model: ..."})
    with pytest.raises(InferError, match="'config' must have string type"):
        v2_grpc.repository_parameters({"config": pb.ModelRepositoryParameter(bytes_param=b"{}")})
    with pytest.raises(InferError, match="'file:1/model.py' must have bytes type"):
        v2_grpc.repository_parameters({"file:1/model.py": pb.ModelRepositoryParameter(string_param="x")})
