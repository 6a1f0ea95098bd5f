"""Staging on a CUDA device (torch tensors or CuPy arrays); `batcher.staging` chooses when.

The batcher runs a model staged here in worker threads, one per instance (`blocking`). Each thread calls
`enter_thread` once: the model's device becomes its current device and a non-blocking stream of its own
its current stream, so instances compute side by side and a copy back waits only for its own kernels.
Per batch:

- `gather`: the rows of each input are gathered into a reusable pinned host buffer and copied to the device
  once, asynchronously, on a lane's copy stream; the thread's compute stream waits for that copy.
- `finished`: returns once the thread's compute stream has run what execute queued, so the time execute
  took is its kernels', not their launch (Triton's compute_infer).
- `to_host`: outputs come back once per batch into pinned host buffers, from a pool that takes a buffer back
  once every numpy view handed out over it is gone (the answers are sent).

`device` "cpu" runs the same buffer logic without CUDA (tests do).
"""

import collections
import contextlib
import ctypes
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tensorgate.batcher.arrays import (
    cast_tensor,
    concatenate,
    config_types,
    import_torch,
    in_config_dtype,
    tensor_to_numpy,
)
from tensorgate.codec.datatypes import BY_NUMPY, DataType, bf16_bits

Types = dict[str, DataType]  # the config's datatype of each output
MIN_BUFFER_BYTES = 1 << 16  # a pinned buffer starts at 64 KiB and doubles as batches need


def size_class(nbytes: int) -> int:
    """The buffer size that holds `nbytes`: a power of two, at least MIN_BUFFER_BYTES."""
    return max(MIN_BUFFER_BYTES, 1 << max(nbytes - 1, 0).bit_length())


class _Buffer:
    """Reusable host memory (pinned on CUDA); `event` marks the end of the last copy out of it."""

    def __init__(self, array: np.ndarray, handle: Any) -> None:
        self.array = array  # uint8 numpy view of the memory
        self.handle = handle  # the same memory as the array module sees it
        self.event: Any = None


class _Lane:
    """A copy stream and the input buffers it copies from; one lane per batch being staged at once."""

    def __init__(self, ops: Any) -> None:
        self.stream = ops.new_stream()
        self.buffers: dict[str, _Buffer] = {}


class OutputPool:
    """Host buffers for outputs, each lent until every array viewing it is gone, then lent again.

    A lease is a ctypes array over the buffer: numpy views of it (and views of those views) keep the lease
    alive, so its finalizer runs only when the last per-request view of a batch's output has been dropped.
    """

    def __init__(self, allocate: Callable[[int], _Buffer]) -> None:
        self._allocate = allocate
        self._free: dict[int, list[_Buffer]] = {}
        # Reentrant: a garbage collection inside the lock may run another lease's finalizer, which
        # gives its buffer back on the same thread.
        self._lock = threading.RLock()
        self._closed = False
        self.nbytes = 0  # host memory held, lent or free

    def lease(self, nbytes: int) -> tuple[np.ndarray, _Buffer | None]:
        """`nbytes` of host memory as a uint8 array, and the buffer it lies in (None for 0 bytes)."""
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8), None
        size = size_class(nbytes)
        with self._lock:
            free = self._free.get(size)
            buffer = free.pop() if free else None
            if buffer is None:
                self.nbytes += size
        if buffer is None:
            buffer = self._allocate(size)
        lease = (ctypes.c_uint8 * nbytes).from_buffer(buffer.array)
        weakref.finalize(lease, self._give_back, size, buffer)
        return np.frombuffer(lease, dtype=np.uint8), buffer

    def _give_back(self, size: int, buffer: _Buffer) -> None:
        with self._lock:
            if self._closed:
                self.nbytes -= size
            else:
                self._free.setdefault(size, []).append(buffer)

    def close(self) -> None:
        """Drops the free buffers; those still lent are dropped when they come back."""
        with self._lock:
            self._closed = True
            self.nbytes -= sum(size * len(free) for size, free in self._free.items())
            self._free.clear()


class DeviceStaging:
    """Batches on a device: see the module's docstring.

    Each gather or to_host takes a lane (a copy stream and its buffers) from a first-in-first-out pool and
    gives it back, so batches staged at once from several threads never share a buffer, consecutive batches
    use different copy streams, and the pool holds as many lanes as batches were ever staged at once. A
    buffer is refilled only after the copy out of it has finished (a CUDA event).
    """

    blocking = True  # gather and to_host wait on the device: the batcher runs this model in worker threads

    def __init__(self, config: dict, device: str, module: str = "torch") -> None:
        self.device = device
        self.array_module = module
        self.ops = _TorchOps(device) if module == "torch" else _CupyOps(device)
        self._types = config_types(config, "input")
        self._inputs = {n: self.ops.dtype(t) for n, t in self._types.items()}
        self._outputs = config_types(config, "output")
        self._lanes: collections.deque[_Lane] = collections.deque()
        self._lock = threading.Lock()
        self.output_pool = OutputPool(lambda size: _Buffer(*self.ops.host_buffer(size)))

    @property
    def pinned_bytes(self) -> int:
        """Host buffer bytes held for inputs, across lanes."""
        with self._lock:
            return sum(b.array.nbytes for lane in self._lanes for b in lane.buffers.values())

    def enter_thread(self) -> None:
        self.ops.enter_thread()

    def finished(self) -> None:
        self.ops.finished()

    def close(self) -> None:
        """Releases the buffers, and the device memory the array module caches and no model holds."""
        with self._lock:
            self._lanes.clear()
        self.output_pool.close()
        self.ops.release()

    @contextlib.contextmanager
    def _lane(self) -> Any:
        with self._lock:
            lane = self._lanes.popleft() if self._lanes else None
        if lane is None:
            lane = _Lane(self.ops)
        try:
            yield lane
        finally:
            with self._lock:
                self._lanes.append(lane)

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        if parts[0].dtype == object:
            return concatenate(parts)  # BYTES stay numpy objects on the host
        if not all(isinstance(p, np.ndarray) for p in parts):  # from CUDA shared memory: on a device
            return self.ops.on_device(parts, self._inputs.get(name))
        parts = in_config_dtype(name, parts, self._types.get(name))
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
        buffer = lane.buffers[name] = _Buffer(*self.ops.host_buffer(size_class(nbytes)))
        return buffer

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        with self._lane() as lane:
            return self.ops.to_host(outputs, self._outputs, lane.stream, self.output_pool)


def _wait(event: Any) -> None:
    """Blocks until a CUDA event (torch's or CuPy's) has happened; None: nothing to wait for."""
    if event is not None:
        event.synchronize()


_thread = threading.local()  # the compute stream of a worker thread, kept alive with it


class _TorchOps:
    """The device operations of DeviceStaging with torch (CUDA, or the CPU for tests)."""

    def __init__(self, device: str) -> None:
        self.torch = import_torch()
        self.device = self.torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._numpy_dtypes: dict[Any, np.dtype] = {}

    def dtype(self, datatype: DataType) -> Any:
        return getattr(self.torch, datatype.torch)

    def new_stream(self) -> Any:
        return self.torch.cuda.Stream(self.device) if self.cuda else None

    def enter_thread(self) -> None:
        if self.cuda:
            self.torch.cuda.set_device(self.device)
            _thread.stream = self.torch.cuda.Stream(self.device)  # from torch's pool: non-blocking
            self.torch.cuda.set_stream(_thread.stream)

    def finished(self) -> None:
        if self.cuda:
            self.torch.cuda.current_stream(self.device).synchronize()

    def release(self) -> None:
        if self.cuda:
            with self.torch.cuda.device(self.device):
                self.torch.cuda.empty_cache()
            host_empty_cache = getattr(self.torch._C, "_host_emptyCache", None)  # torch >= 2.5
            if host_empty_cache is not None:
                host_empty_cache()

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

    def to_host(
        self, outputs: dict[str, Any], types: dict[str, DataType], stream: Any, pool: OutputPool
    ) -> dict:
        torch = self.torch
        host = {}
        if self.cuda:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # the outputs are computed there
        with torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext():
            for name, value in outputs.items():
                tensor = self._as_tensor(value)
                if tensor is None:
                    host[name] = value
                    continue
                datatype = types.get(name)
                tensor = cast_tensor(tensor.detach(), None if datatype is None else self.dtype(datatype))
                if tensor.device.type == "cpu":
                    host[name] = tensor_to_numpy(torch, tensor)
                    continue
                if tensor.device != self.device:
                    # Another GPU's output: copied here first, after that device's current stream (torch
                    # orders a copy between devices with both), so the lane's synchronize covers it.
                    tensor = tensor.to(self.device)
                out, buffer = pool.lease(tensor.numel() * tensor.element_size())
                if buffer is not None:
                    buffer.handle[: out.nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor, True)
                host[name] = out.view(self._numpy_dtype(tensor.dtype)).reshape(tuple(tensor.shape))
        if self.cuda:
            stream.synchronize()
        return host

    def on_device(self, parts: list, dtype: Any) -> Any:
        """One batch tensor from parts of which some are already device arrays (DLPack): concatenated on
        this staging's device, the host parts copied there."""
        torch = self.torch
        tensors = [
            torch.from_numpy(p).to(self.device) if isinstance(p, np.ndarray) else torch.from_dlpack(p)
            for p in parts
        ]
        tensor = tensors[0] if len(tensors) == 1 else torch.cat([t.to(self.device) for t in tensors])
        return cast_tensor(tensor.to(self.device), dtype)

    def _numpy_dtype(self, dtype: Any) -> np.dtype:
        found = self._numpy_dtypes.get(dtype)
        if found is None:
            empty = self.torch.empty(0, dtype=dtype)
            found = self._numpy_dtypes[dtype] = tensor_to_numpy(self.torch, empty).dtype
        return found

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

    def enter_thread(self) -> None:
        self.cupy.cuda.Device(self.index).use()
        _thread.stream = self.cupy.cuda.Stream(non_blocking=True)
        _thread.stream.use()

    def finished(self) -> None:
        with self.cupy.cuda.Device(self.index):
            self.cupy.cuda.get_current_stream().synchronize()

    def release(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()
        self.cupy.get_default_pinned_memory_pool().free_all_blocks()

    def host_buffer(self, nbytes: int) -> tuple[np.ndarray, Any]:
        array = self.cupyx.empty_pinned((nbytes,), dtype=np.uint8)
        return array, array

    def to_device(self, buffer: _Buffer, nbytes: int, shape: tuple, dtype: Any, stream: Any) -> Any:
        cupy = self.cupy
        host = buffer.array[:nbytes].view(dtype).reshape(shape)
        with cupy.cuda.Device(self.index):
            consumer = cupy.cuda.get_current_stream()
            array = cupy.empty(shape, dtype)  # from the pool of the consumer stream, where it is used
            # Memory the pool hands back may still be read by work queued on the consumer stream. That is
            # the calling thread's own stream, whose earlier batch has finished (see `finished`).
            stream.wait_event(consumer.record())
            array.set(host, stream=stream)
            buffer.event = stream.record()
            consumer.wait_event(buffer.event)
        return array

    def to_host(
        self, outputs: dict[str, Any], types: dict[str, DataType], stream: Any, pool: OutputPool
    ) -> dict:
        cupy = self.cupy
        torch = sys.modules.get("torch")  # a torch output can only come from a model that imported it
        host: dict[str, Any] = {}
        on_device = []
        with cupy.cuda.Device(self.index):
            # Converted on the current (compute) stream, where the outputs were computed (`cupy.from_dlpack`
            # makes it wait for a torch output's stream). Not under `with stream:`: CuPy 14 leaves that by
            # making the default stream current, not the thread's own (`enter_thread`).
            for name, value in outputs.items():
                datatype = types.get(name)
                if torch is not None and isinstance(value, torch.Tensor):
                    if datatype is not None:  # cast by torch, which has bfloat16
                        value = cast_tensor(value.detach(), getattr(torch, datatype.torch))
                    value = torch_for_cupy(torch, value)
                if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
                    host[name] = value
                    continue
                host[name] = cupy.ascontiguousarray(self._in_config_dtype(self._array(value), datatype))
                on_device.append(name)
            stream.wait_event(cupy.cuda.get_current_stream().record())  # after all of the above
            for name in on_device:
                array = host[name]
                out, buffer = pool.lease(array.nbytes)
                out = out.view(array.dtype).reshape(array.shape)
                if buffer is not None:
                    array.get(stream=stream, out=out)
                host[name] = out
            stream.synchronize()
        return host

    def on_device(self, parts: list, dtype: Any) -> Any:
        """One batch array from parts of which some are already device arrays: on this device."""
        cupy = self.cupy
        with cupy.cuda.Device(self.index):
            arrays = [cupy.asarray(p) if isinstance(p, np.ndarray) else self._array(p) for p in parts]
            array = arrays[0] if len(arrays) == 1 else cupy.concatenate(arrays)
            return array if dtype is None or array.dtype == dtype else array.astype(dtype)

    def _in_config_dtype(self, array: Any, datatype: DataType | None) -> Any:
        """A device output in the config's dtype; BF16 as uint16 bits (torch's int16 bits viewed so,
        floats rounded to them)."""
        if datatype is None:
            return array
        if datatype.v2 != "BF16":
            return array if array.dtype == datatype.numpy else array.astype(datatype.numpy)
        if array.dtype.kind == "f":
            return bf16_bits(array.astype(self.cupy.float32))  # numpy's ufuncs run CuPy's on it
        return array.view(self.cupy.uint16) if array.dtype.itemsize == 2 else array.astype(self.cupy.uint16)

    def _array(self, value: Any) -> Any:
        """A CuPy array on this staging's device, for an output of any device-array kind."""
        cupy = self.cupy
        array = value if isinstance(value, cupy.ndarray) else cupy.from_dlpack(value)
        if array.device.id != self.index:
            # Another GPU's output: its kernels ran on that device's current stream; wait for them, then
            # copy it here (ndarray.copy copies to the current device).
            with cupy.cuda.Device(array.device.id):
                cupy.cuda.get_current_stream().synchronize()
            array = array.copy()
        return array


def torch_for_cupy(torch: Any, tensor: Any) -> Any:
    """A torch output as CuPy can take it through DLPack: detached from autograd; on the host, a numpy
    array (bfloat16 as uint16 bits); on a device, bfloat16 as int16 bits (CuPy has no bfloat16)."""
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor_to_numpy(torch, tensor)
    return tensor.view(torch.int16) if tensor.dtype is torch.bfloat16 else tensor
