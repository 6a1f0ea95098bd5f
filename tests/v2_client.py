"""The client side of KServe v2 REST with Triton's binary tensor data extension, for the codec tests.

Requests are built the way a client builds them (JSON header, binary tensors appended in input order,
Inference-Header-Content-Length = the header's size) and responses are read back the way a client reads
them (split at inference-header-content-length, np.frombuffer, BYTES length prefixes), with the stdlib
json module and a datatype table of the tests' own, so the codec is checked against the protocol and not
against itself.
"""

import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorgate.codec.errors import ErrorKind

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
    fields, chunks = encoded  # encode_response's header fields and body chunks
    headers = dict(fields)
    assert len(headers) == len(fields), "duplicate response headers"
    body = b"".join(bytes(c) for c in chunks)
    assert int(headers[b"content-length"]) == len(body)
    if b"inference-header-content-length" in headers:
        assert headers[b"content-type"] == b"application/octet-stream"
        split = int(headers[b"inference-header-content-length"])
        assert split == len(bytes(chunks[0]))
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


def one_input(**fields) -> dict:
    entry = {"name": INPUT, "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    for key, value in fields.items():
        if value is ...:
            del entry[key]
        else:
            entry[key] = value
    return {"inputs": [entry]}
