"""Shared memory between the server's processes: `Region`, one memfd that both sides map, grow and follow;
and over it, the arenas of the large tensors a worker and its engine exchange (`--workers`): one arena per
direction of each link, a reference-counted free list. (A python model's process has the other allocator
over a Region: server/backends/channel.py, a bump allocator per batch.)

A process writes only into its own arena and reads the other's. A tensor of INLINE_MAX bytes or more
travels as a descriptor (which arena, offset, length) instead of inside the message:
- the data already lies in an arena (a request body the worker's transport received into its arena, an
  output that is a view of an input): nothing is copied;
- otherwise it is copied into the sender's arena once.
The reader makes numpy arrays over the arena (writable: models may write their inputs). A region is free
again once the writer's own arrays over it are gone and the reader has said it let go of every view it
made of it (ipc.RELEASE, sent when the reader's last array over it is collected).
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tensorgate.codec.errors import ErrorKind, InferError

INLINE_MAX = 64 << 10  # smaller tensors travel inside the message (cheaper than a region and a release)
ALIGN = 64
MINE, YOURS = 0, 1  # a descriptor's arena, as its sender names it: the sender's own, or the receiver's


class Region:
    """One memfd mapped here. One side creates it (`fd` None) and passes the fd to the other; either may
    grow it (`reserve`, then its message says the new size) and the other maps it again (`follow`).
    Pages exist only once written."""

    def __init__(self, size: int, fd: int | None = None, name: str = "tensorgate") -> None:
        if fd is None:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)

    def reserve(self, size: int) -> None:
        """At least `size` bytes, growing the memfd (doubling, so that growth is rare)."""
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

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # arrays over it still live: it goes with the last of them
            self.map.close()
        os.close(self.fd)


def aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class Arena(Region):
    """A Region of fixed size whose spans are allocated and freed: how many holds each one in use has."""

    def __init__(self, size: int, fd: int | None = None) -> None:
        super().__init__(size, fd, "tensorgate-arena")
        self.address = np.frombuffer(self.map, np.uint8, 1).ctypes.data
        self.free_spans: list[tuple[int, int]] = [(0, size)]  # (offset, length), by offset
        self.starts: list[int] = []  # offsets of the regions in use, sorted
        self.regions: dict[int, list[int]] = {}  # offset -> [length, holds]

    @property
    def in_use(self) -> int:
        return sum(length for length, _ in self.regions.values())

    # ---- the writer's side

    def allocate(self, nbytes: int) -> np.ndarray:
        """A region of `nbytes`, as a uint8 array over it: held while that array (or a view of it) lives."""
        length = aligned(max(nbytes, 1))
        for index, (offset, free) in enumerate(self.free_spans):
            if free >= length:
                if free == length:
                    del self.free_spans[index]
                else:
                    self.free_spans[index] = (offset + length, free - length)
                break
        else:  # larger than the whole arena: never; else once the requests in flight are answered
            kind = ErrorKind.RESOURCE_EXHAUSTED if length > self.size else ErrorKind.UNAVAILABLE
            raise InferError(
                kind,
                f"the shared memory between this worker and the engine is full: {nbytes} bytes asked, "
                f"{self.in_use} of {self.size} in use (--worker-arena-bytes)",
            )
        bisect.insort(self.starts, offset)
        self.regions[offset] = [length, 0]
        return self.view(offset, nbytes)

    def region_of(self, offset: int) -> int:
        """The start of the region in use that holds `offset`."""
        start = self.starts[bisect.bisect_right(self.starts, offset) - 1]
        assert offset < start + self.regions[start][0], "offset outside every region in use"
        return start

    def hold(self, offset: int) -> None:
        self.regions[self.region_of(offset)][1] += 1

    def release(self, offset: int) -> None:
        start = self.region_of(offset)
        region = self.regions[start]
        region[1] -= 1
        if region[1] == 0:
            self._free(start, region[0])

    def _free(self, offset: int, length: int) -> None:
        del self.regions[offset]
        self.starts.remove(offset)
        index = bisect.bisect(self.free_spans, (offset, 0))
        self.free_spans.insert(index, (offset, length))
        if index + 1 < len(self.free_spans) and offset + length == self.free_spans[index + 1][0]:
            length += self.free_spans.pop(index + 1)[1]
            self.free_spans[index] = (offset, length)
        if index > 0 and self.free_spans[index - 1][0] + self.free_spans[index - 1][1] == offset:
            before = self.free_spans.pop(index - 1)
            self.free_spans[index - 1] = (before[0], before[1] + length)

    # ---- either side

    def view(self, offset: int, nbytes: int, on_gone: Callable[[int], None] | None = None) -> np.ndarray:
        """A uint8 array over [offset, offset + nbytes): every view made of it keeps it alive (numpy keeps
        the first array that is not over another array as their base). `on_gone(offset)` runs once all
        are collected; without it, this arena's own hold on the region is taken and then let go."""
        array = np.frombuffer(self.map, np.uint8, nbytes, offset)
        if on_gone is None:
            self.hold(offset)
            on_gone = self.release
        weakref.finalize(array, on_gone, offset).atexit = False
        return array

    def offset_of(self, data: np.ndarray) -> int | None:
        """Where `data` lies in this arena (C-contiguous, wholly inside), or None."""
        if not data.flags.c_contiguous:
            return None
        offset = data.__array_interface__["data"][0] - self.address
        return offset if offset >= 0 and offset + data.nbytes <= self.size else None


class LinkArenas:
    """One end of a link: the arena it writes, the one its peer writes, and how it tells the peer it let
    go of a region of the peer's (codec.ipc.Arenas)."""

    def __init__(self, mine: Arena, yours: Arena, send_release: Callable[[int], None]) -> None:
        self.mine = mine
        self.yours = yours
        self.send_release = send_release

    def place(self, data: Any) -> list | None:
        """A descriptor for tensor bytes that travel in shared memory, or None: inline in the message."""
        if (len(data) if type(data) is bytes else data.nbytes) < INLINE_MAX:
            return None
        array = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        nbytes = array.nbytes
        offset = self.mine.offset_of(array)
        if offset is not None:
            self.mine.hold(offset)  # the peer's, until it says it let go
            return [MINE, offset, nbytes]
        offset = self.yours.offset_of(array)
        if offset is not None:  # an array over the peer's own arena: it holds it from the message on
            return [YOURS, offset, nbytes]
        region = self.mine.allocate(nbytes)
        np.copyto(region, array.reshape(-1).view(np.uint8))
        offset = self.mine.offset_of(region)
        self.mine.hold(offset)
        return [MINE, offset, nbytes]

    def take(self, descriptor: list) -> np.ndarray:
        """The bytes a descriptor names, as a uint8 array over the arena."""
        which, offset, nbytes = descriptor
        if which == MINE:  # the sender's arena: tell it when every view of this is gone
            return self.yours.view(offset, nbytes, self.send_release)
        return self.mine.view(offset, nbytes)

    def allocate_body(self, size: int) -> np.ndarray | None:
        """A request body's buffer in this worker's arena (server/http/buffers.py), or None when full."""
        try:
            return self.mine.allocate(size)
        except InferError:
            return None

    def close(self) -> None:
        self.mine.close()
        self.yours.close()
