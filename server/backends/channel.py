"""What a python model's process and the server say to each other (server/backends/process.py is the
server's side, server/backends/stub.py the process's): MessagePack messages (msgspec, as codec/ipc.py) over
a Unix socket, each framed by its 4-byte little-endian length, and tensors in a shared-memory arena.

The arena is one memfd per instance that both sides map: the server writes a batch's inputs at its start,
the process writes its outputs after them, and each message names where (a tensor descriptor). Either
side grows it (ftruncate) when a batch does not fit and says the new size in its message; the other side
maps it again. Nothing is pickled: a descriptor is [name, dtype, shape, offset, size], `dtype` numpy's
`dtype.str` or "BYTES" (then the bytes are Triton's serialized form: each element a 4-byte length and its
bytes, codec/bytes_tensor.py). A tensor that travels in the message itself (a small batch's tensors both
ways, a decoupled model's answers, a BLS call's tensors) has offset -1 and its bytes in place of its size.
An EXECUTE whose end offset is -1 is such a batch: its outputs are answered in the message too.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from typing import Any

import msgspec
import numpy as np

from codec.bytes_tensor import decode_bytes, encode_bytes

# What a message is (its first element); the second is the call it belongs to, where it has one.
LOAD, READY, FAILED = 1, 2, 3  # server -> process: the model to load; the answer: loaded, or why not
EXECUTE, RESULT, ERROR = 4, 5, 6  # a batch; its answers (one per request, or the outputs); it raised
STREAM, PART, END, CANCEL = 7, 8, 9, 10  # a streamed request; one of its answers; its end; the client left
LOG = 11  # process -> server: a line for the server's log (pb_utils.Logger)
CALL, REPLY = 12, 13  # process -> server: a BLS request; server -> process: its answer
STOP = 14  # server -> process: finalize and exit
COMPLETE = 15  # server -> process: auto_complete_config, answered by READY with the completed config
METRIC = 16  # process -> server: a value for grps's app_monitor [METRIC, 0, name, aggregation, value]
MORE = 17  # server -> process: a stream's reader took answers, [MORE, call, count]: that many more may come
AHEAD = 8  # the answers a stream may send beyond those its reader took

BYTES = "BYTES"
ALIGN = 64
HEADER = struct.Struct("<I")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def frame(message: list) -> bytes:
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


class Frames:
    """Messages out of a byte stream, as its pieces arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        buffer += data
        messages, start, end = [], 0, len(buffer)
        while end - start >= 4:
            (size,) = HEADER.unpack_from(buffer, start)
            if end - start - 4 < size:
                break
            messages.append(_decoder.decode(memoryview(buffer)[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return messages


def receive(sock: Any, frames: Frames, pending: list[Any]) -> Any:
    """Blocking: the next message on `sock` (None at its end), `pending` holding those read ahead."""
    while not pending:
        data = sock.recv(65536)
        if not data:
            return None
        pending.extend(frames.feed(data))
    return pending.pop(0)


class Arena:
    """The instance's shared memory, mapped; both sides hold the same memfd."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)

    @classmethod
    def create(cls, name: str, size: int) -> Arena:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def reserve(self, size: int) -> None:
        """At least `size` bytes, growing the memfd (the other side learns the size from the message)."""
        if size > self.size:
            self.size = max(size, self.size * 2)
            os.ftruncate(self.fd, self.size)
            self._remap()

    def follow(self, size: int) -> None:
        """The other side grew the memfd to `size`."""
        if size > self.size:
            self.size = size
            self._remap()

    def _remap(self) -> None:
        # The old map is not closed: arrays a model kept may still view it; it goes with the last of them.
        self.map = mmap.mmap(self.fd, self.size)

    def write(self, tensors: dict[str, np.ndarray], offset: int) -> tuple[list[list], int]:
        """Writes the arrays from `offset` on; their descriptors and the offset after them."""
        encoded = {}
        need = offset
        for name, array in tensors.items():
            if array.dtype.kind == "O":
                encoded[name] = data = encode_bytes(array)
                need += _aligned(len(data))
            else:
                need += _aligned(array.nbytes)
        self.reserve(need)
        descriptors = []
        for name, array in tensors.items():
            data = encoded.get(name)
            if data is not None:
                size = len(data)
                self.map[offset : offset + size] = data
                descriptors.append([name, BYTES, list(array.shape), offset, size])
            else:
                size = array.nbytes
                np.ndarray(array.shape, array.dtype, buffer=self.map, offset=offset)[...] = array
                descriptors.append([name, array.dtype.str, list(array.shape), offset, size])
            offset += _aligned(size)
        return descriptors, offset

    def read(self, descriptor: list, copy: bool) -> np.ndarray:
        """The array a descriptor names: a view of the arena, or a copy of it (`copy`)."""
        name, dtype, shape, offset, size = descriptor
        if offset < 0:
            return inline_array(descriptor)
        if dtype == BYTES:
            return decode_bytes(memoryview(self.map)[offset : offset + size], _count(shape), name).reshape(
                shape
            )
        array = np.ndarray(shape, np.dtype(dtype), buffer=self.map, offset=offset)
        return array.copy() if copy else array

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view is still held: the map goes with the last one
            self.map.close()
        os.close(self.fd)


def inline(name: str, array: np.ndarray) -> list:
    """A tensor carried in the message itself."""
    if array.dtype.kind == "O":
        return [name, BYTES, list(array.shape), -1, encode_bytes(array)]
    return [name, array.dtype.str, list(array.shape), -1, array.tobytes()]  # C order, whatever its strides


def inline_all(tensors: dict[str, np.ndarray]) -> list[list]:
    return [inline(name, array) for name, array in tensors.items()]


def inline_array(descriptor: list) -> np.ndarray:
    name, dtype, shape, _, data = descriptor
    if dtype == BYTES:
        return decode_bytes(memoryview(data), _count(shape), name).reshape(shape)
    return np.frombuffer(data, np.dtype(dtype)).reshape(shape).copy()  # writable, as a model may expect


def as_array(value: Any) -> np.ndarray:
    """What a model returned as an output, as an array (str elements become BYTES)."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.kind in "US":
        array = array.astype(object)
    return array


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


def _count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
