"""Time for the batcher: a clock it reads and sets timers on, so tests can drive time by hand.

Times are integer nanoseconds on a monotonic scale; `call_later` runs a callback on the event loop.
"""

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ns(self) -> int: ...

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Timer: ...


class MonotonicClock:
    """The real clock: time.monotonic_ns, with timers on the running event loop."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay_ns / 1e9, callback)


class _ManualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to (`advance`), firing the timers that fall due, in order."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now = start_ns
        self._timers: list[tuple[int, int, _ManualTimer, Callable[[], None]]] = []
        self._order = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer()
        heapq.heappush(self._timers, (self._now + max(0, delay_ns), next(self._order), timer, callback))
        return timer

    def advance(self, ns: int) -> None:
        """Moves time forward by `ns`, running each timer due on the way at its own time."""
        end = self._now + ns
        while self._timers and self._timers[0][0] <= end:
            due, _, timer, callback = heapq.heappop(self._timers)
            self._now = max(self._now, due)
            if not timer.cancelled:
                callback()
        self._now = end
