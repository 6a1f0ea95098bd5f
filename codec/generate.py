"""Triton's generate extension (sans-IO): the generate request's JSON mapped to an InferRequest, and each
InferResponse to its JSON answer, as Triton's HTTP front end maps them (src/http_server.cc).

Request: every top-level key names a model input (its value a scalar or a flat list, shaped by the
input's dims: fixed dims divide the count of values, the innermost variable dim takes what remains, the
other variable dims are 1), or else is a request parameter (a string, number or boolean). `parameters`
is an object whose keys are mapped the same way. `id`, a string, is the request's id (and, as in Triton,
a parameter too when no input is named `id`).

Answer: `id` (when the request had one), `model_name`, `model_version`, each output by name (one element
as a bare value, more as a flat list; BYTES as strings) and the response's parameters. A streamed answer
is a Server-Sent Event, `data: <JSON>` and a blank line, and so is an error after the first answer:
`data: {"error": "..."}`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorgate.codec import json_text
from tensorgate.codec.errors import InferError, invalid
from tensorgate.codec.tensor import InferRequest, InferResponse, Tensor
from tensorgate.codec.v2_http import json_tensor, loads, output_json

JSON_CONTENT_TYPE = b"application/json"
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
PARAMETERS = "parameters"

# input name -> (v2 datatype, the shape a client sees: -1 for the batch dim and variable dims)
InputSpecs = dict[str, tuple[str, tuple[int, ...]]]


def decode_generate(
    body: bytes | memoryview, model_name: str, model_version: str, inputs: InputSpecs
) -> InferRequest:
    what = f"the generate request for model '{model_name}'"
    doc = loads(body, what) if len(body) else {}
    if not isinstance(doc, dict):
        raise invalid(f"{what} must be a JSON object")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise invalid("Unable to parse 'id'")
    request = InferRequest(model_name, model_version, request_id)
    _map(doc, inputs, request, model_name, nested=False)
    return request


def _map(doc: dict, inputs: InputSpecs, request: InferRequest, model: str, nested: bool) -> None:
    for key, value in doc.items():
        if key == PARAMETERS and not nested:
            if key in inputs:
                raise invalid(f"Keyword '{key}' for nested schema also given as input tensor name")
            if not isinstance(value, dict):
                raise invalid(f"Expected JSON object for keyword: '{key}'")
            _map(value, inputs, request, model, nested=True)
        elif key in inputs:
            request.inputs.append(_tensor(key, value, *inputs[key], model))
        else:
            if isinstance(value, list | dict) or value is None:
                raise invalid(
                    f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                )
            request.parameters[key] = value


def _tensor(name: str, value: Any, datatype: str, dims: tuple[int, ...], model: str) -> Tensor:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, list | dict) for v in values):
        raise invalid(f"model '{model}', input '{name}': a generate request gives a value or a flat list")
    shape = _shape(name, len(values), dims)
    return json_tensor({"name": name, "datatype": datatype, "shape": shape, "data": values}, model)


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
