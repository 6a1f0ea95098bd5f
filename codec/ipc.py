"""Requests and answers as a front-end worker and its engine send them (codec/messages.py: Request,
Response, Tensor), sans-IO.

Each tensor's data is the v2 binary layout (BYTES length-prefixed, anything else C-order little-endian),
or a descriptor [arena, offset, length] of those bytes in the shared memory between the two processes
(server/arena.py: large tensors, given `arenas`), or None for a tensor in a client's shared-memory region
(the engine reads and writes those). Decoded numeric data is a numpy array over the arena, or over a copy
of the message's bytes (msgpack's binary decodes to read-only bytes; models may write their inputs, while
an answer is only read)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from tensorgate.codec import messages
from tensorgate.codec.bytes_tensor import decode_bytes
from tensorgate.codec.datatypes import BY_V2
from tensorgate.codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor, tensor_bytes


class Arenas(Protocol):
    """Shared memory for large tensors (server/arena.LinkArenas)."""

    def place(self, data: Any) -> list | None:
        """A descriptor for these bytes (put in shared memory if they are not there yet), or None: inline."""

    def take(self, descriptor: list) -> np.ndarray:
        """The bytes a descriptor names, as a uint8 array."""


# ------------------------------------------------------------------------------------------ tensors


def tensor_out(tensor: Tensor, arenas: Arenas | None = None) -> messages.Tensor:
    data: Any = None if tensor.data is None else tensor_bytes(tensor)
    if data is not None and arenas is not None:
        data = arenas.place(data) or data
    return messages.Tensor(tensor.name, tensor.datatype, tensor.shape, data, tensor.parameters or None)  # type: ignore[arg-type]


def tensor_in(item: messages.Tensor, arenas: Arenas | None = None, writable: bool = True) -> Tensor:
    """`writable`: a model's input, which it may write as one received in one process (or hand on); an
    answer's outputs are only encoded, so they stay over the message's bytes."""
    datatype = item.datatype
    data: Any = item.data
    shape = tuple(item.shape)
    if data is not None:
        if type(data) is list:  # in shared memory
            data = arenas.take(data)  # type: ignore[union-attr]
        elif writable and datatype != "BYTES":
            data = bytearray(data)
        if datatype == "BYTES":
            data = decode_bytes(memoryview(data), math.prod(shape), f"tensor '{item.name}'").reshape(shape)
        else:  # ndarray's positional form: half the cost of frombuffer + reshape
            array = np.ndarray(shape, BY_V2[datatype].numpy, data)
            if array.nbytes != len(data):
                raise ValueError(f"tensor '{item.name}': {len(data)} bytes for {array.nbytes} of {datatype}")
            data = array
    return Tensor(item.name, datatype, shape, data, item.parameters or {})


# ------------------------------------------------------------------------------------------ requests


def request_out(request: InferRequest, arenas: Arenas | None = None) -> messages.Request:
    outputs = request.outputs
    return messages.Request(
        request.model_name,
        request.model_version,
        request.id,
        request.parameters or None,
        [tensor_out(t, arenas) for t in request.inputs],
        None
        if outputs is None
        else [messages.Output(o.name, o.binary, o.parameters or None, o.class_count) for o in outputs],
        request.binary_output,
        request.shared_memory,
        request.sequence_id,
        request.sequence_flags,
    )


def request_in(item: messages.Request, arenas: Arenas | None = None) -> InferRequest:
    outputs = item.outputs
    return InferRequest(
        item.model_name,
        item.model_version,
        item.id,
        [tensor_in(t, arenas) for t in item.inputs],
        None
        if outputs is None
        else [RequestedOutput(o.name, o.binary, o.parameters or {}, o.class_count) for o in outputs],
        item.parameters or {},
        item.binary_output,
        item.shared_memory,
        sequence_id=item.sequence_id,
        sequence_flags=item.sequence_flags,
    )


def response_out(response: InferResponse, arenas: Arenas | None = None) -> messages.Response:
    return messages.Response(
        response.model_name,
        response.model_version,
        response.id,
        response.parameters or None,
        [tensor_out(t, arenas) for t in response.outputs],
    )


def response_in(item: messages.Response, arenas: Arenas | None = None) -> InferResponse:
    outputs = [tensor_in(t, arenas, False) for t in item.outputs]
    return InferResponse(item.model_name, item.model_version, outputs, item.id, item.parameters or {})
