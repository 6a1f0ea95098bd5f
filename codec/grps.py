"""grps (NetEase-Media/grps) requests: a GrpsMessage on the wire -> Payload. Sans-IO.

A request arrives as protobuf JSON (REST), as raw bytes (REST `application/octet-stream`: bin_data) or as
a parsed GrpsMessage (gRPC) and becomes a Payload: the model it names, the member of `data_oneof` it
used and its data as Tensors. codec.grps_mapping maps a Payload to a model's inputs; codec.grps_answers
writes the answers.

JSON follows the protobuf JSON mapping as grps reads and writes it: field names in their proto spelling
(`str_data`, written so) or lowerCamelCase (`strData`); enums by name or number; int64 values as numbers
or decimal strings (written as strings); floats as numbers or "NaN", "Infinity", "-Infinity"; bytes as
base64. Unknown fields are ignored, as grps ignores them. `ndarray` (HTTP JSON only) is a nested array
of numbers standing for one FP32 tensor.
"""

import math
import re
from dataclasses import dataclass
from typing import Any

import betterproto2
import numpy as np
import orjson

import tensorgate.proto.grps.protos.v1 as pb
from tensorgate.codec.bytes_tensor import b64decode
from tensorgate.codec.datatypes import BY_GRPS, BY_V2, DataType
from tensorgate.codec.errors import describe, invalid
from tensorgate.codec.tensor import MAX_DIMS, Tensor, holds_booleans, narrowed

BIN_DATA, STR_DATA, GTENSORS, NDARRAY, GMAP = "bin_data", "str_data", "gtensors", "ndarray", "gmap"
DATA_FIELDS = (BIN_DATA, STR_DATA, GTENSORS, NDARRAY, GMAP)

FLOATS = ("FP16", "FP32", "FP64", "BF16")  # the datatypes an ndarray fills and return-ndarray writes
# gmap's maps and the datatype each value takes; s_s and s_b both hold BYTES.
MAP_TYPES = {"s_s": "BYTES", "s_b": "BYTES", "s_i32": "INT32", "s_i64": "INT64", "s_f": "FP32", "s_d": "FP64"}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_INTEGER = re.compile(r"-?[0-9]+")


def flat_field(grps_dtype: str) -> str:
    """The GenericTensor field holding a dtype's values: DT_INT32 -> flat_int32."""
    return "flat_" + grps_dtype[3:].lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


FLAT_FIELDS = {flat_field(name): name for name in BY_GRPS}  # flat_int32 -> DT_INT32
# The lowerCamelCase JSON name of every field spelled with a '_' (str_data -> strData).
_CAMEL = {field: _camel(field) for field in (*DATA_FIELDS, *MAP_TYPES, *FLAT_FIELDS) if "_" in field}
_DTYPE_NAMES = {member.value: member.name for member in pb.DataType}


@dataclass(slots=True)
class Payload:
    """A request's data. `tensors`: gtensors in order (name "" when unnamed); one FP32 tensor named ""
    for ndarray; one 0-d tensor per gmap key; one 0-d BYTES tensor named "" for str_data / bin_data."""

    model: str  # "name" or "name-version"; "" when the message names none
    kind: str  # the data_oneof member the message used
    tensors: list[Tensor]


# ---------------------------------------------------------------------------------------------- requests


def payload_from_json(body: bytes | bytearray | memoryview) -> Payload:
    if not body:
        raise invalid("the request body is empty: send a GrpsMessage as JSON, or bin_data as octet-stream")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise invalid(f"malformed JSON in the grps request: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("a grps request must be a JSON object (a GrpsMessage)")
    model = _get(doc, "model")
    if model is not None and not isinstance(model, str):
        raise invalid(f"'model' must be a string (name or name-version), got {model!r}")
    present = [field for field in DATA_FIELDS if _get(doc, field) is not None]
    if not present:
        raise invalid("the request carries no data: set one of bin_data, str_data, gtensors, ndarray, gmap")
    if len(present) > 1:
        raise invalid(f"the request sets {' and '.join(present)}: data_oneof holds one of them")
    kind = present[0]
    value = _get(doc, kind)
    if kind == BIN_DATA:
        tensors = [_scalar("", "BYTES", _base64(value, BIN_DATA))]
    elif kind == STR_DATA:
        tensors = [_scalar("", "BYTES", _utf8(value, STR_DATA))]
    elif kind == GTENSORS:
        raw = _get(value, "tensors") if isinstance(value, dict) else None
        if not isinstance(raw, list) or not raw:
            raise invalid("gtensors must be an object with a non-empty list 'tensors'")
        tensors = [_gtensor_from_json(item, i) for i, item in enumerate(raw)]
    elif kind == NDARRAY:
        tensors = [Tensor("", "FP32", *_ndarray(value))]
    else:
        if not isinstance(value, dict):
            raise invalid("gmap must be an object of maps (s_s, s_b, s_i32, s_i64, s_f, s_d)")
        tensors = _gmap({field: _get(value, field) for field in MAP_TYPES}, from_json=True)
    return Payload(model or "", kind, tensors)


def payload_from_bytes(body: bytes | bytearray | memoryview) -> Payload:
    """An application/octet-stream request body: the whole body is bin_data."""
    if not body:
        raise invalid("the request body is empty: an application/octet-stream body is the bin_data")
    return Payload("", BIN_DATA, [_scalar("", "BYTES", bytes(body))])


def payload_from_message(message: pb.GrpsMessage) -> Payload:
    """The payload of a GrpsMessage from the gRPC door. betterproto2 parses leniently: a field whose wire
    type is not its own can come out as another type (an int in a list of messages), so a value of the
    wrong type is the message's fault, answered as malformed."""
    try:
        return _payload_from_message(message)
    except (TypeError, AttributeError, ValueError) as e:
        raise invalid(f"malformed GrpsMessage: {type(e).__name__}: {e}") from None


def _payload_from_message(message: pb.GrpsMessage) -> Payload:
    value: Any  # the member `kind` names (None only when kind is "", refused below)
    try:
        kind, value = betterproto2.which_one_of(message, "data_oneof")
    except RuntimeError:  # the wire held two members of the oneof: betterproto2 keeps both
        raise invalid(
            "the message sets more than one of data_oneof (bin_data, str_data, gtensors, gmap)"
        ) from None
    if not kind:
        raise invalid("the request carries no data: set one of bin_data, str_data, gtensors, gmap")
    if kind in (BIN_DATA, STR_DATA):
        tensors = [_scalar("", "BYTES", value if kind == BIN_DATA else value.encode())]
    elif kind == GTENSORS:
        if not value.tensors:
            raise invalid("gtensors holds no tensors")
        for i, t in enumerate(value.tensors):
            if t.dtype is None:  # a number the DataType enum does not have
                raise invalid(f"gtensor {i} ('{t.name}'): unknown dtype")
        tensors = [
            _gtensor(t.name, int(t.dtype), t.shape, {f: getattr(t, f) for f in FLAT_FIELDS}, f"gtensor {i}")
            for i, t in enumerate(value.tensors)
        ]
    elif kind == GMAP:
        tensors = _gmap({field: getattr(value, field) for field in MAP_TYPES}, from_json=False)
    else:
        raise invalid("ndarray carries its data only in HTTP JSON requests: send gtensors over gRPC")
    return Payload(message.model, kind, tensors)


def _get(doc: dict, field: str) -> Any:
    """A field by its proto name or its lowerCamelCase JSON name; null counts as absent."""
    value = doc.get(field)
    if value is None and field in _CAMEL:
        value = doc.get(_CAMEL[field])
    return value


def _scalar(name: str, datatype: str, value: Any) -> Tensor:
    array = np.empty((), dtype=BY_V2[datatype].numpy)
    array[()] = value
    return Tensor(name, datatype, (), array)


def _utf8(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string, got {describe(value)}")
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise invalid(f"{what} is not valid UTF-8 (a lone surrogate escape)") from None


def _base64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise invalid(f"{what} must be a base64 string, got {describe(value)}")
    return b64decode(
        value.replace("-", "+").replace("_", "/"), what
    )  # protobuf takes the URL-safe alphabet too


def _gtensor_from_json(raw: Any, index: int) -> Tensor:
    if not isinstance(raw, dict):
        raise invalid(f"gtensors.tensors[{index}] must be an object (a GenericTensor)")
    name = _get(raw, "name") or ""
    if not isinstance(name, str):
        raise invalid(f"gtensors.tensors[{index}]: 'name' must be a string")
    what = f"gtensor '{name}'" if name else f"gtensors.tensors[{index}]"
    dtype = _get(raw, "dtype")
    if dtype is None:
        dtype = 0
    elif isinstance(dtype, str):
        if dtype not in pb.DataType.__members__:
            raise invalid(f"{what}: unknown dtype {dtype!r} (expected one of {', '.join(BY_GRPS)})")
        dtype = pb.DataType[dtype].value
    elif type(dtype) is not int:
        raise invalid(f"{what}: 'dtype' must be a DataType name or number, got {describe(dtype)}")
    return _gtensor(name, dtype, _get(raw, "shape") or [], {f: _get(raw, f) for f in FLAT_FIELDS}, what)


def _gtensor(name: str, dtype: int, shape: Any, flats: dict[str, Any], what: str) -> Tensor:
    """A GenericTensor's fields -> a Tensor of the type its dtype names; DT_INVALID (unset) takes the
    dtype of the one flat_* field that holds values."""
    for field, values in flats.items():
        if values is not None and not isinstance(values, list):
            raise invalid(f"{what}: {field} must be a list")
    filled = [field for field, values in flats.items() if values]
    if dtype == 0:
        if len(filled) != 1:
            raise invalid(f"{what} has no dtype, and {len(filled)} flat_* fields holding values")
        dtype_name = FLAT_FIELDS[filled[0]]
    else:
        dtype_name = _DTYPE_NAMES.get(dtype, "")  # "" is no grps name either
        if dtype_name not in BY_GRPS:
            raise invalid(f"{what}: unknown dtype {dtype}")
        stray = [field for field in filled if field != flat_field(dtype_name)]
        if stray:
            raise invalid(f"{what} has dtype {dtype_name} but its values are in {', '.join(stray)}")
    datatype = BY_GRPS[dtype_name]
    values = flats[flat_field(dtype_name)] or []
    if datatype.v2 == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = [_utf8(v, what) for v in values]
    else:
        array = _numbers(values, datatype, what)
    dims = _shape(shape, what)
    if not dims:  # no shape: a flat vector of the values
        dims = (len(values),)
    needed = math.prod(dims)
    if needed != len(values):
        raise invalid(f"{what} holds {len(values)} values, its shape {list(dims)} needs {needed}")
    return Tensor(name, datatype.v2, dims, array.reshape(dims))


def _shape(raw: Any, what: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_DIMS:
        raise invalid(f"{what}: 'shape' must be a list of at most {MAX_DIMS} non-negative integers")
    for dim in raw:
        if type(dim) is not int or not 0 <= dim < 1 << 32:
            raise invalid(f"{what}: 'shape' must hold non-negative integers (uint32), got {raw!r}")
    return tuple(raw)


def _numbers(values: list, datatype: DataType, what: str) -> np.ndarray:
    """JSON or protobuf numbers -> an array of `datatype`, refusing values its type cannot hold."""
    target = datatype.numpy
    kinds = set(map(type, values))
    if target.kind == "f":
        if not kinds <= {int, float}:
            values = [_float(v, what) for v in values]
        return _floats(np.array(values, dtype=np.float64), datatype, what)
    if not kinds <= {int}:
        values = [_integer(v, what) for v in values]
    try:
        return np.array(values, dtype=target)
    except OverflowError:
        raise invalid(f"{what} holds values outside the range of {datatype.grps}") from None


def _floats(wide: np.ndarray, datatype: DataType, what: str) -> np.ndarray:
    """float64 values -> an array of the floating-point `datatype`, refusing values past its range."""
    if datatype.numpy.itemsize == 8:
        return wide
    narrow = narrowed(wide, datatype.numpy)
    if narrow is None:
        raise invalid(f"{what} holds values outside the range of {datatype.grps}")
    return narrow


def _integer(value: Any, what: str) -> int:
    if type(value) is int:
        return value
    if type(value) is str and _INTEGER.fullmatch(value):
        return int(value)
    if type(value) is float and value.is_integer():
        return int(value)
    raise invalid(f"{what}: expected integers, got {describe(value)}")


def _float(value: Any, what: str) -> float:
    if type(value) in (int, float):
        return float(value)
    if type(value) is str:
        if value in _NON_FINITE:
            return _NON_FINITE[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise invalid(f"{what}: expected numbers, got {describe(value)}")


def _ndarray(value: Any) -> tuple[tuple[int, ...], np.ndarray]:
    if not isinstance(value, list) or not value:
        raise invalid("ndarray must be a non-empty (nested) array of numbers")
    try:
        parsed = np.array(value)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.dtype.kind not in "iuf" or parsed.size == 0 or holds_booleans(value):
        raise invalid("ndarray must be a dense nested array of numbers, every row of the same length")
    if parsed.ndim > MAX_DIMS:
        raise invalid(f"ndarray is nested more than the {MAX_DIMS} dimensions allowed")
    return parsed.shape, _floats(parsed.astype(np.float64, copy=False), BY_V2["FP32"], "ndarray")


def _gmap(maps: dict[str, Any], from_json: bool) -> list[Tensor]:
    tensors: dict[str, Tensor] = {}
    for field, entries in maps.items():
        if not entries:
            continue
        if not isinstance(entries, dict):
            raise invalid(f"gmap.{field} must be an object of key: value")
        datatype = BY_V2[MAP_TYPES[field]]
        for key, value in entries.items():
            what = f"gmap.{field}['{key}']"
            if key in tensors:
                raise invalid(f"gmap key '{key}' is given twice")
            if field == "s_b":
                data = _base64(value, what) if from_json else value
            elif field == "s_s":
                data = _utf8(value, what)
            else:
                data = _numbers([value], datatype, what)[0]
            tensors[key] = _scalar(key, datatype.v2, data)
    if not tensors:
        raise invalid("gmap holds no values")
    return list(tensors.values())
