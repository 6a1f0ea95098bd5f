"""Triton's shared-memory extensions: regions a client on the same host registers, then names in the
parameters of an infer's inputs and outputs instead of sending their bytes.

- System regions are POSIX shared memory as `tritonclient.utils.shared_memory` creates it
  (`shm_open(key)`, i.e. `/dev/shm/<key>`): mapped with mmap, never unlinked (the client owns it).
- CUDA regions are a cudaIpcMemHandle of the client's device memory, opened with CuPy (else torch)
  on the named device.
- An input naming a region is read as a numpy view over the mapping (no copy); an output naming one is
  written into it and answered as Triton answers it: name, datatype and shape, no data, no parameters.
- Unregistering removes the name at once; a mapping that requests still view stays mapped until the
  last view is gone (CPython refuses to close an mmap with live buffer exports, and frees it then), so
  a request in flight never reads unmapped memory.
- Off unless the server runs with `--allow-client-shm true`: a client could otherwise make the server
  read or write any shared-memory segment the server's user may open.

Names, messages and statuses follow Triton's shared-memory manager (src/shared_memory_manager.cc).
"""

from __future__ import annotations

import base64
import mmap
import os
import stat
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorgate.codec.bytes_tensor import decode_bytes
from tensorgate.codec.datatypes import BY_V2
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.tensor import SHM_BYTE_SIZE as BYTE_SIZE
from tensorgate.codec.tensor import SHM_OFFSET as OFFSET
from tensorgate.codec.tensor import SHM_REGION as REGION
from tensorgate.codec.tensor import InferRequest, InferResponse, Tensor, in_shared_memory, tensor_bytes

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion

SYSTEM, CUDA = "system", "cuda"
DISABLED = (
    "client shared memory is disabled on this server: start it with --allow-client-shm true "
    "(off by default: a client could make the server read or write any segment it names)"
)


@dataclass
class Region:
    name: str
    kind: str  # SYSTEM or CUDA
    byte_size: int
    key: str = ""  # system: the shm_open key
    offset: int = 0  # system: where the region starts in the segment
    device_id: int = 0  # CUDA: the device the handle was made on
    memory: Any = None  # system: a writable memoryview of the region; CUDA: a device array of bytes

    def status(self) -> dict:
        if self.kind == SYSTEM:
            return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class SharedMemory:
    """The registered regions of both kinds (one namespace, as in Triton), and infer with them."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed
        self.regions: dict[str, Region] = {}
        self._lock = threading.Lock()  # gRPC and REST handlers share it; CUDA opens may run in threads

    # ------------------------------------------------------------------------------------- register

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        _check_sizes(name, offset, byte_size)
        with self._lock:
            self._check_new(name)
            path = "/dev/shm/" + key.lstrip("/")
            if not key or "/" in key.lstrip("/"):
                raise invalid(f"Unable to open shared memory region: '{key}'")
            try:  # as shm_open opens it: no symbolic link followed (one could name any file)
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except (OSError, ValueError):  # ValueError: a NUL in the key
                raise invalid(f"Unable to open shared memory region: '{key}'") from None
            try:
                status = os.fstat(fd)
                if not stat.S_ISREG(status.st_mode):
                    raise invalid(f"Unable to open shared memory region: '{key}'")
                size = status.st_size
                if offset + byte_size > size or byte_size == 0:
                    raise invalid(f"failed to register shared memory region '{name}': invalid args")
                mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            memory = memoryview(mapping)[offset : offset + byte_size]
            self.regions[name] = Region(name, SYSTEM, byte_size, key=key, offset=offset, memory=memory)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_allowed()
        _check_sizes(name, 0, byte_size)
        with self._lock:
            self._check_new(name)
            memory = _open_cuda_handle(name, raw_handle, device_id, byte_size)
            self.regions[name] = Region(name, CUDA, byte_size, device_id=device_id, memory=memory)

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise invalid(DISABLED)

    def _check_new(self, name: str) -> None:
        if name in self.regions:
            raise invalid(f"shared memory region '{name}' already in manager")

    # ------------------------------------------------------------------------------ status, unregister

    def status(self, kind: str, name: str = "") -> list[dict]:
        if not name:
            return [r.status() for r in self.regions.values() if r.kind == kind]
        region = self.regions.get(name)
        if region is None:
            what = "cuda" if kind == CUDA else "system"
            raise InferError(ErrorKind.NOT_FOUND, f"Unable to find {what} shared memory region: '{name}'")
        if region.kind != kind:
            other = "CUDA" if region.kind == CUDA else "system"
            wanted = "CUDA" if kind == CUDA else "system"
            raise InferError(
                ErrorKind.NOT_FOUND,
                f"The region named '{name}' is registered as {other} shared memory, "
                f"not {wanted} shared memory",
            )
        return [region.status()]

    def unregister(self, kind: str, name: str = "") -> None:
        """One region of `kind` by name (none of that name: nothing to do, as in Triton), or all of them."""
        self._check_allowed()
        with self._lock:
            names = [name] if name else [n for n, r in self.regions.items() if r.kind == kind]
            for gone in names:
                region = self.regions.get(gone)
                if region is not None and region.kind == kind:
                    del self.regions[gone]  # its memory stays mapped while a request views it

    # ------------------------------------------------------------------------------------------ infer

    async def infer(self, version: ModelVersion, request: InferRequest) -> InferResponse:
        """`version.infer(request)` with the request's shared-memory inputs read from their regions and
        its shared-memory outputs written into them (answered with no data and no parameters). The
        endpoints call it only for a request that names a region (`request.shared_memory`, set by the
        codec); any other goes straight to the model."""
        executor = version.executor
        on_host = executor is None or executor.staging.device == "cpu"
        for tensor in request.inputs:
            if tensor.data is None:
                tensor.data = self._input(tensor, on_host)
        targets = {
            o.name: self._target(o.name, o.parameters)
            for o in request.outputs or ()
            if in_shared_memory(o.parameters)
        }
        response = await version.infer(request)
        for i, tensor in enumerate(response.outputs):
            target = targets.get(tensor.name)
            if target is not None:
                response.outputs[i] = self._write(tensor, *target)
        return response

    def _input(self, tensor: Tensor, on_host: bool) -> Any:
        """A shared-memory input's data: a numpy view of its region; from a CUDA region, a device array
        for a model staged on a GPU (no host copy), else a copy on the host. BYTES are read in Triton's
        serialized form (each element a 4-byte little-endian length, then its bytes), filling the
        given byte size exactly."""
        region, offset, byte_size = self._place(tensor.name, "input", tensor.parameters)
        dtype = BY_V2[tensor.datatype]
        count = int(np.prod(tensor.shape))
        if dtype.v2 == "BYTES":
            raw = region.memory[offset : offset + byte_size]
            if region.kind == CUDA:
                raw = memoryview(raw.get().tobytes())
            what = f"input '{tensor.name}' in shared memory region '{region.name}'"
            return decode_bytes(raw, count, what).reshape(tensor.shape)
        if count * dtype.size != byte_size:
            raise invalid(
                f"input '{tensor.name}': shared_memory_byte_size {byte_size} does not match shape "
                f"{list(tensor.shape)} of {tensor.datatype} ({count * dtype.size} bytes)"
            )
        if region.kind == CUDA:
            array = region.memory[offset : offset + byte_size].view(dtype.numpy).reshape(tensor.shape)
            return array.get() if on_host else array
        view = np.frombuffer(region.memory, dtype=np.uint8, count=byte_size, offset=offset)
        return view.view(dtype.numpy).reshape(tensor.shape)

    def _target(self, name: str, parameters: dict) -> tuple[Region, int, int]:
        return self._place(name, "output", parameters)

    def _place(self, name: str, what: str, parameters: dict) -> tuple[Region, int, int]:
        """The region, offset and byte size a tensor's parameters name, checked against the region."""
        region_name = parameters.get(REGION)
        byte_size = parameters.get(BYTE_SIZE)
        offset = parameters.get(OFFSET, 0)
        if region_name is None or byte_size is None:
            raise invalid(
                f"{what} '{name}': shared_memory_region and shared_memory_byte_size must be given together"
            )
        if not isinstance(region_name, str):
            raise invalid(f"{what} '{name}': shared_memory_region must be a string")
        for key, value in ((BYTE_SIZE, byte_size), (OFFSET, offset)):
            if type(value) is not int or value < 0:
                raise invalid(f"{what} '{name}': {key} must be a non-negative integer, got {value!r}")
        self._check_allowed()
        region = self.regions.get(region_name)
        if region is None:
            raise invalid(f"Unable to find shared memory region: '{region_name}'")
        if offset >= region.byte_size and not (offset == 0 and byte_size == 0):
            raise invalid(f"Invalid offset for shared memory region: '{region_name}'")
        if offset + byte_size > region.byte_size:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{region_name}'")
        return region, offset, byte_size

    def _write(self, tensor: Tensor, region: Region, offset: int, byte_size: int) -> Tensor:
        data = tensor_bytes(tensor)
        if len(data) > byte_size:
            raise InferError(
                ErrorKind.INVALID_ARGUMENT,
                f"shared memory size specified with the request for output '{tensor.name}' ({byte_size} "
                f"bytes) should be at least {len(data)} bytes to hold the results",
            )
        if region.kind == CUDA:
            _copy_to_device(region.memory, offset, data)
        else:
            region.memory[offset : offset + len(data)] = data
        # Answered as Triton does: name, datatype and shape, no parameters. Triton's C++ HTTP client reads
        # `binary_data_size` from any output that has parameters.
        return Tensor(tensor.name, tensor.datatype, tensor.shape, None, {})


def _check_sizes(name: str, offset: int, byte_size: int) -> None:
    for key, value in (("offset", offset), ("byte_size", byte_size)):
        if type(value) is not int or value < 0:
            raise invalid(
                f"failed to register shared memory region '{name}': {key} must be a non-negative integer"
            )


def decode_handle(raw_handle: Any) -> bytes:
    """The bytes of a REST `raw_handle` ({"b64": ...})."""
    b64 = raw_handle.get("b64") if isinstance(raw_handle, dict) else None
    if not isinstance(b64, str):
        raise invalid("'raw_handle' must be an object with a base64 string 'b64'")
    try:
        return base64.b64decode(b64, validate=True)
    except ValueError:
        raise invalid("'raw_handle.b64' is not valid base64") from None


def _open_cuda_handle(name: str, raw_handle: bytes, device_id: int, byte_size: int) -> Any:
    """The client's device memory as a CuPy uint8 array of `byte_size` (torch's when CuPy is missing)."""
    try:
        import cupy
    except ImportError:
        raise invalid(
            f"failed to register CUDA shared memory region '{name}': CuPy is not installed "
            "(pip install 'tensorgate[gpu]')"
        ) from None
    try:
        with cupy.cuda.Device(device_id):
            pointer = cupy.cuda.runtime.ipcOpenMemHandle(raw_handle)
    except Exception:
        raise invalid("failed to register shared memory region: invalid args") from None
    # The memory keeps its owner alive, and every array viewing it keeps the memory: the handle is
    # closed once the region is unregistered and no request views it any more.
    memory = cupy.cuda.UnownedMemory(pointer, byte_size, _IpcMapping(cupy, pointer, device_id), device_id)
    return cupy.ndarray((byte_size,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))


class _IpcMapping:
    """The client's device memory opened in this process; closed (cudaIpcCloseMemHandle) when dropped."""

    def __init__(self, cupy: Any, pointer: int, device_id: int) -> None:
        self.cupy, self.pointer, self.device_id = cupy, pointer, device_id

    def __del__(self) -> None:
        try:
            with self.cupy.cuda.Device(self.device_id):
                self.cupy.cuda.runtime.ipcCloseMemHandle(self.pointer)
        except Exception:  # at interpreter exit CUDA may be gone already
            pass


def _copy_to_device(memory: Any, offset: int, data: Any) -> None:
    import cupy

    with memory.device:
        memory[offset : offset + len(data)].set(np.frombuffer(data, dtype=np.uint8))
        cupy.cuda.get_current_stream().synchronize()
