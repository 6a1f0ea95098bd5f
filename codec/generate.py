"""Triton's generate extension (sans-IO): the generate request's JSON mapped to an InferRequest, and each
InferResponse to its JSON answer, as Triton's HTTP front end maps them (src/http_server.cc).

Request: every top-level key names a model input (its value a scalar or a flat list, shaped by the
input's dims: fixed dims divide the count of values, the innermost variable dim takes what remains, the
other variable dims are 1), or else is a request parameter (a string, number or boolean). `parameters`
is an object whose keys are mapped the same way. `id`, a string, is the request's id (and, as in Triton,
a parameter too when no input is named `id`).

The body is read as Triton's parser (RapidJSON) reads it: a key written twice is kept twice and read as
its first value, so an input named twice is refused as Triton's core refuses it ('input ... already
exists in request'), a parameter named twice keeps its first value. What the inputs expand to, in tensor
bytes, is bounded as Triton bounds it (--http-max-input-size).

Answer: `id` (when the request had one), `model_name`, `model_version`, each output by name (one element
as a bare value, more as a flat list; BYTES as strings) and the response's parameters. A streamed answer
is a Server-Sent Event, `data: <JSON>` and a blank line, and so is an error after the first answer:
`data: {"error": "..."}`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tensorgate.codec import json_text
from tensorgate.codec.datatypes import BY_V2
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.tensor import InferRequest, InferResponse, Tensor
from tensorgate.codec.v2_http import (
    MAX_INPUT_SIZE,
    RAISE_IT,
    check_json_size,
    json_tensor,
    loads,
    output_json,
)

JSON_CONTENT_TYPE = b"application/json"
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
PARAMETERS = "parameters"

# input name -> (v2 datatype, the shape a client sees: -1 for the batch dim and variable dims)
InputSpecs = dict[str, tuple[str, tuple[int, ...]]]


class JsonObject(dict):
    """A JSON object as RapidJSON keeps it: `written`, its keys in order, repeats included; each key
    reads as its first value (RapidJSON finds the first member of a name)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.written = [key for key, _ in pairs]
        for key, value in pairs:
            self.setdefault(key, value)


def decode_generate(
    body: bytes | memoryview,
    model_name: str,
    model_version: str,
    inputs: InputSpecs,
    max_input_size: int = MAX_INPUT_SIZE,
) -> InferRequest:
    what = f"the generate request for model '{model_name}'"
    check_json_size(len(body), max_input_size)
    doc = _document(body, what) if len(body) else JsonObject([])
    if not isinstance(doc, JsonObject):
        raise invalid(f"{what} must be a JSON object")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InferError(
            ErrorKind.INTERNAL, "Unable to parse 'id': attempt to access JSON non-string as string"
        )
    request = InferRequest(model_name, model_version, request_id)
    _map(doc, inputs, request, max_input_size, nested=False)
    return request


def _document(body: bytes | memoryview, what: str) -> Any:
    loads(body, what)  # refuses what is not JSON, in the words of the v2 JSON path
    return json.loads(bytes(body), object_pairs_hook=JsonObject)


def _map(
    doc: JsonObject, inputs: InputSpecs, request: InferRequest, max_input_size: int, nested: bool
) -> None:
    consumed = 0  # tensor bytes of this object's inputs so far (Triton counts each object apart)
    for key in doc.written:
        value = doc[key]
        if key == PARAMETERS and not nested:
            if key in inputs:
                raise invalid(f"Keyword '{key}' for nested schema also given as input tensor name")
            if not isinstance(value, JsonObject):
                raise InferError(
                    ErrorKind.INTERNAL,
                    f"Expected JSON object for keyword: '{key}': attempt to access JSON non-object as object",
                )
            try:
                _map(value, inputs, request, max_input_size, nested=True)
            except InferError as e:
                raise InferError(e.kind, f"Converting keyword: '{key}': {e.message}") from None
        elif key in inputs:
            if any(tensor.name == key for tensor in request.inputs):
                raise invalid(
                    f"[request id: {request.id or '<id_unknown>'}] input '{key}' already exists in request"
                )
            datatype, dims = inputs[key]
            consumed += _check_size(key, value, datatype, consumed, max_input_size)
            request.inputs.append(_tensor(key, value, datatype, dims, request.model_name, max_input_size))
        else:
            if isinstance(value, list | dict) or value is None:
                raise invalid(
                    f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                )
            request.parameters[key] = value


def _check_size(name: str, value: Any, datatype: str, consumed: int, max_input_size: int) -> int:
    """The input's size in tensor bytes (a BYTES element: its length, then its bytes), refused as Triton
    refuses it when the object's inputs would pass the limit."""
    values = value if isinstance(value, list) else [value]
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise InferError(
                ErrorKind.INTERNAL,
                "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
            )
        size = sum(len(v.encode()) + 4 for v in values)
    else:
        size = len(values) * BY_V2[datatype].size
    if size and consumed + size > max_input_size:
        raise invalid(
            f"request size of {consumed} bytes with input '{name}' of size {size} bytes exceeds the maximum "
            f"allowed input size of {max_input_size}. {RAISE_IT}"
        )
    return size


def _tensor(
    name: str, value: Any, datatype: str, dims: tuple[int, ...], model: str, max_input_size: int
) -> Tensor:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, list | dict) for v in values):
        raise invalid(f"model '{model}', input '{name}': a generate request gives a value or a flat list")
    shape = _shape(name, len(values), dims)
    return json_tensor(
        {"name": name, "datatype": datatype, "shape": shape, "data": values}, model, max_input_size
    )


def _shape(name: str, count: int, dims: tuple[int, ...]) -> list[int]:
    """Triton's two passes: fixed dims divide the count, the innermost variable dim takes the rest."""
    shape = list(dims)
    for dim in reversed(shape):
        if dim != -1:
            if dim == 0 or count % dim:
                raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
            count //= dim
    for index in reversed(range(len(shape))):
        if shape[index] == -1:
            shape[index], count = count, 1
    if count != 1:
        raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


def generate_json(response: InferResponse) -> bytes:
    """One answer's JSON."""
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    for tensor in response.outputs:
        doc[tensor.name] = _value(tensor, response.model_name)
    for key, value in response.parameters.items():
        doc.setdefault(key, value)
    return json_text.dumps(doc)


def _value(tensor: Tensor, model: str) -> Any:
    data = output_json(tensor, model)
    if isinstance(data, np.ndarray):
        if json_text.non_finite(data):
            return json_text.with_tokens(data[0] if data.size == 1 else data)
        return data[0].item() if data.size == 1 else data
    return data[0] if len(data) == 1 else data


def sse(answer: bytes) -> bytes:
    return b"data: " + answer + b"\n\n"


def sse_error(error: InferError) -> bytes:
    return sse(json_text.dumps({"error": error.message}))
