"""A count of work in progress and a wait for it to reach zero, shared by any number of waiters."""

import asyncio


class InFlight:
    """`enter` when work starts, `leave` when it ends; `wait_idle` returns once none is left.

    One Event, set exactly while the count is zero: every waiter wakes when the last piece of work ends.
    enter and leave are plain calls, cheap enough for the per-request path.
    """

    __slots__ = ("count", "_idle")

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        if not self.count:
            self._idle.clear()
        self.count += 1

    def leave(self, done: int = 1) -> None:
        """`done` pieces of work ended (several at once: a batch's requests)."""
        self.count -= done
        if not self.count:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()
