"""The messages between the server's processes, sans-IO: their kinds (one table for both links: a
front-end worker and its engine, server/frontend.py and engine.py; the server and a python model's
process, server/backends/channel.py), and the requests and answers a worker and its engine exchange.

A message is a MessagePack array in the framing of codec/framing.py. Its first element says what it is
(the kinds below) and its second which call it belongs to. An InferRequest or InferResponse travels as
nested arrays; each tensor as [name, datatype, shape, data, parameters] (a model's process uses the first
four: server/backends/channel.py), its datatype the v2 name, its data the v2 binary layout (BYTES
length-prefixed, anything else C-order little-endian), or a descriptor [arena, offset, length] of those
bytes in the shared memory between the two processes (server/arena.py: large tensors, given `arenas`),
or None for a tensor in a client's shared-memory region (the engine reads and writes those). Decoded
numeric data is a numpy array over the arena, or over a copy of the message's bytes (msgpack's binary
decodes to read-only bytes; models may write their inputs, while an answer is only read)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from codec.bytes_tensor import decode_bytes
from codec.datatypes import BY_V2
from codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor, tensor_bytes

# What a message is (its first element), on both links between the server's processes: a front-end
# worker and its engine, and the server and a python model's process (server/backends/channel.py). A kind
# means the same on both.
INFER, STREAM, HTTP, GRPC = 1, 2, 3, 4  # worker -> engine: a call starts (STREAM: to a model's process too)
CALL = 5  # a model's process -> the server: a BLS request
MESSAGE, END, CANCEL = 6, 7, 8  # either way, within a call: a piece of a stream, its end, a cancel
RESULT, ERROR, EVENT = 9, 10, 11  # a call's answer, its error; engine -> worker: news for every worker
MORE = 12  # a stream's reader took messages ([MORE, call, count]): the sender may send AHEAD beyond those
RELEASE = 13  # either way: every view of a region of the receiver's arena is gone ([RELEASE, 0, offset])
# Only between the server and a python model's process:
LOAD, READY, FAILED = 14, 15, 16  # server -> process: the model to load; the answer: loaded, or why not
EXECUTE = 17  # server -> process: a batch; answered by RESULT (its answers) or ERROR (it raised)
LOG = 18  # process -> server: a line for the server's log (pb_utils.Logger)
REPLY = 19  # server -> process: a BLS call's answer
STOP = 20  # server -> process: finalize and exit
COMPLETE = 21  # server -> process: auto_complete_config, answered by READY with the completed config
METRIC = 22  # process -> server: a value for grps's app_monitor [METRIC, 0, name, aggregation, value]
AHEAD = 8


class Arenas(Protocol):
    """Shared memory for large tensors (server/arena.LinkArenas)."""

    def place(self, data: Any) -> list | None:
        """A descriptor for these bytes (put in shared memory if they are not there yet), or None: inline."""

    def take(self, descriptor: list) -> np.ndarray:
        """The bytes a descriptor names, as a uint8 array."""


# ------------------------------------------------------------------------------------------ tensors


def tensor_out(tensor: Tensor, arenas: Arenas | None = None) -> list:
    data: Any = None if tensor.data is None else tensor_bytes(tensor)
    if data is not None and arenas is not None:
        data = arenas.place(data) or data
    return [tensor.name, tensor.datatype, tensor.shape, data, tensor.parameters or None]


def tensor_in(item: list, arenas: Arenas | None = None, writable: bool = True) -> Tensor:
    """`writable`: a model's input, which it may write as one received in one process (or hand on); an
    answer's outputs are only encoded, so they stay over the message's bytes."""
    name, datatype, shape, data, parameters = item
    shape = tuple(shape)
    if data is not None:
        if type(data) is list:  # in shared memory
            data = arenas.take(data)  # type: ignore[union-attr]
        elif writable and datatype != "BYTES":
            data = bytearray(data)
        if datatype == "BYTES":
            data = decode_bytes(memoryview(data), math.prod(shape), f"tensor '{name}'").reshape(shape)
        else:
            data = np.frombuffer(data, BY_V2[datatype].numpy).reshape(shape)
    return Tensor(name, datatype, shape, data, parameters or {})


# ------------------------------------------------------------------------------------------ requests


def request_out(request: InferRequest, arenas: Arenas | None = None) -> list:
    outputs = request.outputs
    return [
        request.model_name,
        request.model_version,
        request.id,
        request.parameters or None,
        [tensor_out(t, arenas) for t in request.inputs],
        None
        if outputs is None
        else [[o.name, o.binary, o.parameters or None, o.class_count] for o in outputs],
        request.binary_output,
        request.shared_memory,
        request.sequence_id,
        request.sequence_flags,
    ]


def request_in(item: list, arenas: Arenas | None = None) -> InferRequest:
    (
        name,
        version,
        request_id,
        parameters,
        inputs,
        outputs,
        binary_output,
        shared_memory,
        sequence_id,
        flags,
    ) = item
    return InferRequest(
        name,
        version,
        request_id,
        [tensor_in(t, arenas) for t in inputs],
        None if outputs is None else [RequestedOutput(n, b, p or {}, c) for n, b, p, c in outputs],
        parameters or {},
        binary_output,
        shared_memory,
        sequence_id=sequence_id,
        sequence_flags=flags,
    )


def response_out(response: InferResponse, arenas: Arenas | None = None) -> list:
    return [
        response.model_name,
        response.model_version,
        response.id,
        response.parameters or None,
        [tensor_out(t, arenas) for t in response.outputs],
    ]


def response_in(item: list, arenas: Arenas | None = None) -> InferResponse:
    name, version, response_id, parameters, outputs = item
    outputs = [tensor_in(t, arenas, False) for t in outputs]
    return InferResponse(name, version, outputs, response_id, parameters or {})
