"""Wake-ups at exact times for the open loop: a Linux timerfd on the event loop (epoll wakes when it
fires, to the microsecond), because the loop's own timers have a millisecond's grain (libuv's, under
uvloop) and a pacer sleeping in them would charge every request up to a millisecond of its own lateness.
Elsewhere, the loop's timers."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable

CLOCK_MONOTONIC, TFD_CLOEXEC, TFD_NONBLOCK, TFD_TIMER_ABSTIME = 1, 0o2000000, 0o4000, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create  # noqa: B018 (present?)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


class Pacer:
    """Calls `tick()` at (or just after) each time `at(t)` asks for, `t` on time.perf_counter's clock
    (CLOCK_MONOTONIC on Linux)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: Callable[[], None]) -> None:
        self.loop = loop
        self.tick = tick
        self.fd = -1
        self.handle: asyncio.TimerHandle | None = None
        if _LIBC is not None and time.get_clock_info("perf_counter").implementation.startswith(
            "clock_gettime(CLOCK_MONOTONIC"
        ):
            fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)
            if fd >= 0:
                self.fd = fd
                loop.add_reader(fd, self._fired)

    def at(self, when: float) -> None:
        if self.fd >= 0:
            whole = int(when)
            spec = _Itimerspec(_Timespec(0, 0), _Timespec(whole, max(1, int((when - whole) * 1e9))))
            _LIBC.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None)  # type: ignore[union-attr]
        else:
            self.handle = self.loop.call_later(max(0.0, when - time.perf_counter()), self.tick)

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)
        self.tick()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if self.handle is not None:
            self.handle.cancel()
