"""JSON values <-> numpy arrays as TF Serving's REST API writes them (its "JSON conformance").

- NaN, Infinity and -Infinity are bare tokens both ways (codec/json_text.py, shared with the v2 codec).
- `{"b64": "..."}` stands for binary strings in requests, and in answers for outputs named `*_bytes`.
- Numeric JSON becomes a numpy array in one or two vectorised conversions that also enforce the type:
  integers fill float tensors; booleans, strings, objects and nulls never mix with numbers.
"""

import base64
from typing import Any

import numpy as np

from tensorgate.codec import json_text
from tensorgate.codec.bytes_tensor import b64decode
from tensorgate.codec.datatypes import BY_V2, DataType, bf16_bits
from tensorgate.codec.errors import describe, invalid
from tensorgate.codec.tensor import JSON_KINDS, JSON_TYPES, MAX_DIMS, flat_json_of, holds_booleans, narrowed

B64 = "b64"

_TF_TYPE_NAMES = {"b": "booleans", "i": "integers", "u": "non-negative integers", "f": "numbers"}
_NARROW_LIMITS = {np.dtype(t): float(np.finfo(t).max) for t in ("<f2", "<f4")}


def loads(body: bytes | bytearray | memoryview, what: str) -> Any:
    try:
        return json_text.loads(body)
    except ValueError as e:
        raise invalid(f"JSON Parse error in {what}: {e}") from None


dumps = json_text.dumps


def is_b64(value: Any) -> bool:
    return type(value) is dict and len(value) == 1 and type(value.get(B64)) is str


# ------------------------------------------------------------------------------------------ JSON -> numpy


def to_array(value: Any, dtype: DataType, what: str) -> np.ndarray:
    """A JSON value (a scalar or nested lists) -> an array of `dtype` shaped as the nesting."""
    if dtype.v2 == "BYTES":
        return _bytes_array(value, what)
    if dtype.v2 == "BF16":
        return bf16_bits(to_array(value, BY_V2["FP32"], what))
    target = dtype.numpy
    # The common case, a flat list of the right JSON types (checked in C): one conversion.
    if type(value) is list and value and flat_json_of(value, target.kind):
        return _convert(value, target, dtype, what)
    try:
        parsed = np.array(value)  # numpy infers bool, int64/uint64, float64, or str/object for anything else
    except (ValueError, TypeError):
        raise invalid(f"{what}: {_ragged_or_bad(value, dtype)}") from None
    if parsed.ndim > MAX_DIMS:
        raise invalid(f"{what}: is nested more than the {MAX_DIMS} dimensions allowed")
    if parsed.size and parsed.dtype.kind not in JSON_KINDS[target.kind]:
        raise invalid(f"{what}: {_ragged_or_bad(value, dtype)}")
    if target.kind != "b" and parsed.dtype.kind != "b" and holds_booleans(value):
        raise invalid(f"{what}: holds booleans where {dtype.tf} takes {_TF_TYPE_NAMES[target.kind]}")
    if parsed.dtype == target:
        return parsed
    if target.kind in "iu":  # converting the Python ints again checks their range
        return _convert(value, target, dtype, what)
    if target.kind == "f" and parsed.dtype.kind == "f":
        return _narrow(parsed, target, dtype, what)
    return parsed.astype(target)


def _convert(value: Any, target: np.dtype, dtype: DataType, what: str) -> np.ndarray:
    try:
        limit = _NARROW_LIMITS.get(target)
        if limit is not None and not _within(value, limit):
            return _narrow(np.array(value, dtype=np.float64), target, dtype, what)
        return np.array(value, dtype=target)
    except (OverflowError, TypeError, ValueError):
        raise invalid(f"{what}: holds values outside the range of {dtype.tf}") from None


def _within(value: Any, limit: float) -> bool:
    """A short flat list of numbers all within ±limit (checked in Python: cheaper than numpy for a few)."""
    # A NaN max() returns fails the test, so a value past the limit cannot hide behind one.
    return type(value) is list and len(value) <= 64 and max(value) <= limit and min(value) >= -limit


def _narrow(wide: np.ndarray, target: np.dtype, dtype: DataType, what: str) -> np.ndarray:
    """float64 -> a narrower float; values past its range would silently become infinities."""
    narrow = narrowed(wide, target)
    if narrow is None:
        raise invalid(f"{what}: holds values outside the range of {dtype.tf}")
    return narrow


def _ragged_or_bad(value: Any, dtype: DataType) -> str:
    """Why `value` is not a dense array of `dtype` (error path only): the first offending element."""
    accepted = JSON_TYPES[dtype.numpy.kind]
    level, depth = [value], 0
    while level:
        lists = [item for item in level if type(item) is list]
        if lists and len(lists) != len(level):
            return "is ragged: it mixes lists and values at the same depth"
        if not lists:
            break
        if len({len(item) for item in lists}) > 1:
            return "is ragged: lists at the same depth must have the same length"
        depth += 1
        if depth > MAX_DIMS:
            return f"is nested more than the {MAX_DIMS} dimensions allowed"
        level = [element for item in lists for element in item]
    for item in level:
        if type(item) not in accepted:
            return f"expected {_TF_TYPE_NAMES[dtype.numpy.kind]} for {dtype.tf}, got {_describe(item)}"
    return f"holds values outside the range of {dtype.tf}"


def _describe(item: Any) -> str:
    if type(item) is dict:
        return "an object" if not is_b64(item) else "a {'b64': ...} object"
    return describe(item)


def _bytes_array(value: Any, what: str) -> np.ndarray:
    """Nested lists of strings or {"b64": ...} objects -> an object array of bytes."""
    shape: list[int] = []
    level = [value]
    while level and type(level[0]) is list:
        width = len(level[0])
        if any(type(item) is not list or len(item) != width for item in level):
            raise invalid(f"{what}: is ragged: lists at the same depth must have the same length")
        shape.append(width)
        if len(shape) > MAX_DIMS:
            raise invalid(f"{what}: is nested more than the {MAX_DIMS} dimensions allowed")
        level = [element for item in level for element in item]
    out = np.empty(len(level), dtype=object)
    for i, leaf in enumerate(level):
        if type(leaf) is bytes:  # a tf.Example's bytes_list (gRPC)
            out[i] = leaf
        elif type(leaf) is str:
            try:
                out[i] = leaf.encode()
            except UnicodeEncodeError:
                raise invalid(f"{what}: a string is not valid UTF-8 (a lone surrogate escape)") from None
        elif is_b64(leaf):
            out[i] = b64decode(leaf[B64], what)
        elif type(leaf) is list:
            raise invalid(f"{what}: is ragged: it mixes lists and values at the same depth")
        else:
            raise invalid(
                f"{what}: expected strings or {{'b64': ...}} objects for DT_STRING, got {_describe(leaf)}"
            )
    return out.reshape(shape)


# ------------------------------------------------------------------------------------------ numpy -> JSON


def json_value(array: np.ndarray, as_b64: bool = False) -> Any:
    """What orjson writes as the tensor's nested lists (or bare value for a scalar)."""
    if array.dtype.kind == "O":
        return _strings(array, as_b64)
    if json_text.non_finite(array):
        return json_text.with_tokens(array)
    if array.ndim == 0:
        return array[()]  # orjson writes numpy scalars, not 0-d arrays
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def json_rows(array: np.ndarray, as_b64: bool = False) -> list:
    """The tensor's rows along dimension 0, each as json_value would write it."""
    if array.dtype.kind == "O":
        return _strings(array, as_b64)
    if json_text.non_finite(array):
        return [json_value(row) for row in array]
    return list(array if array.flags.c_contiguous else np.ascontiguousarray(array))


def _strings(array: np.ndarray, as_b64: bool) -> Any:
    flat = array.reshape(-1)
    if not as_b64:
        try:
            texts: list[Any] = [e.decode() if isinstance(e, bytes) else str(e) for e in flat]
        except UnicodeDecodeError:
            as_b64 = True  # bytes that are no text go out as base64 rather than mangled
    if as_b64:
        texts = [
            {B64: base64.b64encode(e if isinstance(e, bytes) else str(e).encode()).decode()} for e in flat
        ]
    out = np.empty(len(texts), dtype=object)
    out[:] = texts
    return out.reshape(array.shape).tolist()
