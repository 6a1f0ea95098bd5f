"""Triton's tensors for python models (part of `pb_utils`, server/backends/pb_utils.py): `Tensor`, a named
numpy array with its Triton datatype, and the conversions between Triton's datatypes (config strings,
TRITONSERVER_DataType numbers), numpy's, and BYTES tensors' serialized form.
"""

import struct
from typing import Any

import numpy as np

from tensorgate.codec.datatypes import BY_CONFIG, BY_NUMPY, BY_V2
from tensorgate.server.backends.pb_errors import TritonModelException

# TRITONSERVER_DataType numbers, as Tensor.triton_dtype() answers them
_TRITON_TYPE_NUMBERS = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8,
    "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip
_V2_OF_NUMBER = {number: v2 for v2, number in _TRITON_TYPE_NUMBERS.items()}


class Tensor:
    """A named tensor: a numpy array (BYTES: an object array of bytes)."""

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.kind == "U" or array.dtype.kind == "V":
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by the python backend: "
                "use np.object_ (of bytes) instead"
            )
        if triton_dtype is not None:
            v2 = _V2_OF_NUMBER.get(triton_dtype)
            if v2 is None:
                raise TritonModelException(f"unknown triton_dtype {triton_dtype}")
        else:
            found = BY_NUMPY.get(array.dtype) or BY_NUMPY.get(np.dtype(array.dtype.kind))
            if found is None:
                raise TritonModelException(f"numpy dtype {array.dtype} has no Triton datatype")
            v2 = found.v2
        self._name = name
        self._array = array
        self._v2 = v2

    @staticmethod
    def _of(name: str, array: np.ndarray, v2: str) -> "Tensor":
        tensor = Tensor.__new__(Tensor)
        tensor._name, tensor._array, tensor._v2 = name, array, v2
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return _TRITON_TYPE_NUMBERS[self._v2]

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the array (torch.from_dlpack / cupy.from_dlpack take it)."""
        if self._array.dtype == object:
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors have no DLPack form")
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> "Tensor":
        """A tensor from a DLPack capsule or an object with `__dlpack__` (a torch tensor, a CuPy array);
        device memory is copied to the host."""
        if hasattr(capsule, "__dlpack__"):
            if hasattr(capsule, "detach"):  # torch: no autograd, on the host
                return Tensor(name, capsule.detach().cpu().numpy())
            if hasattr(capsule, "get") and not isinstance(capsule, np.ndarray):  # CuPy
                return Tensor(name, capsule.get())
            return Tensor(name, np.from_dlpack(capsule))
        try:
            import torch.utils.dlpack
        except ImportError:
            raise TritonModelException("from_dlpack of a raw capsule needs torch installed") from None
        return Tensor(name, torch.utils.dlpack.from_dlpack(capsule).cpu().numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._v2}, shape={list(self._array.shape)})"


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """TYPE_FP32 -> np.float32 (TYPE_STRING -> np.object_)."""
    dtype = BY_CONFIG[triton_type_string].numpy
    return np.object_ if dtype.kind == "O" else dtype.type


def triton_to_numpy_type(data_type: int) -> Any:
    return triton_string_to_numpy(BY_V2[_V2_OF_NUMBER[data_type]].config)


def numpy_to_triton_type(data_type: Any) -> int | None:
    found = BY_NUMPY.get(np.dtype(data_type))
    return None if found is None else _TRITON_TYPE_NUMBERS[found.v2]


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """BYTES elements as Triton lays them out: each a 4-byte little-endian length and its bytes."""
    if input_tensor.size == 0:
        return None
    chunks = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        chunks.append(struct.pack("<I", len(data)) + data)
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items, offset = [], 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)
