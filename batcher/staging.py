"""Host <-> device staging: gathers the rows of a batch into one array per input, where the model runs.

A Staging turns the per-request arrays of one input into the batch array the backend executes on, and the
backend's outputs back into host arrays that the batcher splits per request (views, no copy).
`make_staging(config)` picks one per model version:

- `HostStaging`: numpy in, numpy out (the default; a single part is handed over as is).
- `TorchHostStaging`: CPU torch tensors sharing memory with the numpy batch (`torch.from_numpy`), outputs
  back as numpy views (`.numpy()`).
- `DeviceStaging`: CUDA. The rows of each input are gathered into a reusable pinned host buffer and copied
  to the device once per batch, asynchronously, on a stream of the staging's own; outputs come back once
  per batch through pinned memory. Torch tensors or CuPy arrays, as the config asks; the two are
  exchanged through DLPack, never through the host.

Which one: `instance_group { kind: KIND_GPU gpus: [...] }` asks for the GPU (the first listed, else 0),
KIND_AUTO / KIND_MODEL take it when one is present, KIND_CPU (the default without instance_group) keeps
the host. The array type comes from the config parameter `array_module` (numpy | torch | cupy, default
numpy); the pytorch backend always gets torch tensors. numpy arrays always stay on the host.
"""

import contextlib
import logging
import threading
from typing import Any, Protocol

import numpy as np

from codec.datatypes import BY_CONFIG, BY_NUMPY, DataType
from codec.errors import ErrorKind, InferError

log = logging.getLogger("tensorgate.staging")

ARRAY_MODULES = ("numpy", "torch", "cupy")
MIN_BUFFER_BYTES = 1 << 16  # a pinned buffer starts at 64 KiB and doubles as batches need


class Staging(Protocol):
    device: str  # "cpu" or "cuda:N": where the arrays the backend receives live
    array_module: str  # "numpy", "torch" or "cupy"

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        """One batch array for input `name`: `parts` concatenated along dimension 0, in order."""
        ...

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """The backend's outputs as host arrays (numpy; one device-to-host copy per output on a GPU).

        Values that are not arrays of the staging's kind (numpy arrays, lists) pass through unchanged.
        """
        ...


class HostStaging:
    device = "cpu"
    array_module = "numpy"

    def gather(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        return _concatenate(parts)

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        return outputs


# ---------------------------------------------------------------------------------------------- choice


def array_module(config: dict) -> str:
    """The array type a model's backend receives: "numpy", "torch" or "cupy"."""
    if config.get("backend") == "pytorch":
        return "torch"
    value = config.get("parameters", {}).get("array_module", {}).get("string_value", "numpy")
    if value not in ARRAY_MODULES:
        raise ValueError(f"parameter array_module must be one of {', '.join(ARRAY_MODULES)}, got {value!r}")
    return value


def placement(config: dict, module: str) -> tuple[str, str]:
    """(device, warning): "cuda:N" or "cpu" for a model whose arrays are of `module`, and why a GPU that
    the instance_group asked for is not used ("" when nothing is amiss). Raises for a GPU id not present.
    """
    groups = config.get("instance_group") or []
    asked = next((g for g in groups if g.get("kind") == "KIND_GPU"), None)
    group = f"instance_group '{asked.get('name', '')}'" if asked else ""
    auto = any(g.get("kind") in ("KIND_AUTO", "KIND_MODEL") for g in groups)
    if module == "numpy" or (asked is None and not auto):
        return "cpu", ""
    count, why = cuda_devices(module)
    if asked is None:
        return ("cuda:0" if count else "cpu"), ""
    if not count:
        return "cpu", f"{group} asks for KIND_GPU but {why}; running on the CPU"
    gpu = (asked.get("gpus") or [0])[0]
    if not 0 <= gpu < count:
        raise ValueError(f"{group} asks for GPU {gpu} but {count} CUDA device(s) are present")
    return f"cuda:{gpu}", ""


def cuda_devices(module: str) -> tuple[int, str]:
    """(number of CUDA devices `module` can use, why there are none)."""
    if module == "torch":
        torch = import_torch()
        return (torch.cuda.device_count() if torch.cuda.is_available() else 0), "no CUDA device is present"
    try:
        import cupy
    except ImportError:
        return 0, "cupy is not installed"
    try:
        return cupy.cuda.runtime.getDeviceCount(), "no CUDA device is present"
    except Exception as e:  # cupy raises its CUDARuntimeError when there is no driver
        return 0, f"no CUDA device is usable ({e})"


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("torch is not installed (pip install 'tensorgate[torch]')") from None
    return torch


def make_staging(config: dict) -> Staging:
    """The staging for one model version (a normalized config). Raises ValueError / ImportError for a
    config that cannot be honoured (an unknown array_module, torch missing, a GPU id not present)."""
    module = array_module(config)
    device, warning = placement(config, module)
    name = config.get("name", "")
    if warning:
        log.warning("model '%s': %s", name, warning)
    if module == "numpy":
        return HostStaging()
    if device == "cpu":
        if module == "torch":
            return TorchHostStaging(config)
        log.warning("model '%s': array_module 'cupy' needs a CUDA device; the model gets numpy arrays", name)
        return HostStaging()
    log.info("model '%s': %s arrays on %s", name, module, device)
    return DeviceStaging(config, device, module)


def _config_types(config: dict, key: str) -> dict[str, DataType]:
    """Name -> datatype of the config's inputs or outputs, BYTES left out (they stay numpy objects)."""
    types = {e["name"]: BY_CONFIG[e["data_type"]] for e in config.get(key, [])}
    return {name: t for name, t in types.items() if t.v2 != "BYTES"}


def _concatenate(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _in_config_dtype(name: str, parts: list[np.ndarray], datatype: DataType | None) -> list[np.ndarray]:
    """The parts as the config types the input (BF16: its uint16 bit patterns): a part of another kind
    of the same family (INT64 for INT32, FP64 for FP32) is cast; another family is an error naming the
    input, not a shape error from deep in torch."""
    if datatype is None or all(p.dtype == datatype.numpy for p in parts):
        return parts
    cast = []
    for part in parts:
        if part.dtype != datatype.numpy and not np.can_cast(part.dtype, datatype.numpy, casting="same_kind"):
            raise InferError(
                ErrorKind.INVALID_ARGUMENT,
                f"input '{name}' holds {part.dtype} data where the model expects {datatype.v2}",
            )
        cast.append(part.astype(datatype.numpy, copy=False))
    return cast


# ------------------------------------------------------------------------------------------- CPU torch


class TorchHostStaging:
    """CPU torch tensors over the numpy batch, without a copy where numpy allows it.

    A part that is read-only (a view of an immutable request body) or not C-contiguous is copied first: a
    torch tensor has no read-only flag, and a model may write into its inputs in place.
    """

    device = "cpu"
    array_module = "torch"

    def __init__(self, config: dict) -> None:
        ops = _TorchOps(self.device)
        self.torch = ops.torch
        self._types = _config_types(config, "input")
        self._inputs = {n: ops.dtype(t) for n, t in self._types.items()}
        self._outputs = {n: ops.dtype(t) for n, t in _config_types(config, "output").items()}

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        if parts[0].dtype == object:
            return _concatenate(parts)
        array = _concatenate(_in_config_dtype(name, parts, self._types.get(name)))
        if not (array.flags.writeable and array.flags.c_contiguous):
            array = array.copy()
        tensor = self.torch.from_numpy(array)
        want = self._inputs.get(name)
        if want is not None and want is not tensor.dtype:
            tensor = tensor.view(want)  # BF16 travels as uint16 bit patterns
        return tensor

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        host = {}
        for name, value in outputs.items():
            if isinstance(value, self.torch.Tensor):
                value = tensor_to_numpy(self.torch, _cast(value.detach().cpu(), self._outputs.get(name)))
            host[name] = value
        return host


def _cast(tensor: Any, want: Any) -> Any:
    return tensor if want is None or tensor.dtype is want else tensor.to(want)


def tensor_to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    """A host tensor as a numpy view of its memory; bfloat16 as uint16 bit patterns (numpy has none)."""
    if tensor.dtype is torch.bfloat16:
        tensor = tensor.view(torch.uint16)
    return tensor.numpy()


# ---------------------------------------------------------------------------------------------- device


class _Buffer:
    """Reusable host memory for one input (pinned on CUDA); `event` marks the end of the last copy out."""

    def __init__(self, array: np.ndarray, handle: Any) -> None:
        self.array = array  # uint8 numpy view of the memory
        self.handle = handle  # the same memory as the array module sees it
        self.event: Any = None


class _Lane:
    """A stream and the input buffers it copies from; one lane per batch being staged at once."""

    def __init__(self, ops: Any) -> None:
        self.stream = ops.new_stream()
        self.buffers: dict[str, _Buffer] = {}


class DeviceStaging:
    """Batches on a device: per input, rows are gathered into a reusable host buffer (pinned on CUDA) and
    copied to the device once per batch; outputs come back once per batch into pinned memory, as numpy.

    Each gather or to_host takes a lane (a CUDA stream and its buffers) from a pool and gives it back, so
    batches staged at once from several threads (one per instance) never share a buffer, and the pool
    holds as many lanes as batches were ever staged at once. A buffer is refilled only after the copy
    out of it has finished (a CUDA event). Copies are ordered with the stream that is current in the
    calling thread, where the backend computes: the batch's inputs are ready on it when gather returns,
    and to_host copies the outputs after what was queued on it.

    `device` "cpu" runs the same buffer logic without CUDA (tests do).
    """

    def __init__(self, config: dict, device: str, module: str = "torch") -> None:
        self.device = device
        self.array_module = module
        self.ops = _TorchOps(device) if module == "torch" else _CupyOps(device)
        self._types = _config_types(config, "input")
        self._inputs = {n: self.ops.dtype(t) for n, t in self._types.items()}
        self._outputs = {n: self.ops.dtype(t) for n, t in _config_types(config, "output").items()}
        self._lanes: list[_Lane] = []
        self._lock = threading.Lock()

    @property
    def pinned_bytes(self) -> int:
        """Host buffer bytes held for inputs, across lanes."""
        with self._lock:
            return sum(b.array.nbytes for lane in self._lanes for b in lane.buffers.values())

    @contextlib.contextmanager
    def _lane(self) -> Any:
        with self._lock:
            lane = self._lanes.pop() if self._lanes else None
        if lane is None:
            lane = _Lane(self.ops)
        try:
            yield lane
        finally:
            with self._lock:
                self._lanes.append(lane)

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        if parts[0].dtype == object:
            return _concatenate(parts)  # BYTES stay numpy objects on the host
        parts = _in_config_dtype(name, parts, self._types.get(name))
        first = parts[0]
        shape = first.shape if len(parts) == 1 else (sum(p.shape[0] for p in parts), *first.shape[1:])
        nbytes = first.dtype.itemsize * int(np.prod(shape))
        dtype = self._inputs.get(name)
        if dtype is None:  # an input the config does not type, or BF16 in CuPy: as numpy has it
            dtype = self.ops.dtype(BY_NUMPY[first.dtype])
        with self._lane() as lane:
            buffer = self._buffer(lane, name, nbytes)
            host = buffer.array[:nbytes].view(first.dtype).reshape(shape)
            if len(parts) == 1:
                np.copyto(host, first)
            else:
                np.concatenate(parts, out=host)
            return self.ops.to_device(buffer, nbytes, shape, dtype, lane.stream)

    def _buffer(self, lane: _Lane, name: str, nbytes: int) -> _Buffer:
        buffer = lane.buffers.get(name)
        if buffer is not None:
            _wait(buffer.event)  # the last copy out of it has finished: it may be refilled
            if buffer.array.nbytes >= nbytes:
                return buffer
        size = max(MIN_BUFFER_BYTES, 1 << max(nbytes - 1, 0).bit_length())
        buffer = lane.buffers[name] = _Buffer(*self.ops.host_buffer(size))
        return buffer

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        with self._lane() as lane:
            return self.ops.to_host(outputs, self._outputs, lane.stream)


def _wait(event: Any) -> None:
    """Blocks until a CUDA event (torch's or CuPy's) has happened; None: nothing to wait for."""
    if event is not None:
        event.synchronize()


class _TorchOps:
    """The device operations of DeviceStaging with torch (CUDA, or the CPU for tests)."""

    def __init__(self, device: str) -> None:
        self.torch = import_torch()
        self.device = self.torch.device(device)
        self.cuda = self.device.type == "cuda"

    def dtype(self, datatype: DataType) -> Any:
        return getattr(self.torch, datatype.torch)

    def new_stream(self) -> Any:
        return self.torch.cuda.Stream(self.device) if self.cuda else None

    def host_buffer(self, nbytes: int) -> tuple[np.ndarray, Any]:
        tensor = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=self.cuda)
        return tensor.numpy(), tensor

    def to_device(self, buffer: _Buffer, nbytes: int, shape: tuple, dtype: Any, stream: Any) -> Any:
        torch = self.torch
        host = buffer.handle[:nbytes].view(dtype).view(shape)
        if not self.cuda:
            return host.clone()  # a copy, as on a device: the buffer is refilled by the next batch
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            tensor.copy_(host, non_blocking=True)
            buffer.event = stream.record_event()
        consumer.wait_stream(stream)
        # The memory belongs to our stream's pool: it is not handed out again before the work queued on
        # the consumer stream when the tensor is freed has run.
        tensor.record_stream(consumer)
        return tensor

    def to_host(self, outputs: dict[str, Any], dtypes: dict[str, Any], stream: Any) -> dict[str, Any]:
        torch = self.torch
        staged = {}
        if self.cuda:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # the outputs are computed there
        with torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext():
            for name, value in outputs.items():
                tensor = self._as_tensor(value)
                if tensor is None:
                    staged[name] = value
                    continue
                tensor = _cast(tensor.detach(), dtypes.get(name))
                if tensor.device.type == "cpu":
                    staged[name] = tensor
                    continue
                # Fresh pinned memory per batch (torch caches it): the numpy views handed out outlive
                # this call, so this memory is reused only once the responses are done with it.
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                host.copy_(tensor, non_blocking=True)
                staged[name] = host
        if self.cuda:
            stream.synchronize()
        return {n: tensor_to_numpy(torch, v) if isinstance(v, torch.Tensor) else v for n, v in staged.items()}

    def _as_tensor(self, value: Any) -> Any:
        if isinstance(value, self.torch.Tensor):
            return value
        if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
            return None
        return self.torch.from_dlpack(value)  # a CuPy array: same device memory, no copy


class _CupyOps:
    """The device operations of DeviceStaging with CuPy (CUDA only)."""

    def __init__(self, device: str) -> None:
        import cupy
        import cupyx

        self.cupy, self.cupyx = cupy, cupyx
        kind, _, index = device.partition(":")
        if kind != "cuda":
            raise ValueError(f"CuPy arrays live on a CUDA device, not {device!r}")
        self.index = int(index or 0)

    def dtype(self, datatype: DataType) -> np.dtype | None:
        # CuPy has no bfloat16: BF16 stays uint16 bit patterns both ways, never cast as numbers
        return None if datatype.v2 == "BF16" else datatype.numpy

    def new_stream(self) -> Any:
        with self.cupy.cuda.Device(self.index):
            return self.cupy.cuda.Stream(non_blocking=True)

    def host_buffer(self, nbytes: int) -> tuple[np.ndarray, Any]:
        array = self.cupyx.empty_pinned((nbytes,), dtype=np.uint8)
        return array, array

    def to_device(self, buffer: _Buffer, nbytes: int, shape: tuple, dtype: Any, stream: Any) -> Any:
        cupy = self.cupy
        host = buffer.array[:nbytes].view(dtype).reshape(shape)
        with cupy.cuda.Device(self.index):
            consumer = cupy.cuda.get_current_stream()
            array = cupy.empty(shape, dtype)  # from the pool of the consumer stream, where it is used
            stream.wait_event(consumer.record())  # memory the pool hands back may still be read there
            array.set(host, stream=stream)
            buffer.event = stream.record()
            consumer.wait_event(buffer.event)
        return array

    def to_host(self, outputs: dict[str, Any], dtypes: dict[str, Any], stream: Any) -> dict[str, Any]:
        cupy = self.cupy
        host = {}
        with cupy.cuda.Device(self.index):
            stream.wait_event(cupy.cuda.get_current_stream().record())  # the outputs are computed there
            with stream:
                for name, value in outputs.items():
                    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
                        host[name] = value
                        continue
                    array = value if isinstance(value, cupy.ndarray) else cupy.from_dlpack(value)
                    want = dtypes.get(name)
                    if want is not None and array.dtype != want:
                        array = array.astype(want)
                    array = cupy.ascontiguousarray(array)
                    out = self.cupyx.empty_pinned(array.shape, dtype=array.dtype)
                    array.get(stream=stream, out=out)
                    host[name] = out
            stream.synchronize()
        return host
