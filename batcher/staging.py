"""Host <-> device staging: gathers the rows of a batch into one array per input, where the model runs.

A Staging turns the per-request arrays of one input into the batch array the backend executes on, and the
backend's outputs back into host arrays that the batcher splits per request (views, no copy).
`make_staging(config)` picks one per model version:

- `HostStaging`: numpy in, numpy out (the default; a single part is handed over as is).
- `TorchHostStaging`: CPU torch tensors sharing memory with the numpy batch (`torch.from_numpy`), outputs
  back as numpy views (`.numpy()`).
- `DeviceStaging` (batcher/device.py): CUDA. Rows gathered into reusable pinned buffers, one copy to the
  device per batch, outputs back through pinned memory; torch tensors or CuPy arrays, as the config asks,
  exchanged through DLPack, never through the host. The model runs in worker threads, each with its own
  compute stream.

Which one: `instance_group { kind: KIND_GPU gpus: [...] }` asks for the GPU (the first listed, else 0),
KIND_AUTO / KIND_MODEL take it (and read `gpus` the same way) when one is present, KIND_CPU (the default
without instance_group) keeps the host. The array type comes from the config parameter `array_module`
(numpy | torch | cupy, default numpy); the pytorch backend always gets torch tensors. numpy arrays always
stay on the host. Each choice that leaves an asked-for GPU unused is logged as a warning saying why.
"""

import logging
from typing import Any, NamedTuple, Protocol

import numpy as np

from tensorgate.batcher.arrays import (
    cast_tensor,
    concatenate,
    config_types,
    import_torch,
    in_config_dtype,
    tensor_to_numpy,
)
from tensorgate.batcher.device import DeviceStaging

log = logging.getLogger("tensorgate.staging")

ARRAY_MODULES = ("numpy", "torch", "cupy")
GPU_KINDS = ("KIND_GPU", "KIND_AUTO", "KIND_MODEL")


class Staging(Protocol):
    device: str  # "cpu" or "cuda:N": where the arrays the backend receives live
    array_module: str  # "numpy", "torch" or "cupy"
    blocking: bool  # gather / to_host wait on a device: the batcher then runs the model in worker threads

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        """One batch array for input `name`: `parts` concatenated along dimension 0, in order."""
        ...

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """The backend's outputs as host arrays (numpy; one device-to-host copy per output on a GPU).

        Values that are not arrays of the staging's kind (numpy arrays, lists) pass through unchanged.
        """
        ...

    def enter_thread(self) -> None:
        """Once in each worker thread, before its first batch: the device and a compute stream of the
        thread's own become current there."""
        ...

    def finished(self) -> None:
        """Returns once the work execute queued on the calling thread's device has run."""
        ...

    def close(self) -> None:
        """The model is unloaded: buffers and cached device memory are released."""
        ...


class _OnTheHost:
    """What host stagings answer to the device calls: nothing to wait for, set up or release."""

    device = "cpu"
    blocking = False

    def enter_thread(self) -> None:
        pass

    def finished(self) -> None:
        pass

    def close(self) -> None:
        pass


class HostStaging(_OnTheHost):
    array_module = "numpy"

    def gather(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        return concatenate(parts)

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
    """(device, warning): "cuda:N" or "cpu" for a model whose arrays are of `module`, and what of the
    instance_group is not honoured and why ("" when nothing is amiss). Raises for a GPU id not present."""
    groups = config.get("instance_group") or []
    chosen = gpu_group(groups)
    if chosen is None:
        return "cpu", ""
    group = f"instance_group '{chosen.get('name', '')}'"
    asked = chosen.get("kind") == "KIND_GPU"
    if module == "numpy":
        if not asked:
            return "cpu", ""
        return "cpu", (
            f"{group} asks for KIND_GPU but the model's array_module is numpy, which lives on the host; "
            "running on the CPU (array_module torch or cupy runs on the GPU)"
        )
    count, why = cuda_devices(module)
    if not count:
        return "cpu", f"{group} asks for KIND_GPU but {why}; running on the CPU" if asked else ""
    gpus = chosen.get("gpus") or [0]
    if not 0 <= gpus[0] < count:
        raise ValueError(f"{group} asks for GPU {gpus[0]} but {count} CUDA device(s) are present")
    notes = []
    if len(gpus) > 1:
        notes.append(f"{group} lists GPUs {list(gpus)}; its instances all run on GPU {gpus[0]}")
    idle = [f"'{g.get('name', '')}'" for g in groups if g is not chosen]
    if idle:
        notes.append(f"instance_group {', '.join(idle)} not run beside {group} on cuda:{gpus[0]}")
    if notes:
        notes.append("a model runs on one device here")
    return f"cuda:{gpus[0]}", "; ".join(notes)


def gpu_group(groups: list[dict]) -> dict | None:
    """The instance group that may put a model on a GPU: the first KIND_GPU, else the first KIND_AUTO or
    KIND_MODEL (None: the host it is)."""
    for kinds in (("KIND_GPU",), ("KIND_AUTO", "KIND_MODEL")):
        found = next((g for g in groups if g.get("kind") in kinds), None)
        if found is not None:
            return found
    return None


class Placement(NamedTuple):
    """One model instance as Triton creates it: its name, kind ("CPU", "GPU" or "MODEL"), device id, and
    the instance group it comes from."""

    name: str
    kind: str
    device_id: int
    group: dict


def placements(config: dict) -> list[Placement]:
    """Every instance the instance groups ask for, in Triton's order (core backend_model.cc): each group,
    `count` instances named <group>_<n>, and a KIND_GPU group's each on every GPU it lists (all of them
    with the same name, as Triton names them). KIND_AUTO is the host's here."""
    out = []
    for group in config.get("instance_group") or [{}]:
        kind = group.get("kind", "KIND_CPU")
        for n in range(group.get("count", 1)):
            name = f"{group.get('name') or config.get('name', '')}_{n}"
            if kind == "KIND_GPU":
                out += [Placement(name, "GPU", gpu, group) for gpu in group.get("gpus") or [0]]
            else:
                out.append(Placement(name, "MODEL" if kind == "KIND_MODEL" else "CPU", 0, group))
    return out


def instance_count(config: dict, device: str) -> int:
    """How many batches of the model execute at once (a worker thread each): on a GPU, the count of the
    group that put it there; on the host, every instance of every group (`placements`)."""
    if device == "cpu":
        return len(placements(config))
    return (gpu_group(config.get("instance_group") or [{}]) or {}).get("count", 1)


def cuda_devices(module: str) -> tuple[int, str]:
    """(number of CUDA devices `module` can use, why there are none)."""
    if module == "torch":
        torch = import_torch()
        if torch.version.cuda is None:
            return 0, f"torch {torch.__version__} is a CPU-only build (install its CUDA build to use a GPU)"
        return (torch.cuda.device_count() if torch.cuda.is_available() else 0), "no CUDA device is present"
    try:
        import cupy
    except ImportError:
        return 0, "cupy is not installed"
    try:
        return cupy.cuda.runtime.getDeviceCount(), "no CUDA device is present"
    except Exception as e:  # cupy raises its CUDARuntimeError when there is no driver
        return 0, f"no CUDA device is usable ({e})"


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


# ------------------------------------------------------------------------------------------- CPU torch


class TorchHostStaging(_OnTheHost):
    """CPU torch tensors over the numpy batch, without a copy where numpy allows it.

    A part that is read-only (a view of an immutable request body) or not C-contiguous is copied first: a
    torch tensor has no read-only flag, and a model may write into its inputs in place.
    """

    array_module = "torch"

    def __init__(self, config: dict) -> None:
        self.torch = torch = import_torch()
        self._types = config_types(config, "input")
        self._inputs = {n: getattr(torch, t.torch) for n, t in self._types.items()}
        self._outputs = {n: getattr(torch, t.torch) for n, t in config_types(config, "output").items()}

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        if parts[0].dtype == object:
            return concatenate(parts)
        array = concatenate(in_config_dtype(name, parts, self._types.get(name)))
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
                value = cast_tensor(value.detach().cpu(), self._outputs.get(name))
                value = tensor_to_numpy(self.torch, value)
            host[name] = value
        return host
