"""grps answers: InferResponse -> Answer -> JSON or GrpsMessage, each with its `status`. Sans-IO.

An answer takes the request's form when the model's outputs fit it, else gtensors:
- str_data / bin_data: the model answers one BYTES output holding one element.
- gmap: every output holds one element (BYTES -> s_s, or s_b when not UTF-8; integers up to 32 bits
  -> s_i32, wider -> s_i64; FP64 -> s_d; other floats -> s_f).
- return-ndarray (HTTP): the model answers one floating-point output, written as a nested array.
- gtensors otherwise: every output by name, in the grps dtype that carries its datatype.
JSON is written as protobuf JSON with the proto field names (as grps writes it): int64 values as strings,
non-finite floats as "NaN", "Infinity", "-Infinity", bytes as base64.
"""

import base64
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

import tensorgate.proto.grps.protos.v1 as pb
from tensorgate.codec.datatypes import BY_GRPS, BY_V2, bf16_to_float32
from tensorgate.codec.errors import ErrorKind, InferError, http_status, invalid
from tensorgate.codec.grps import BIN_DATA, FLOATS, GMAP, GTENSORS, NDARRAY, STR_DATA, flat_field
from tensorgate.codec.tensor import InferResponse, Tensor

OK = 200
_MAP_FIELDS = {"DT_UINT8": "s_i32", "DT_INT8": "s_i32", "DT_INT16": "s_i32", "DT_INT32": "s_i32"}
_MAP_FIELDS |= {"DT_INT64": "s_i64", "DT_FLOAT16": "s_f", "DT_FLOAT32": "s_f", "DT_FLOAT64": "s_d"}
_INT64_MAX = np.iinfo(np.int64).max


def status_code(error: InferError) -> int:
    """grps answers with HTTP status codes in `status.code` (REST mirrors it as the HTTP status)."""
    return http_status(error)


@dataclass(slots=True)
class GTensor:
    """One GenericTensor of an answer: `values` already in the type of its flat_* field (a flat numpy
    array; a list of str for DT_STRING)."""

    name: str
    dtype: str  # grps DataType name
    shape: tuple[int, ...]
    values: Any


@dataclass(slots=True)
class Answer:
    """What a successful response carries: bin_data bytes, str_data str, ndarray a float array,
    gtensors a list of GTensor, gmap {map field: {key: value}}."""

    kind: str
    data: Any


def to_answer(response: InferResponse, kind: str, return_ndarray: bool = False) -> Answer:
    outputs = response.outputs
    what = f"model '{response.model_name}'"
    if return_ndarray:
        if len(outputs) != 1 or outputs[0].datatype not in FLOATS:
            described = ", ".join(f"{t.name} ({t.datatype})" for t in outputs)
            raise invalid(f"return-ndarray needs one floating-point output; {what} answers {described}")
        return Answer(NDARRAY, _carried(outputs[0], what).reshape(outputs[0].shape))
    single = all(np.size(t.data) == 1 for t in outputs)
    if kind in (STR_DATA, BIN_DATA) and len(outputs) == 1 and outputs[0].datatype == "BYTES" and single:
        element = _as_bytes(np.asarray(outputs[0].data).reshape(-1)[0])
        if kind == BIN_DATA:
            return Answer(BIN_DATA, element)
        return Answer(STR_DATA, _text(element, f"{what}, output '{outputs[0].name}'", "str_data"))
    if kind == GMAP and single:
        maps: dict[str, dict[str, Any]] = {}
        for tensor in outputs:
            value = _carried(tensor, f"{what}, output '{tensor.name}'", strings=False).reshape(-1)[0]
            if tensor.datatype == "BYTES":
                element = _as_bytes(value)
                try:
                    maps.setdefault("s_s", {})[tensor.name] = element.decode()
                except UnicodeDecodeError:
                    maps.setdefault("s_b", {})[tensor.name] = element
            else:
                maps.setdefault(_MAP_FIELDS[BY_V2[tensor.datatype].grps], {})[tensor.name] = value.item()
        return Answer(GMAP, maps)
    gtensors = [
        GTensor(t.name, BY_V2[t.datatype].grps, tuple(t.shape), _carried(t, f"{what}, output '{t.name}'"))
        for t in outputs
    ]
    return Answer(GTENSORS, gtensors)


def _carried(tensor: Tensor, what: str, strings: bool = True) -> Any:
    """The tensor's values, flat, in the type of the grps dtype that carries it (a list of str for
    BYTES when `strings`)."""
    datatype = BY_V2[tensor.datatype]
    data = np.asarray(tensor.data).reshape(-1)
    if datatype.v2 == "BYTES":
        if not strings:
            return data
        return [_text(_as_bytes(e), what, "flat_string") for e in data]
    if datatype.v2 == "BF16":
        return bf16_to_float32(data)
    if datatype.v2 == "UINT64" and data.size and int(data.max()) > _INT64_MAX:
        raise InferError(ErrorKind.INTERNAL, f"{what} holds UINT64 values past DT_INT64, which carries them")
    carrier = np.float32 if datatype.grps == "DT_FLOAT16" else BY_GRPS[datatype.grps].numpy
    return data.astype(carrier, copy=False)


def _as_bytes(element: Any) -> bytes:
    if isinstance(element, bytes):
        return element
    if isinstance(element, (bytearray, memoryview, np.bytes_)):
        return bytes(element)
    return str(element).encode()


def _text(element: bytes, what: str, field: str) -> str:
    try:
        return element.decode()
    except UnicodeDecodeError:
        raise InferError(
            ErrorKind.INTERNAL,
            f"{what} holds bytes that are not UTF-8, which {field} cannot carry: "
            "send the request as bin_data (application/octet-stream) to receive bytes",
        ) from None


# ------------------------------------------------------------------------------------------ encoding


def status_json(code: int, msg: str) -> bytes:
    """A GrpsMessage holding only a status, as JSON."""
    return orjson.dumps({"status": _status_doc(code, msg)})


def error_json(error: InferError) -> bytes:
    return status_json(status_code(error), error.message)


def answer_json(answer: Answer) -> bytes:
    doc: dict[str, Any] = {"status": _status_doc(OK, "OK")}
    if answer.kind == GTENSORS:
        doc[GTENSORS] = {"tensors": [_gtensor_doc(t) for t in answer.data]}
    elif answer.kind == GMAP:
        doc[GMAP] = {field: _map_doc(field, entries) for field, entries in answer.data.items()}
    elif answer.kind == NDARRAY:
        doc[NDARRAY] = _floats_json(answer.data)
    elif answer.kind == BIN_DATA:
        doc[BIN_DATA] = base64.b64encode(answer.data).decode()
    else:
        doc[STR_DATA] = answer.data
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _status_doc(code: int, msg: str) -> dict[str, Any]:
    return {"code": code, "msg": msg, "status": "SUCCESS" if code == OK else "FAILURE"}


def _gtensor_doc(tensor: GTensor) -> dict[str, Any]:
    values = tensor.values
    if tensor.dtype == "DT_INT64":
        values = [str(v) for v in values.tolist()]  # protobuf JSON writes int64 as strings
    elif tensor.dtype.startswith("DT_FLOAT"):
        values = _floats_json(values)
    return {
        "name": tensor.name,
        "dtype": tensor.dtype,
        "shape": list(tensor.shape),
        flat_field(tensor.dtype): values,
    }


def _map_doc(field: str, entries: dict[str, Any]) -> dict[str, Any]:
    if field == "s_b":
        return {k: base64.b64encode(v).decode() for k, v in entries.items()}
    if field == "s_i64":
        return {k: str(v) for k, v in entries.items()}
    if field in ("s_f", "s_d"):
        return {k: _float_json(v) for k, v in entries.items()}
    return entries


def _float_json(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _floats_json(array: np.ndarray) -> Any:
    """A float array as JSON: the array itself (orjson writes it), or nested lists where some values
    are not finite, those written as protobuf JSON writes them."""
    if array.ndim and np.isfinite(array).all():
        return np.ascontiguousarray(array)
    return _map_nested(array.tolist())


def _map_nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_map_nested(v) for v in value]
    return _float_json(value)


def status_message(code: int, msg: str, **data: Any) -> pb.GrpsMessage:
    flag = pb.StatusStatusFlag.SUCCESS if code == OK else pb.StatusStatusFlag.FAILURE
    return pb.GrpsMessage(status=pb.Status(code=code, msg=msg, status=flag), **data)


def error_message(error: InferError) -> pb.GrpsMessage:
    return status_message(status_code(error), error.message)


def answer_message(answer: Answer) -> pb.GrpsMessage:
    if answer.kind == GTENSORS:
        tensors = [
            pb.GenericTensor(
                name=t.name,
                dtype=pb.DataType[t.dtype],
                shape=list(t.shape),
                **{flat_field(t.dtype): t.values if isinstance(t.values, list) else t.values.tolist()},
            )
            for t in answer.data
        ]
        return status_message(OK, "OK", gtensors=pb.GenericTensorData(tensors=tensors))
    if answer.kind == GMAP:
        return status_message(OK, "OK", gmap=pb.GenericMapData(**answer.data))
    if answer.kind == NDARRAY:
        raise InferError(ErrorKind.INTERNAL, "ndarray answers exist only in HTTP JSON")
    return status_message(OK, "OK", **{answer.kind: answer.data})
