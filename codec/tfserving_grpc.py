"""TensorFlow Serving's gRPC tensors and Predict messages, read and written by hand (as
codec/v2_grpc_request.py does for KServe v2): TensorProto <-> arrays, PredictRequest -> its parts,
PredictResponse's bytes.

The field numbers are those of tensorflow/core/framework/tensor.proto and tensor_shape.proto, and of
tensorflow_serving/apis/model.proto and predict.proto, as proto/ writes them;
tests/test_codec_tfserving_grpc.py checks this reader and writer against the generated messages.

A TensorProto is read as TensorFlow's Tensor::FromProto reads it:
- `tensor_content` (the elements' bytes, little-endian) when it is set, else the typed field of its dtype
  (float_val, double_val, int_val, int64_val, bool_val, string_val, half_val for DT_HALF and DT_BFLOAT16,
  uint32_val, uint64_val); the other typed fields are ignored;
- fewer typed values than the shape holds repeat the last one; none at all give zeros;
- more values than the shape holds, content of the wrong length, an unknown rank or a negative size
  fail: `tensor parsing error: <name>`, as TF Serving says.
An answer carries numbers in `tensor_content` and strings in `string_val`, as TF Serving writes them.
"""

from dataclasses import dataclass

import numpy as np

from tensorgate.codec.datatypes import BY_TF_NUMBER, BY_V2, DataType
from tensorgate.codec.errors import invalid
from tensorgate.codec.protowire import (
    CACHE_MAX,
    I32,
    I64,
    LEN,
    VARINT,
    Malformed,
    fields,
    len_field,
    packed_varints,
    remember,
    signed64,
    str_field,
    tag,
    text,
    uvarint,
)
from tensorgate.codec.tensor import request_view

MAX_DIMS = 64
# tensor.proto: TensorProto's fields
DTYPE, SHAPE, CONTENT = 1, 2, 4
FLOAT_VAL, DOUBLE_VAL, INT_VAL, STRING_VAL, INT64_VAL, BOOL_VAL, HALF_VAL = 5, 6, 7, 8, 10, 11, 13
UINT32_VAL, UINT64_VAL = 16, 17
# The typed field each dtype's values are read from, and how one element is packed there.
_TYPED = {
    "FP32": (FLOAT_VAL, "<f4"),
    "FP64": (DOUBLE_VAL, "<f8"),
    "INT32": (INT_VAL, "varint"),
    "INT16": (INT_VAL, "varint"),
    "INT8": (INT_VAL, "varint"),
    "UINT8": (INT_VAL, "varint"),
    "UINT16": (INT_VAL, "varint"),
    "INT64": (INT64_VAL, "varint"),
    "BOOL": (BOOL_VAL, "varint"),
    "BYTES": (STRING_VAL, "bytes"),
    "FP16": (HALF_VAL, "varint"),
    "BF16": (HALF_VAL, "varint"),
    "UINT32": (UINT32_VAL, "varint"),
    "UINT64": (UINT64_VAL, "varint"),
}
_LONE_WIRE = {"varint": VARINT, "<f4": I32, "<f8": I64, "bytes": LEN}
_DTYPE_TAG, _SHAPE_TAG, _CONTENT_TAG, _STRING_TAG = (
    tag(DTYPE, VARINT),
    tag(SHAPE, LEN),
    tag(CONTENT, LEN),
    tag(STRING_VAL, LEN),
)
_DIM_TAG, _SIZE_TAG = tag(2, LEN), tag(1, VARINT)


@dataclass(slots=True)
class ModelSpec:
    """tensorflow.serving.ModelSpec: `version` None when the request names none (or names a label)."""

    name: str = ""
    version: int | None = None
    version_label: str = ""
    signature_name: str = ""


@dataclass(slots=True)
class Predict:
    """A PredictRequest as read: its inputs by alias, each (the dtype it says, the array)."""

    spec: ModelSpec
    inputs: dict[str, tuple[DataType, np.ndarray]]
    output_filter: list[str]


def _parsing_error(name: str, why: str) -> Exception:
    return invalid(f"tensor parsing error: {name} ({why})")


# ------------------------------------------------------------------------------------------ reading


# A request whose every input is in tensor_content is, but for those bytes, the same from one call to the
# next: its skeleton (the bytes around the contents, the spec, each input's dtype and shape) is kept, and a
# request of the same length whose bytes around the same places match it is read from it.
Skeleton = tuple[tuple[tuple[int, int], ...], bytes, ModelSpec, tuple[tuple[str, DataType, tuple], ...], list]
_SKELETONS: dict[int, list[Skeleton]] = {}
_SKELETONS_PER_LENGTH = 4


def decode_predict(data: bytes | memoryview) -> Predict:
    """PredictRequest bytes -> its model spec, inputs and output filter (fields 1, 2, 3; the streaming
    and client options are not used here). Numeric inputs are views of `data`."""
    buf = bytes(data) if not isinstance(data, bytes) else data
    for skeleton in _SKELETONS.get(len(buf), ()):
        kept_spans, around, kept_spec, entries, kept_filter = skeleton
        if _around(buf, kept_spans) == around:
            views = {
                alias: (dtype, request_view(shape, dtype.numpy, buf, start, end - start))
                for (alias, dtype, shape), (start, end) in zip(entries, kept_spans, strict=True)
            }
            return Predict(kept_spec, views, list(kept_filter))
    spec = ModelSpec()
    inputs: dict[str, tuple[DataType, np.ndarray]] = {}
    output_filter: list[str] = []
    spans: list[tuple[int, int]] = []
    try:
        for number, wire, value, stop in fields(buf, 0, len(buf)):
            if wire != LEN:
                continue
            if number == 1:
                spec = decode_model_spec(buf, value, stop)
            elif number == 2:
                alias, start, end = _map_entry(buf, value, stop)
                if alias in inputs:
                    raise invalid(f"input tensor alias '{alias}' is given twice")
                inputs[alias] = decode_tensor(buf, start, end, alias, spans)
            elif number == 3:
                output_filter.append(text(buf, value, stop))
    except Malformed as e:
        raise invalid(f"the PredictRequest is not a valid protobuf message: {e}") from None
    if len(spans) == len(inputs):  # every input in tensor_content
        _keep_skeleton(buf, spans, spec, inputs, output_filter)
    return Predict(spec, inputs, output_filter)


def _keep_skeleton(buf: bytes, spans: list, spec: ModelSpec, inputs: dict, output_filter: list) -> None:
    kept = _SKELETONS.setdefault(len(buf), [])
    if len(kept) >= _SKELETONS_PER_LENGTH or len(_SKELETONS) >= CACHE_MAX:
        return
    spans = sorted(spans)
    by_start = {start: alias for alias, start in zip(inputs, (s for s, _ in spans), strict=True)}
    entries = tuple((by_start[start], *_entry(inputs[by_start[start]])) for start, _ in spans)
    kept.append((tuple(spans), _around(buf, spans), spec, entries, list(output_filter)))


def _around(buf: bytes, spans: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> bytes:
    """The bytes of `buf` outside the (start, stop) spans, in order."""
    pieces, pos = [], 0
    for start, stop in spans:
        pieces.append(buf[pos:start])
        pos = stop
    pieces.append(buf[pos:])
    return b"".join(pieces)


def _entry(given: tuple[DataType, np.ndarray]) -> tuple[DataType, tuple]:
    return given[0], given[1].shape


def decode_model_spec(buf: bytes, pos: int, end: int) -> ModelSpec:
    spec = ModelSpec()
    for number, wire, value, stop in fields(buf, pos, end):
        if number == 1 and wire == LEN:
            spec.name = text(buf, value, stop)
        elif number == 2 and wire == LEN:  # google.protobuf.Int64Value: its field 1
            spec.version = 0
            for inner, inner_wire, version, _ in fields(buf, value, stop):
                if inner == 1 and inner_wire == VARINT:
                    spec.version = signed64(version)
        elif number == 4 and wire == LEN:
            spec.version_label = text(buf, value, stop)
        elif number == 3 and wire == LEN:
            spec.signature_name = text(buf, value, stop)
    return spec


def _map_entry(buf: bytes, pos: int, end: int) -> tuple[str, int, int]:
    """A map<string, message> entry: its key, and where its value's bytes are."""
    key, start, stop = "", 0, 0
    for number, wire, value, value_end in fields(buf, pos, end):
        if number == 1 and wire == LEN:
            key = text(buf, value, value_end)
        elif number == 2 and wire == LEN:
            start, stop = value, value_end
    return key, start, stop


def decode_tensor(
    buf: bytes, pos: int, end: int, name: str, spans: list | None = None
) -> tuple[DataType, np.ndarray]:
    """A TensorProto -> (its dtype, its array); `name` says which tensor in errors. Where its elements
    are read from tensor_content, the content's (start, stop) in `buf` goes to `spans`."""
    number, content, typed = 0, None, []
    shape: tuple[int, ...] = ()
    for field, wire, value, stop in fields(buf, pos, end):
        if field == DTYPE and wire == VARINT:
            number = value
        elif field == SHAPE and wire == LEN:
            shape = _shape(buf, value, stop, name)
        elif field == CONTENT and wire == LEN:
            content = (value, stop)
        else:
            typed.append((field, wire, value, stop))
    dtype = BY_TF_NUMBER.get(number)
    if dtype is None:
        raise _parsing_error(name, f"DataType {number} is not one tensorgate serves")
    count = int(np.prod(shape)) if shape else 1
    if content is not None and content[1] > content[0] and dtype.v2 != "BYTES":
        size = content[1] - content[0]
        if size != count * dtype.size:
            raise _parsing_error(
                name,
                f"tensor_content holds {size} bytes, {dtype.tf} {list(shape)} needs {count * dtype.size}",
            )
        if spans is not None:
            spans.append(content)
        return dtype, request_view(shape, dtype.numpy, buf, content[0], content[1] - content[0])
    return dtype, _from_typed(buf, dtype, typed, shape, count, name)


def _shape(buf: bytes, pos: int, end: int, name: str) -> tuple[int, ...]:
    dims: list[int] = []
    for field, wire, value, stop in fields(buf, pos, end):
        if field == 2 and wire == LEN:
            size = 0
            for inner, inner_wire, number, _ in fields(buf, value, stop):
                if inner == 1 and inner_wire == VARINT:
                    size = signed64(number)
            if size < 0:
                raise _parsing_error(name, f"dimension {len(dims)} has size {size}")
            dims.append(size)
        elif field == 3 and wire == VARINT and value:
            raise _parsing_error(name, "its shape has an unknown rank")
    if len(dims) > MAX_DIMS:
        raise _parsing_error(name, f"it has {len(dims)} dimensions, over the {MAX_DIMS} allowed")
    return tuple(dims)


def _from_typed(
    buf: bytes, dtype: DataType, typed: list, shape: tuple[int, ...], count: int, name: str
) -> np.ndarray:
    field, packing = _TYPED[dtype.v2]
    chunks = [(wire, value, stop) for number, wire, value, stop in typed if number == field]
    if packing == "bytes":
        values = np.empty(len(chunks), dtype=object)
        for i, (wire, value, stop) in enumerate(chunks):
            if wire != LEN:
                raise _parsing_error(name, "string_val holds something other than bytes")
            values[i] = buf[value:stop]
    else:
        values = _numbers(buf, chunks, packing, name)
        values = _as_dtype(values, dtype)
    given = values.size
    if given > count:
        raise _parsing_error(name, f"it has {given} values, {dtype.tf} {list(shape)} holds {count}")
    if given == count:
        return values.reshape(shape)
    out = np.zeros(count, dtype=dtype.numpy) if dtype.v2 != "BYTES" else np.full(count, b"", dtype=object)
    if given:  # fewer values than elements: the last one repeats, as TensorFlow reads them
        out[:given] = values
        out[given:] = values[-1]
    return out.reshape(shape)


def _numbers(buf: bytes, chunks: list, packing: str, name: str) -> np.ndarray:
    lone = _LONE_WIRE[packing]
    parts = []
    view = memoryview(buf)
    for wire, value, stop in chunks:
        if wire == LEN:  # packed
            if packing == "varint":
                parts.append(packed_varints(view[value:stop]))
            else:
                width = 4 if packing == "<f4" else 8
                if (stop - value) % width:
                    raise _parsing_error(name, "a packed field's length is not a whole number of values")
                parts.append(np.frombuffer(view[value:stop], packing))
        elif wire == lone:
            if packing == "varint":
                parts.append(np.array([value], dtype=np.uint64))
            else:
                parts.append(np.frombuffer(view[value:stop], packing))
        else:
            raise _parsing_error(name, f"a typed field has wire type {wire}")
    if not parts:
        return np.zeros(0, dtype=np.uint64 if packing == "varint" else packing)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _as_dtype(values: np.ndarray, dtype: DataType) -> np.ndarray:
    """Values as read from their field -> the dtype's elements (varints wrap as TensorFlow casts them)."""
    if values.dtype == dtype.numpy:
        return values
    if dtype.v2 in ("FP16", "BF16"):  # half_val: the 16 bits in an int32
        bits = values.astype(np.uint16)
        return bits.view(np.float16) if dtype.v2 == "FP16" else bits
    if dtype.v2 == "BOOL":
        return values != 0
    return values.astype(dtype.numpy)  # uint64 bits -> the narrower or signed integer type


# ------------------------------------------------------------------------------------------ writing


_HEADS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def encode_tensor(array: np.ndarray, datatype: str) -> bytes:
    """A TensorProto of `array` (whose elements are `datatype`'s, v2's name)."""
    dtype = BY_V2[datatype]
    head = _HEADS.get((datatype, array.shape))
    if head is None:
        dims = (len_field(_DIM_TAG, _SIZE_TAG + uvarint(size) if size else b"") for size in array.shape)
        head = _DTYPE_TAG + uvarint(dtype.tf_number) + len_field(_SHAPE_TAG, b"".join(dims))
        remember(_HEADS, (datatype, array.shape), head)
    if datatype == "BYTES":
        elements = (e if isinstance(e, bytes) else str(e).encode() for e in array.reshape(-1))
        return head + b"".join(len_field(_STRING_TAG, element) for element in elements)
    content = np.ascontiguousarray(array, dtype=dtype.numpy).tobytes()
    return head + (len_field(_CONTENT_TAG, content) if content else b"")


_SPECS: dict[tuple[str, int, str], bytes] = {}


def encode_model_spec(name: str, version: int, signature_name: str) -> bytes:
    key = (name, version, signature_name)
    found = _SPECS.get(key)
    if found is None:
        version_value = len_field(tag(2, LEN), tag(1, VARINT) + uvarint(version & ((1 << 64) - 1)))
        spec = str_field(tag(1, LEN), name) + version_value + str_field(tag(3, LEN), signature_name)
        found = remember(_SPECS, key, spec)
    return found


_OUTPUT_TAG, _SPEC_TAG, _KEY_TAG, _VALUE_TAG = tag(1, LEN), tag(2, LEN), tag(1, LEN), tag(2, LEN)


def encode_predict(outputs: list[tuple[str, str, np.ndarray]], spec: bytes) -> bytes:
    """PredictResponse bytes: each (alias, v2 datatype, array) in `outputs`, and the model spec's bytes."""
    entries = [
        len_field(
            _OUTPUT_TAG, str_field(_KEY_TAG, alias) + len_field(_VALUE_TAG, encode_tensor(array, datatype))
        )
        for alias, datatype, array in outputs
    ]
    return b"".join(entries) + len_field(_SPEC_TAG, spec)
