"""ModelInferRequest bytes -> InferRequest: the hand-written protobuf reader of KServe v2 gRPC's request.

betterproto2 takes ~60 us to parse the `simple` request and copies every bytes field. Here
`raw_input_contents` and packed numeric `*_contents` become `np.frombuffer` views over the received
bytes (memoryview slices, no copy), packed varints are decoded with numpy, and no numeric tensor is
looped over element by element. The generated messages in `proto.inference` stay the source of truth:
the field numbers below are theirs, and tests/test_codec_v2_grpc.py checks this reader against them.
The answers' writer and the other messages are codec/v2_grpc.py.
"""

from typing import Any

import numpy as np

from tensorgate.codec import sequence
from tensorgate.codec.datatypes import BY_V2, DataType
from tensorgate.codec.errors import invalid
from tensorgate.codec.protowire import (
    DOUBLE,
    I32,
    I64,
    LEN,
    VARINT,
    Malformed,
    fields,
    packed_varints,
    remember,
    signed64,
    text,
    varint,
)
from tensorgate.codec.tensor import (
    InferRequest,
    RequestedOutput,
    Tensor,
    array_from_bytes,
    checked_shape,
    in_shared_memory,
    request_view,
)

# InferTensorContents field number -> (name, the datatypes it carries, how its elements are packed).
_CONTENTS = {
    1: ("bool_contents", ("BOOL",), "varint"),
    2: ("int_contents", ("INT8", "INT16", "INT32"), "varint"),
    3: ("int64_contents", ("INT64",), "varint"),
    4: ("uint_contents", ("UINT8", "UINT16", "UINT32"), "varint"),
    5: ("uint64_contents", ("UINT64",), "varint"),
    6: ("fp32_contents", ("FP32",), "<f4"),
    7: ("fp64_contents", ("FP64",), "<f8"),
    8: ("bytes_contents", ("BYTES",), "bytes"),
}
_FIELD_FOR = {dt: number for number, (_, types, _) in _CONTENTS.items() for dt in types}
_UNPACKED = {"varint": VARINT, "<f4": I32, "<f8": I64, "bytes": LEN}  # the wire type of a lone element


class _Input:
    """An InferInputTensor as read; `dtype` is set once its datatype and shape passed the checks."""

    __slots__ = ("key", "name", "datatype", "shape", "parameters", "contents", "dtype", "count")

    def __init__(self, key: bytes) -> None:
        self.key = key  # the message's bytes
        self.name = ""
        self.datatype = ""
        self.shape: list[int] | tuple[int, ...] = []
        self.parameters: dict[str, Any] = {}
        self.contents: tuple[int, int] | None = None  # the InferTensorContents span in the message
        self.dtype: DataType | None = None
        self.count = 0


# Checked inputs without contents or parameters, by their bytes: a client sends the same few input
# headers (name, datatype, shape) again and again, and a dict lookup is ~20x cheaper than reading and
# checking one. Bounded, as the response caches below.
_CHECKED: dict[bytes, _Input] = {}


# Requests that differ only in their raw_input_contents, by the bytes before them: a client sends the
# same model name and input headers again and again (every proto3 encoder writes fields in number order,
# raw_input_contents, field 7, last). Only requests with no id, parameters or requested outputs, whose
# inputs are all raw numeric data, are kept. A request that starts with a known skeleton and holds nothing
# after it but raw_input_contents skips the field-by-field read: ~5.8 -> ~2.5 us for `simple`.
_SKELETONS: dict[bytes, "Skeleton"] = {}
_SKELETON_LENGTHS: list[int] = []  # the lengths of the skeletons kept, a few at most
_MAX_SKELETON_LENGTHS = 4
_RAW_TAG = 0x3A  # raw_input_contents: field 7, length-delimited


def decode_request(data: bytes | memoryview | bytearray) -> InferRequest:
    """ModelInferRequest bytes -> InferRequest; numeric tensors are views over `data` (a large message the
    transport received into one buffer is read where it lies, not copied)."""
    if type(data) is not bytes:
        data = memoryview(data).cast("B")
    else:
        for length in _SKELETON_LENGTHS:
            if len(data) > length and data[length] == _RAW_TAG:
                skeleton = _SKELETONS.get(data[:length])
                if skeleton is not None:
                    request = _from_skeleton(data, length, skeleton)
                    if request is not None:
                        return request
    try:
        return _decode_request(data)  # type: ignore[arg-type]  # protowire reads a memoryview as bytes
    except Malformed as e:
        raise invalid(f"malformed ModelInferRequest: {e}") from None


Skeleton = tuple[str, str, tuple[_Input, ...]]  # model name, version, the checked input headers


def _from_skeleton(data: bytes, pos: int, skeleton: Skeleton) -> InferRequest | None:
    """The request from its skeleton and the raw_input_contents after it; None when anything else follows
    or a size does not fit (the full read then gives the answer, or the error)."""
    model_name, model_version, entries = skeleton
    end = len(data)
    tensors = []
    index = 0
    try:
        while pos < end:
            if data[pos] != _RAW_TAG or index == len(entries):
                return None
            length = data[pos + 1]
            if length < 0x80:
                pos += 2
            else:
                length, pos = varint(data, pos + 1)
            stop = pos + length
            entry = entries[index]
            dtype: DataType = entry.dtype  # type: ignore[assignment]  # a skeleton's inputs are checked
            if stop > end or length != entry.count * dtype.size:
                return None
            array = request_view(entry.shape, dtype.numpy, data, pos, length)  # type: ignore[arg-type]  # a tuple
            tensors.append(Tensor(entry.name, dtype.v2, entry.shape, array, {}))  # type: ignore[arg-type]  # a tuple
            index += 1
            pos = stop
    except (IndexError, Malformed):
        return None
    if index != len(entries):
        return None
    return InferRequest(model_name, model_version, None, tensors, None, {})


def _keep_skeleton(data: bytes, length: int, model_name: str, model_version: str, inputs: list) -> None:
    if len(_SKELETON_LENGTHS) >= _MAX_SKELETON_LENGTHS and length not in _SKELETON_LENGTHS:
        return
    for entry in inputs:
        if entry.dtype is None or entry.dtype.size == 0 or entry.parameters or entry.contents is not None:
            return
    if length not in _SKELETON_LENGTHS:
        _SKELETON_LENGTHS.append(length)
    remember(_SKELETONS, data[:length], (model_name, model_version, tuple(inputs)))


def _decode_request(data: bytes) -> InferRequest:
    view = memoryview(data)
    model_name = model_version = request_id = ""
    parameters: dict[str, Any] = {}
    inputs: list[_Input] = []
    outputs: list[RequestedOutput] = []
    raw: list[memoryview] = []
    skeleton_end = 0  # where the fields before the first raw_input_contents end
    raw_last = True  # nothing but raw_input_contents after the first of them
    for field, wire, start, stop in fields(data, 0, len(data)):
        if wire != LEN:
            raw_last = raw_last and not raw
            skeleton_end = stop if not raw else skeleton_end
            continue
        if field == 7:
            raw.append(view[start:stop])
            continue
        if raw:
            raw_last = False
        else:
            skeleton_end = stop
        if field == 5:
            key = data[start:stop]
            if type(key) is not bytes:
                key = bytes(key)
            entry = _CHECKED.get(key)
            inputs.append(entry if entry is not None else _decode_input(data, start, stop, key))
        elif field == 1:
            model_name = text(data, start, stop)
        elif field == 2:
            model_version = text(data, start, stop)
        elif field == 3:
            request_id = text(data, start, stop)
        elif field == 4:
            _decode_map_entry(data, start, stop, parameters)
        elif field == 6:
            outputs.append(_decode_requested_output(data, start, stop))

    what = f"the inference request for model '{model_name}'"
    if not inputs:
        raise invalid(f"{what} must have a non-empty 'inputs' list")
    plain = not (request_id or parameters or outputs)  # a skeleton may be kept (checked before the pops)
    sequence_id, sequence_flags = sequence.from_grpc(parameters) if parameters else (0, 0)
    if any(entry.parameters for entry in inputs) and any(in_shared_memory(e.parameters) for e in inputs):
        request = _request_with_shared_memory(data, view, inputs, raw, model_name, model_version, request_id,
                                              outputs, parameters)  # fmt: skip
        request.sequence_id, request.sequence_flags = sequence_id, sequence_flags
        return request
    if raw and len(raw) != len(inputs):
        _raw_mismatch(inputs, raw, model_name, "inputs")
    tensors = [
        _tensor(data, view, entry, raw[i] if raw else None, model_name) for i, entry in enumerate(inputs)
    ]
    if raw and raw_last and plain and type(data) is bytes:
        _keep_skeleton(data, skeleton_end, model_name, model_version, inputs)
    shm = bool(outputs) and any(in_shared_memory(o.parameters) for o in outputs)  # outputs into regions
    return InferRequest(model_name, model_version, request_id or None, tensors, outputs or None, parameters,
                        False, shm, sequence_id=sequence_id, sequence_flags=sequence_flags)  # fmt: skip


def _request_with_shared_memory(
    data: bytes, view: memoryview, inputs: list, raw: list, model: str, version: str, request_id: str,
    outputs: list, parameters: dict,
) -> InferRequest:  # fmt: skip
    """A request with inputs in shared-memory regions: they carry no data (the server reads them), and
    raw_input_contents, in order, belong to the other inputs."""
    plain = [entry for entry in inputs if not in_shared_memory(entry.parameters)]
    if raw and len(raw) != len(plain):
        _raw_mismatch(plain, raw, model, "inputs not in shared memory")
    contents = iter(raw)
    tensors = []
    for entry in inputs:
        if in_shared_memory(entry.parameters):
            if entry.dtype is None:
                _check(entry, f"model '{model}', input '{entry.name}'")
            if entry.contents is not None:
                raise invalid(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{entry.name}' for model '{model}'"
                )
            tensors.append(Tensor(entry.name, entry.dtype.v2, entry.shape, None, entry.parameters))
        else:
            tensors.append(_tensor(data, view, entry, next(contents) if raw else None, model))
    return InferRequest(model, version, request_id or None, tensors, outputs or None, parameters, False, True)


def _raw_mismatch(inputs: list[_Input], raw: list, model: str, what: str) -> None:
    """Raises the error for raw_input_contents that do not pair one to one with `inputs`: Triton's text
    for an input that also has contents, or that no raw entry is left for."""
    for entry in inputs:
        if entry.contents is not None:
            raise invalid(_both_contents(entry.name, model))
    if len(raw) < len(inputs):
        raise invalid(_no_data(inputs[len(raw)].name, model))
    raise invalid(
        f"the number of {what} ({len(inputs)}) does not match the number of raw_input_contents "
        f"({len(raw)}) for model '{model}'"
    )


def _both_contents(name: str, model: str) -> str:
    return (
        f"contents field must not be specified when using raw_input_contents for '{name}' for model '{model}'"
    )


def _no_data(name: str, model: str) -> str:
    return f"unable to find data for input tensor '{name}' for model '{model}' in request."


def _decode_input(buf: bytes, pos: int, end: int, key: bytes) -> _Input:
    entry = _Input(key)
    for field, wire, start, stop in fields(buf, pos, end):
        if field == 1 and wire == LEN:
            entry.name = text(buf, start, stop)
        elif field == 2 and wire == LEN:
            entry.datatype = text(buf, start, stop)
        elif field == 3:
            if wire == LEN:  # packed, as every proto3 encoder writes it
                while start < stop:
                    dim, start = varint(buf, start)
                    entry.shape.append(signed64(dim))  # type: ignore[union-attr]  # a list until _check
                if start != stop:
                    raise Malformed("packed shape runs past its field")
            elif wire == VARINT:
                entry.shape.append(signed64(start))  # type: ignore[union-attr]  # as above
        elif field == 4 and wire == LEN:
            _decode_map_entry(buf, start, stop, entry.parameters)
        elif field == 5 and wire == LEN:
            entry.contents = (start, stop)
    return entry


def _decode_requested_output(buf: bytes, pos: int, end: int) -> RequestedOutput:
    name = ""
    parameters: dict[str, Any] = {}
    for field, wire, start, stop in fields(buf, pos, end):
        if field == 1 and wire == LEN:
            name = text(buf, start, stop)
        elif field == 2 and wire == LEN:
            _decode_map_entry(buf, start, stop, parameters)
    count = 0
    if "classification" in parameters:  # Triton's classification extension, read as Triton reads it
        count = parameters.pop("classification")
        if type(count) is not int:
            raise invalid("invalid value type for 'classification' parameter, expected int64_param")
        if count <= 0:
            raise invalid("invalid value for 'classification' parameter, expected >= 0")
    return RequestedOutput(name, None, parameters, count)


def _decode_map_entry(buf: bytes, pos: int, end: int, into: dict[str, Any]) -> None:
    """One map<string, InferParameter> entry; the parameter's value as bool, int, str or float (None
    when none of the oneof is set)."""
    key, value = "", None
    for field, wire, start, stop in fields(buf, pos, end):
        if field == 1 and wire == LEN:
            key = text(buf, start, stop)
        elif field == 2 and wire == LEN:
            value = _decode_parameter(buf, start, stop)
    into[key] = value


def _decode_parameter(buf: bytes, pos: int, end: int) -> Any:
    value: Any = None
    for field, wire, start, stop in fields(buf, pos, end):
        if wire == VARINT:
            if field == 1:
                value = bool(start)
            elif field == 2:
                value = signed64(start)
            elif field == 5:
                value = start
        elif field == 3 and wire == LEN:
            value = text(buf, start, stop)
        elif field == 4 and wire == I64:
            value = DOUBLE.unpack_from(buf, start)[0]
    return value


def _tensor(buf: bytes, view: memoryview, entry: _Input, raw: memoryview | None, model: str) -> Tensor:
    what = f"model '{model}', input '{entry.name}'"
    if entry.dtype is None:
        _check(entry, what)
    dtype: DataType = entry.dtype  # type: ignore[assignment]  # _check set it
    shape: tuple[int, ...] = entry.shape  # type: ignore[assignment]  # and made it a tuple
    if raw is not None:
        if entry.contents is not None:
            raise invalid(_both_contents(entry.name, model))
        data = array_from_bytes(raw, dtype, shape, entry.count, what, "raw_input_contents")
    elif entry.contents is not None:
        data = _from_contents(buf, view, entry.contents, dtype, shape, entry.count, what)
    else:
        raise invalid(_no_data(entry.name, model))
    return Tensor(entry.name, dtype.v2, shape, data, entry.parameters or {})


def _check(entry: _Input, what: str) -> None:
    """Checks an input's datatype and shape; remembers it by its bytes when it has no contents and no
    parameters (it then holds nothing a request could change)."""
    dtype = BY_V2.get(entry.datatype)
    if dtype is None:
        raise invalid(f"{what}: unknown datatype {entry.datatype!r}")
    entry.dtype = dtype
    entry.shape, entry.count = checked_shape(entry.shape, what)
    if entry.contents is None and not entry.parameters:
        remember(_CHECKED, entry.key, entry)


def _from_contents(
    buf: bytes, view: memoryview, span: tuple[int, int], dtype: DataType, shape: tuple, count: int, what: str
) -> np.ndarray:
    if dtype.v2 in ("FP16", "BF16"):
        raise invalid(f"{what}: {dtype.v2} data can only be sent in raw_input_contents")
    wanted = _FIELD_FOR[dtype.v2]
    packing = _CONTENTS[wanted][2]
    lone_wire = _UNPACKED[packing]
    # The wanted field's packed chunks, and its elements written alone (an int for a varint), in order.
    packed: list[memoryview | int] = []
    strings: list[bytes] = []  # BYTES elements
    for field, wire, start, stop in fields(buf, span[0], span[1]):
        if field not in _CONTENTS:
            continue
        if field != wanted:
            raise invalid(
                f"{what}: contents hold {_CONTENTS[field][0]} where datatype {dtype.v2} "
                f"takes {_CONTENTS[wanted][0]}"
            )
        if field == 8 and wire == LEN:
            strings.append(bytes(view[start:stop]))
        elif wire == LEN:
            packed.append(view[start:stop])
        elif wire == lone_wire:  # an element written alone (proto2 style)
            if wire == VARINT:
                packed.append(start)
            else:  # a fixed32 / fixed64 element: its bytes, as a packed run would hold them
                packed.append(view[start:stop])
        else:
            raise Malformed(f"{_CONTENTS[field][0]} has the wrong wire type {wire}")
    if wanted == 8:
        if len(strings) != count:
            raise invalid(f"{what}: contents hold {len(strings)} elements, shape {list(shape)} needs {count}")
        array = np.empty(count, dtype=object)
        array[:] = strings
        return array.reshape(shape)
    array = _numbers(packed, packing, dtype, what)
    if array.size != count:
        raise invalid(f"{what}: contents hold {array.size} elements, shape {list(shape)} needs {count}")
    return array.reshape(shape)


def _numbers(packed: list[memoryview | int], packing: str, dtype: DataType, what: str) -> np.ndarray:
    if packing != "varint":
        chunks: list[memoryview] = packed  # type: ignore[assignment]  # varints alone come as ints
        width = dtype.size
        if any(len(chunk) % width for chunk in chunks):
            raise Malformed(f"packed {dtype.v2} contents are not a whole number of {width}-byte elements")
        if len(chunks) == 1:
            return np.frombuffer(chunks[0], dtype=packing)  # the common case: a view, no copy
        return np.frombuffer(b"".join(chunks), dtype=packing)
    parts, alone = [], []  # decoded runs in wire order; `alone` gathers consecutive lone elements
    for item in packed:
        if isinstance(item, int):
            alone.append(item)
            continue
        if alone:
            parts.append(np.array(alone, dtype=np.uint64))
            alone = []
        parts.append(packed_varints(item))
    if alone:
        parts.append(np.array(alone, dtype=np.uint64))
    values = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    kind = dtype.v2
    if kind == "BOOL":
        return values != 0
    if kind in ("INT64", "UINT64"):
        return values.view(dtype.numpy)
    # int32 / uint32 fields: protobuf keeps the low 32 bits of the varint
    values = values.astype(np.uint32).view(np.int32 if kind.startswith("INT") else np.uint32)
    if dtype.size < 4 and values.size:  # 8 and 16 bits travel in 32-bit fields
        limits = np.iinfo(dtype.numpy)
        if values.min() < limits.min or values.max() > limits.max:
            raise invalid(f"{what}: contents hold values outside the range of {kind}")
    return values if values.dtype == dtype.numpy else values.astype(dtype.numpy)
