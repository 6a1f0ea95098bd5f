"""The internal currency: Tensor, InferRequest, InferResponse. Protocol details stop at codec/."""

from itertools import chain
from math import prod
from typing import Any

import numpy as np

from tensorgate.codec.bytes_tensor import decode_bytes, encode_bytes
from tensorgate.codec.datatypes import BY_V2, DataType
from tensorgate.codec.errors import invalid
from tensorgate.codec.trace import Trace

# Tensors up to this size are answered as a copy of their bytes: one call, where a view costs three
# (~0.05 against ~0.4 us), and a KiB copied costs less than that difference. A request's tensor up to
# this size is copied too, where its size is known (`request_view`).
SMALL_COPY = 1024
MAX_DIMS = 32  # numpy allows 64; no model has more than a handful
MAX_DIM = 2**62

# What JSON values a numeric tensor of each numpy kind accepts (integers fill float tensors, nothing
# else mixes): as the Python types orjson decodes them to, and as the kinds numpy infers for them.
JSON_TYPES = {
    "b": frozenset({bool}),
    "i": frozenset({int}),
    "u": frozenset({int}),
    "f": frozenset({int, float}),
}
JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def flat_json_of(values: list, kind: str) -> bool:
    """Whether every value of a flat list is of a JSON type that an array of numpy kind `kind` accepts
    (JSON_TYPES). Compiled, each check is one loop comparing types (~0.06 us for 16 values, where
    `set(map(type, values)) <= JSON_TYPES[kind]` costs ~0.3 us); plain loops (SIM110), as `all()` over a
    generator makes a generator object a call."""
    if kind == "i" or kind == "u":
        for value in values:  # noqa: SIM110
            if type(value) is not int:
                return False
        return True
    if kind == "f":
        for value in values:  # noqa: SIM110
            if type(value) is not float and type(value) is not int:
                return False
        return True
    if kind == "b":
        for value in values:  # noqa: SIM110
            if type(value) is not bool:
                return False
        return True
    return False


KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "non-integer numbers", "U": "strings"}


# The parameters that put a tensor in a registered shared-memory region (Triton's shared-memory
# extensions): a tensor that has them carries no data (`data` None) until the server reads the region.
SHM_REGION, SHM_BYTE_SIZE, SHM_OFFSET = (
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
)
SHM_PARAMETERS = frozenset((SHM_REGION, SHM_BYTE_SIZE, SHM_OFFSET))


def in_shared_memory(parameters: dict) -> bool:
    return not SHM_PARAMETERS.isdisjoint(parameters)  # one lookup per key of `parameters`, in C


# Request parameters Triton reserves (its parameters extension): they steer the server, and a model is
# given every other one, its custom parameters. Keys starting with "triton_" are Triton's too; a request
# may send only those Triton names.
RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)
TRITON_REQUEST_PARAMETERS = frozenset(("triton_enable_empty_final_response",))


def custom_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """A request's parameters as its model is given them: without the reserved ones."""
    if not parameters:
        return {}
    return {
        k: v for k, v in parameters.items() if k not in RESERVED_PARAMETERS and not k.startswith("triton_")
    }


def check_reserved(parameters: dict[str, Any]) -> None:
    """Refuses a "triton_" key Triton does not name, with Triton's text."""
    for key in parameters:
        if key.startswith("triton_") and key not in TRITON_REQUEST_PARAMETERS:
            raise invalid(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                f"keys starting with 'triton_' are allowed: {' '.join(sorted(TRITON_REQUEST_PARAMETERS))}"
            )


class _Record:
    """A dataclass's equality (the same class, its FIELDS equal in order) and repr, for the records below.
    Defining __eq__ leaves them unhashable, as a dataclass is."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        names = self.FIELDS
        return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({fields})"


class Tensor(_Record):
    """A named tensor. `data` is a numpy array shaped `shape` (BYTES: an object array of bytes).

    Numeric data may be a zero-copy (read-only) view over the request body.

    Tensor, RequestedOutput, InferRequest and InferResponse are built for every request, so they are plain
    classes with their own `__init__` rather than dataclasses: compiled, each is an extension type
    (tensor.pxd) whose `__init__` fills C fields, 0.04 against 0.14 us a Tensor and 0.08 against 0.23-0.30
    an InferRequest (Cython refuses a dataclass's `slots=` and `KW_ONLY`, and its own dataclasses build
    slower). Equality and repr are a dataclass's (_Record).
    """

    __slots__ = FIELDS = ("name", "datatype", "shape", "data", "parameters")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        data: Any,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.data = data
        self.parameters: dict[str, Any] = {} if parameters is None else parameters


class RequestedOutput(_Record):
    __slots__ = FIELDS = ("name", "binary", "parameters", "class_count")

    def __init__(
        self,
        name: str,
        binary: bool | None = None,  # None: follow the request's default
        parameters: dict[str, Any] | None = None,
        class_count: int = 0,  # Triton's classification extension: answer the top N classes (0: the tensor)
    ) -> None:
        self.name = name
        self.binary = binary
        self.parameters: dict[str, Any] = {} if parameters is None else parameters
        self.class_count = class_count


class InferRequest(_Record):
    __slots__ = FIELDS = (
        "model_name",
        "model_version",
        "id",
        "inputs",
        "outputs",
        "parameters",
        "binary_output",
        "shared_memory",
        "trace",
        "sequence_id",
        "sequence_flags",
    )

    def __init__(
        self,
        model_name: str,
        model_version: str = "",  # "" = the policy's default version
        id: str | None = None,  # noqa: A002  # the protocols' name for it
        inputs: list[Tensor] | None = None,
        outputs: list[RequestedOutput] | None = None,  # None: every output
        parameters: dict[str, Any] | None = None,
        binary_output: bool = False,  # the binary_data_output request parameter
        # An input or a requested output names a shared-memory region (set by the codec that decodes it):
        # the endpoint then serves it through the server's regions, and any other request goes to the model.
        shared_memory: bool = False,
        *,  # the rest by name: a field added later cannot take another's place
        # Triton's trace extension: what the server records of this request when it was sampled (None when
        # not; codec/trace.py). Stamped by the model version, the scheduler and the executor.
        trace: Trace | None = None,
        # Triton's sequence extension (codec/sequence.py): the request's correlation ID (0 / "": none) and
        # its SEQUENCE_START (1) / SEQUENCE_END (2) flags, read from the parameters of those names.
        sequence_id: int | str = 0,
        sequence_flags: int = 0,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs: list[Tensor] = [] if inputs is None else inputs
        self.outputs = outputs
        self.parameters: dict[str, Any] = {} if parameters is None else parameters
        self.binary_output = binary_output
        self.shared_memory = shared_memory
        self.trace = trace
        self.sequence_id = sequence_id
        self.sequence_flags = sequence_flags


class InferResponse(_Record):
    __slots__ = FIELDS = ("model_name", "model_version", "outputs", "id", "parameters")

    def __init__(
        self,
        model_name: str,
        model_version: str,
        outputs: list[Tensor],
        id: str | None = None,  # noqa: A002  # the protocols' name for it
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.outputs = outputs
        self.id = id
        self.parameters: dict[str, Any] = {} if parameters is None else parameters


def checked_shape(raw: Any, what: str) -> tuple[tuple[int, ...], int]:
    """A request's shape (a list of non-negative ints, at most MAX_DIMS) and its element count."""
    if type(raw) is not list or len(raw) > MAX_DIMS:
        raise invalid(
            f"{what}: 'shape' must be a list of at most {MAX_DIMS} non-negative integers, got {raw!r}"
        )
    for dim in raw:
        if type(dim) is not int or dim < 0:
            raise invalid(f"{what}: 'shape' must hold non-negative integers, got {raw!r}")
        if dim > MAX_DIM:
            raise invalid(f"{what}: shape {raw} holds too many elements")
    shape = tuple(raw)
    count = prod(shape)
    if count > MAX_DIM:
        raise invalid(f"{what}: shape {raw} holds too many elements")
    return shape, count


def array_from_bytes(
    chunk: memoryview, dtype: DataType, shape: tuple, count: int, what: str, source: str
) -> np.ndarray:
    """Raw tensor bytes (`source` names where they came from) as an array: a view for numeric data."""
    if dtype.v2 == "BYTES":
        if count > len(chunk) // 4:  # every element has a 4-byte length prefix
            raise invalid(
                f"{what}: {len(chunk)} bytes of BYTES data cannot hold the {count} elements of its shape"
            )
        return decode_bytes(chunk, count, what).reshape(shape)
    if len(chunk) != count * dtype.size:
        raise invalid(
            f"{what}: {source} holds {len(chunk)} bytes, "
            f"shape {list(shape)} of {dtype.v2} needs {count * dtype.size}"
        )
    return request_view(shape, dtype.numpy, chunk, 0, len(chunk))


def request_view(shape: tuple, dtype: np.dtype, buffer: Any, offset: int = 0, nbytes: int = -1) -> np.ndarray:
    """A request tensor's array over its `nbytes` bytes at `offset` in `buffer` (-1: up to its shape): a
    view (ndarray's positional form, at half the cost of frombuffer + reshape), or a copy when it is small.

    A tensor's bytes start wherever its protocol put them (after a JSON header of any length, inside a
    protobuf message), and numpy runs a ufunc on unaligned data through a buffered loop: `simple`'s add
    and subtract on two INT32 [1, 16] views take 1.45 us unaligned against 0.44 us aligned. A small tensor
    whose size is given is copied as a bytes slice, which CPython aligns: 0.29 us, where a view, its
    alignment check and a copy cost 0.46 (and an aligned view alone 0.22). A large view stays a view (no
    copy): numpy's buffered loop costs about what a copy would, and a model that only passes it on pays
    nothing."""
    if 0 <= nbytes <= SMALL_COPY:
        chunk = buffer[offset : offset + nbytes]
        copied = np.ndarray(shape, dtype, chunk if type(chunk) is bytes else bytes(chunk))
        if copied.flags.aligned:
            return copied
    view = np.ndarray(shape, dtype, buffer, offset)
    if view.flags.aligned or view.nbytes > SMALL_COPY:
        return view
    return view.copy()


def as_dtype(array: Any, dtype: np.dtype) -> np.ndarray:
    """`array` as a numpy array of `dtype`: itself when it already is one."""
    # numpy's dtypes of the built-in types are singletons: `is` settles the common case cheaply
    if isinstance(array, np.ndarray) and (array.dtype is dtype or array.dtype == dtype):
        return array
    return np.asarray(array, dtype=dtype)


def tensor_bytes(tensor: Tensor) -> bytes | memoryview:
    """The tensor's elements as the v2 binary / raw_contents layout: BYTES length-prefixed, anything else
    C-order little-endian: a view when the data already is so and is over SMALL_COPY bytes."""
    if tensor.datatype == "BYTES":
        return encode_bytes(np.asarray(tensor.data))
    data = as_dtype(tensor.data, BY_V2[tensor.datatype].numpy)
    if data.nbytes <= SMALL_COPY:
        return data.tobytes()
    return memoryview(data.ravel().view(np.uint8))  # type: ignore[arg-type]  # numpy's stubs: __buffer__ from 3.12


def holds_booleans(value: Any) -> bool:
    """Whether regular nested JSON lists (numpy has already read them as numbers) hold a true/false:
    numpy reads [true, 2] as integers, which a numeric tensor must refuse. Flattened level by level in C."""
    level = value
    while type(level) is list and level and type(level[0]) is list:
        level = list(chain.from_iterable(level))
    return bool in set(map(type, level)) if type(level) is list else type(level) is bool


def narrowed(wide: np.ndarray, target: np.dtype) -> np.ndarray | None:
    """Floats cast to a narrower float type, or None when a finite value would become an infinity."""
    with np.errstate(over="ignore"):
        narrow = wide.astype(target)
    if not np.isfinite(narrow).all() and (np.isinf(narrow) & np.isfinite(wide)).any():
        return None
    return narrow
