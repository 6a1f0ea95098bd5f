"""Helpers of the GPU tests (tests/test_gpu_staging.py, tests/test_e2e_gpu.py): marks, and ways to delay a
stream and watch what ran. Nothing here touches CUDA or imports CuPy at import time."""

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from test_staging import cuda_available, needs

from tensorgate.batcher.device import DeviceStaging

SLEEP = 100_000_000  # GPU cycles: ~50 ms on an H100 (~2 GHz), far longer than the Python between steps


def gpu_test(module: str) -> Callable:
    """Marks a test `gpu`, skipped cleanly where `module` has no CUDA device (test_staging.needs)."""

    def mark(test: Callable) -> Callable:
        for decorator in needs(module):
            test = decorator(test)
        return test

    return mark


def gpu_count() -> int:
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()


# Two GPUs: not `gpu` (a one-GPU run with TENSORGATE_REQUIRE_GPU=1 must not fail them), run by -m multi_gpu.
TWO_GPUS = [pytest.mark.multi_gpu, pytest.mark.skipif(gpu_count() < 2, reason="needs two CUDA devices")]


def multi_gpu_test(test: Callable) -> Callable:
    for decorator in TWO_GPUS:
        test = decorator(test)
    return test


# ------------------------------------------------------------------------------------------- helpers

SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


@functools.cache
def spin_kernel() -> Any:
    import cupy

    return cupy.RawKernel(SPIN_SOURCE, "spin")


def delay(module: str, stream: Any = None, cycles: int = SLEEP) -> None:
    """Queues `cycles` of busy GPU work on `stream` (None: the current stream) and returns at once."""
    if module == "torch":
        import torch

        with torch.cuda.stream(stream):  # None: a no-op
            torch.cuda._sleep(cycles)
    else:
        with stream if stream is not None else contextlib.nullcontext():
            spin_kernel()((1,), (1,), (np.int64(cycles),))


def record(module: str) -> Any:
    """An event recorded on the current stream now."""
    if module == "torch":
        import torch

        event = torch.cuda.Event()
        event.record()
        return event
    import cupy

    return cupy.cuda.get_current_stream().record()


def pending(event: Any) -> bool:
    """Whether the work before a CUDA event (torch's or CuPy's) has yet to run."""
    return not (event.done if hasattr(event, "done") else event.query())


def to_numpy(array: Any) -> np.ndarray:
    """A device array on the host, copied on the current stream after what is queued there."""
    return array.get() if hasattr(array, "get") else array.cpu().numpy()


@contextlib.contextmanager
def as_worker(staging: DeviceStaging) -> Iterator[None]:
    """This thread set up as the batcher sets up its worker threads (`staging.enter_thread()`: the
    staging's device, and a compute stream of its own current), undone on leaving.

    The race tests run in the test's own thread this way rather than in a new one: torch's CUDA sanitizer
    (test_sanitizer_...) only sees the kernels of the thread it was enabled in.
    """
    import torch

    index = torch.device(staging.device).index
    device, stream = torch.cuda.current_device(), torch.cuda.current_stream(index)
    cupy_stream = None
    if staging.array_module == "cupy":
        import cupy

        with cupy.cuda.Device(index):  # the stream current there (newer CuPy keeps one per device)
            cupy_stream = cupy.cuda.get_current_stream()
    staging.enter_thread()
    try:
        yield
    finally:
        if cupy_stream is not None:
            with cupy.cuda.Device(index):
                cupy_stream.use()
        torch.cuda.set_stream(stream)
        torch.cuda.set_device(device)  # the CUDA runtime's current device, CuPy's too
