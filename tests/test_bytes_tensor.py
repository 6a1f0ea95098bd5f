"""BYTES tensors on the wire: 4-byte little-endian length + bytes per element, row-major.

The expected wire bytes are built here with `struct`, independently of codec.bytes_tensor, the way a
Triton client library does it.
"""

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.codec.bytes_tensor import decode_bytes, encode_bytes
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferRequest, InferResponse, Tensor
from tensorgate.codec.v2_http import decode_request, encode_response

WHAT = "model 'bert-q', input 'tokens'"


def wire(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def objects(elements: list, shape: tuple[int, ...] | None = None) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape if shape is not None else (len(elements),))


def assert_invalid(excinfo: pytest.ExceptionInfo, *names: str) -> None:
    assert excinfo.value.kind is ErrorKind.INVALID_ARGUMENT
    for name in names:
        assert name in excinfo.value.message, (name, excinfo.value.message)


# --- encode_bytes ---------------------------------------------------------------------------------


def test_encode_exact_wire_format():
    out = encode_bytes(objects([b"ab", b"", b"\x00\xff\x00"]))
    assert out == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00\x00\xff\x00"


def test_encode_length_is_little_endian_for_long_elements():
    element = b"x" * 0x0102
    assert encode_bytes(objects([element]))[:4] == b"\x02\x01\x00\x00"


def test_encode_str_elements_as_utf8():
    assert encode_bytes(objects(["h\u00e9", "\U0001f600"])) == wire(
        ["h\u00e9".encode(), "\U0001f600".encode()]
    )


def test_encode_numpy_bytes_and_str_arrays():
    assert encode_bytes(np.array([b"ab", b"c"], dtype="S")) == wire([b"ab", b"c"])
    assert encode_bytes(np.array(["ab", "\u00e9"], dtype="U")) == wire([b"ab", "\u00e9".encode()])


def test_encode_is_row_major_for_multidim_and_non_contiguous():
    grid = objects([b"a", b"b", b"c", b"d", b"e", b"f"], (2, 3))
    assert encode_bytes(grid) == wire([b"a", b"b", b"c", b"d", b"e", b"f"])
    # The transpose is a strided view: its logical row-major order is a, d, b, e, c, f.
    assert encode_bytes(grid.T) == wire([b"a", b"d", b"b", b"e", b"c", b"f"])


def test_encode_empty_tensor():
    assert encode_bytes(np.empty((0, 3), dtype=object)) == b""


def test_encode_int_element_matches_json_encoding():
    tensor = Tensor("o", "BYTES", (1,), objects([3]))
    assert encode_bytes(tensor.data) == wire([b"3"])


# --- decode_bytes ---------------------------------------------------------------------------------


def test_decode_exact_wire_format():
    buffer = b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x01\x00\x00\x00\x00"
    out = decode_bytes(memoryview(buffer), 3, WHAT)
    assert out.dtype == object and out.shape == (3,)
    assert list(out) == [b"ab", b"", b"\x00"]
    assert all(type(e) is bytes for e in out)


def test_decode_non_utf8_and_nul_elements_are_kept_verbatim():
    elements = [b"\xff\xfe\x80", b"a\x00b", b"\x00\x00\x00\x00", b"\xed\xa0\x80"]
    assert list(decode_bytes(memoryview(wire(elements)), 4, WHAT)) == elements


def test_decode_zero_elements():
    assert decode_bytes(memoryview(b""), 0, WHAT).shape == (0,)


def test_decoded_elements_do_not_alias_the_body():
    body = bytearray(wire([b"abc"]))
    out = decode_bytes(memoryview(body), 1, WHAT)
    body[4:7] = b"XYZ"
    assert out[0] == b"abc"


@pytest.mark.parametrize(
    ("buffer", "count", "expected"),
    [
        pytest.param(b"", 1, "fewer", id="empty-buffer-one-element"),
        pytest.param(b"\x01\x00\x00", 1, "fewer", id="prefix-truncated-to-3-bytes"),
        pytest.param(b"\x01", 1, "fewer", id="prefix-truncated-to-1-byte"),
        pytest.param(wire([b"ab"]) + b"\x00\x00", 2, "fewer", id="second-prefix-truncated"),
        pytest.param(wire([b"ab"]), 2, "fewer", id="fewer-elements-than-shape"),
        pytest.param(b"\x05\x00\x00\x00abc", 1, "past the end", id="length-past-end"),
        pytest.param(b"\xff\xff\xff\xff", 1, "past the end", id="length-0xffffffff"),
        pytest.param(wire([b"ab"]) + b"\x09\x00\x00\x00x", 2, "past the end", id="second-length-past-end"),
        pytest.param(wire([b"ab", b"c"]), 1, "more", id="more-elements-than-shape"),
        pytest.param(wire([b"ab"]) + b"\x00", 1, "more", id="one-trailing-byte"),
        pytest.param(b"\x00\x00\x00\x00", 0, "more", id="element-for-zero-size-shape"),
    ],
)
def test_decode_rejects_malformed_buffers(buffer, count, expected):
    with pytest.raises(InferError) as excinfo:
        decode_bytes(memoryview(buffer), count, WHAT)
    assert_invalid(excinfo, "bert-q", "tokens", expected)


element_lists = st.lists(st.binary(max_size=12), max_size=8)


@settings(max_examples=60, deadline=None)
@given(element_lists)
def test_encode_decode_round_trip(elements):
    encoded = encode_bytes(objects(elements))
    assert encoded == wire(elements)
    assert list(decode_bytes(memoryview(encoded), len(elements), WHAT)) == elements


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=40), st.integers(min_value=0, max_value=6))
def test_decode_arbitrary_bytes_either_parses_exactly_or_is_invalid(buffer, count):
    try:
        out = decode_bytes(memoryview(buffer), count, WHAT)
    except InferError as e:
        assert e.kind is ErrorKind.INVALID_ARGUMENT
        assert WHAT in e.message
    else:
        # Success means the buffer is exactly `count` well-formed elements.
        assert out.shape == (count,)
        assert wire(list(out)) == buffer


# --- BYTES through the HTTP codec ------------------------------------------------------------------


def binary_request(shape: list[int], payload: bytes, name: str = "tokens") -> tuple[bytes, int]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(payload)},
                }
            ]
        }
    )
    return header + payload, len(header)


def test_http_binary_bytes_edge_elements():
    elements = [b"", b"\x00", b"\xff\xfe", b"a\x00b\x00", b"", b"\xc3\xa9"]
    body, length = binary_request([2, 3], wire(elements))
    request = decode_request(body, length, "bert-q")
    (tensor,) = request.inputs
    assert tensor.datatype == "BYTES" and tensor.shape == (2, 3)
    assert tensor.data.shape == (2, 3) and tensor.data.dtype == object
    assert tensor.data.tolist() == [elements[:3], elements[3:]]


@pytest.mark.parametrize(
    ("shape", "payload"),
    [
        pytest.param([2], wire([b"a"]), id="fewer-elements"),
        pytest.param([1], wire([b"a", b"b"]), id="more-elements"),
        pytest.param([1], b"\x01\x00", id="truncated-prefix"),
        pytest.param([1], b"\x10\x00\x00\x00abc", id="length-past-end"),
        pytest.param([1], wire([b"a"]) + b"\x00\x00", id="trailing-bytes"),
        pytest.param([0], b"\x00", id="data-for-empty-shape"),
    ],
)
def test_http_binary_bytes_malformed(shape, payload):
    body, length = binary_request(shape, payload)
    with pytest.raises(InferError) as excinfo:
        decode_request(body, length, "bert-q")
    assert_invalid(excinfo, "bert-q", "tokens")


def test_http_bytes_binary_output_of_non_utf8_is_fine_and_json_is_invalid():
    data = objects([b"\xff\x00", b"ok"])
    response = InferResponse("bert-q", "1", [Tensor("logits_txt", "BYTES", (2,), data)])

    headers, chunks = encode_response(response, InferRequest("bert-q", binary_output=True))
    header_length = int(dict(headers)[b"inference-header-content-length"])
    body = b"".join(bytes(c) for c in chunks)
    assert body[header_length:] == wire([b"\xff\x00", b"ok"])

    with pytest.raises(InferError) as excinfo:
        encode_response(response, InferRequest("bert-q", binary_output=False))
    assert_invalid(excinfo, "bert-q", "logits_txt")
