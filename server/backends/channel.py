"""What a python model's process and the server say to each other (server/backends/process.py is the
server's side, server/backends/stub.py the process's): messages in the framing of every link between the
server's processes (codec/framing.py), typed (codec/messages.py, the same kinds as the workers' link),
and tensors in a shared-memory Region (server/arena.py).

The Region is one memfd per instance that both sides map, with a bump allocator per batch
(`BatchArena`): the server writes a batch's inputs at its start, the process writes its outputs after
them, and each message names where. Either side grows it when a batch does not fit and says the new size
in its message; the other side maps it again. A tensor is a codec.messages.Tensor, as on the workers'
link: its v2 datatype, and its data `[0, offset, size]` in the Region or the bytes themselves when the
tensor travels in the message (a small batch's tensors both ways, a streamed answer, a BLS call's
tensors). BYTES are Triton's serialized form (each element a 4-byte length
and its bytes, codec/bytes_tensor.py). An EXECUTE whose end offset is -1 is a small batch: its outputs
are answered in the message too.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import msgspec
import numpy as np

from tensorgate.codec import messages as msg
from tensorgate.codec.bytes_tensor import decode_bytes, encode_bytes
from tensorgate.codec.datatypes import BY_NUMPY, BY_V2
from tensorgate.server.arena import Region, aligned

BYTES = "BYTES"
EMPTY = "empty"  # a Triton model's stream End payload: its FINAL flag came alone (an empty response)


# The kinds only this link has, beside codec/messages.py's (tags far above theirs).
class Dropped(msgspec.Struct, tag=100, array_like=True):
    """Server -> process: request `index` of batch `call` lost its client (request.is_cancelled())."""

    call: int
    index: int


class Control(msgspec.Struct, tag=101, array_like=True):
    """Process -> server: pb_utils.load_model ("load"), unload_model ("unload") or is_model_ready
    ("ready"), with its arguments; answered by Controlled."""

    call: int
    operation: str
    arguments: dict[str, Any]


class Controlled(msgspec.Struct, tag=102, array_like=True):
    """Server -> process: a Control's result, or (error not None) the server's error text."""

    call: int
    result: Any
    error: str | None


TO_MODEL = msg.TO_MODEL | Dropped | Controlled
FROM_MODEL = msg.FROM_MODEL | Control


def datatype_of(name: str, array: np.ndarray) -> str:
    """The v2 datatype of an array a model gave (str and bytes elements: BYTES)."""
    if array.dtype.kind == "O":
        return BYTES
    found = BY_NUMPY.get(array.dtype.newbyteorder("="))
    if found is None:
        raise TypeError(f"tensor '{name}' is {array.dtype}, which no tensor datatype holds")
    return found.v2


class Rows:
    """One input of a batch, not yet gathered: its requests' arrays in order (a process model's staging,
    server/backends/process.py). BatchArena.write copies them side by side into the Region, so the batch
    is gathered there in one copy; `array()` gathers them here (a small batch, carried in the message)."""

    __slots__ = ("parts", "dtype", "shape", "nbytes")

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts
        self.dtype = parts[0].dtype
        self.shape = (sum(part.shape[0] for part in parts), *parts[0].shape[1:])
        self.nbytes = sum(part.nbytes for part in parts)

    def array(self) -> np.ndarray:
        return np.concatenate(self.parts)


def rows(parts: list[np.ndarray]) -> np.ndarray | Rows:
    """The parts of one input as the batch a process model's instance gets: Rows where they can be copied
    side by side (one numeric dtype, at least one dimension), else gathered now."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if first.dtype.kind == "O" or first.ndim == 0 or any(part.dtype != first.dtype for part in parts):
        return np.concatenate(parts)
    return Rows(parts)


LENT_MAX = 256 << 20  # past this end in the Region, a batch's outputs are copied out, not lent as views


class BatchArena(Region):
    """The instance's Region, allocated one batch at a time: from its start, or (while the server still
    has views of earlier outputs, `lend`) from after them, so that nothing is written under a view. Once
    every lent view is gone, batches start at the beginning again."""

    def __init__(self, size: int, fd: int | None = None, name: str = "tensorgate") -> None:
        super().__init__(size, fd, name)
        self.start = 0  # where the next batch's inputs go: the end of the outputs still lent, or 0
        self.lent = 0  # output arrays lent out and not yet collected
        self._counting = threading.RLock()  # the last view of an output may go in any thread, or in lend

    def write(self, tensors: dict[str, np.ndarray | Rows], offset: int) -> tuple[list[msg.Tensor], int]:
        """Writes the arrays (a batch's Rows gathered as they are written) from `offset` on; their
        descriptors and the offset after them."""
        encoded = {}
        need = offset
        for name, array in tensors.items():
            if array.dtype.kind == "O":  # never Rows (`rows` gathers BYTES)
                encoded[name] = data = encode_bytes(array)  # type: ignore[arg-type]
                need += aligned(len(data))
            else:
                need += aligned(array.nbytes)
        self.reserve(need)
        descriptors = []
        for name, array in tensors.items():
            data = encoded.get(name)
            parts = array.parts if type(array) is Rows else [array]
            datatype = datatype_of(name, parts[0])
            if data is not None:
                size = len(data)
                self.map[offset : offset + size] = data
            else:
                size = array.nbytes
                target = BY_V2[datatype].numpy
                at = offset
                for part in parts:  # a batch's rows land side by side: gathered here, in one copy
                    np.ndarray(part.shape, target, buffer=self.map, offset=at)[...] = part
                    at += part.nbytes
            descriptors.append(msg.Tensor(name, datatype, list(array.shape), [0, offset, size]))
            offset += aligned(size)
        return descriptors, offset

    def read(self, tensor: msg.Tensor, copy: bool) -> np.ndarray:
        """The array a tensor names: a view of the Region, or a copy of it (`copy`); or the array of a
        tensor that travelled in the message."""
        name, datatype, shape, data = tensor.name, tensor.datatype, tensor.shape, tensor.data
        if type(data) is not list:
            return inline_array(tensor)
        _, offset, size = data
        if datatype == BYTES:
            return decode_bytes(memoryview(self.map)[offset : offset + size], math.prod(shape), name).reshape(
                shape
            )
        array = np.ndarray(shape, BY_V2[datatype].numpy, buffer=self.map, offset=offset)
        return array.copy() if copy else array

    def lend(self, tensors: list[msg.Tensor]) -> dict[str, np.ndarray]:
        """A batch's outputs, as views of the Region where they lie in it (each keeps its span from being
        written again while it, or any view of it, lives), else as arrays of their own: those carried in
        the message, BYTES, and (past LENT_MAX, so that the Region stays bounded while views are always
        alive) copies."""
        ends = [data[1] + data[2] for t in tensors if type(data := t.data) is list and t.datatype != BYTES]
        if not ends or max(ends) > LENT_MAX:
            return {t.name: self.read(t, copy=True) for t in tensors}
        arrays = {}
        with self._counting:
            for tensor in tensors:
                array = arrays[tensor.name] = self.read(tensor, copy=False)
                if type(tensor.data) is list and tensor.datatype != BYTES:  # a view of the Region
                    self.lent += 1
                    weakref.finalize(array, self._returned).atexit = False
            self.start = max(self.start, aligned(max(ends)))
        return arrays

    def _returned(self) -> None:
        with self._counting:
            self.lent -= 1
            if self.lent == 0:
                self.start = 0


def inline(name: str, array: np.ndarray | Rows) -> msg.Tensor:
    """A tensor carried in the message itself."""
    if type(array) is Rows:
        array = array.array()
    if array.dtype.kind == "O":
        return msg.Tensor(name, BYTES, list(array.shape), encode_bytes(array))
    datatype = datatype_of(name, array)
    data = array.astype(BY_V2[datatype].numpy, copy=False).tobytes()  # C order, whatever its strides
    return msg.Tensor(name, datatype, list(array.shape), data)


def inline_all(tensors: dict[str, np.ndarray | Rows]) -> list[msg.Tensor]:
    return [inline(name, array) for name, array in tensors.items()]


def inline_array(tensor: msg.Tensor) -> np.ndarray:
    name, datatype, shape, data = tensor.name, tensor.datatype, tensor.shape, tensor.data
    if datatype == BYTES:
        return decode_bytes(memoryview(data), math.prod(shape), name).reshape(shape)
    return np.frombuffer(data, BY_V2[datatype].numpy).reshape(shape).copy()  # writable, as a model may expect


def as_array(value: Any) -> np.ndarray:
    """What a model returned as an output, as an array (str elements become BYTES)."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.kind in "US":
        array = array.astype(object)
    return array


def answered(response: Any) -> msg.Answered:
    """A Triton response (pb_utils.InferenceResponse) as it crosses: its outputs in the message, or its
    error's code and message."""
    error = response.error()
    if error is not None:
        return msg.Answered(None, error.code(), error.message())
    return msg.Answered([inline(t.name(), t.as_numpy()) for t in response.output_tensors()])
