"""The one buffer a request body (or a large gRPC message) is received into."""

from collections.abc import Callable

import numpy as np

LARGE_BODY = 1 << 20  # bodies from this size are received into numpy memory
# In a front-end worker (--workers): its arena, the shared memory the engine reads its tensors from
# (server/arena.py), so a large body's tensors reach the engine without a copy. None when full.
shared: Callable[[int], np.ndarray | None] | None = None


def body_buffer(size: int, first: bytes | memoryview) -> memoryview:
    """A buffer for a request body of `size` bytes, `first` (what came so far) already in it. From a MiB
    it is numpy memory: not zeroed, and numpy asks the kernel for transparent huge pages, so 64 MiB fill
    in ~10 ms instead of ~50 ms of page faults."""
    region: np.ndarray | bytearray | None = (
        shared(size) if shared is not None and size >= LARGE_BODY else None
    )
    if region is None:
        region = np.empty(size, dtype=np.uint8) if size >= LARGE_BODY else bytearray(size)
    buffer = memoryview(region)  # type: ignore[arg-type]  # numpy's stubs: ndarray.__buffer__ from 3.12
    buffer[: len(first)] = first
    return buffer
