"""Runs a request's coroutine at once, and makes it a task only if it has to wait.

Most answers (health, metadata, an infer on a model executed inline) never wait: for them a task is pure
cost, its creation and a trip through the event loop's ready queue. Python 3.12's eager task factory
does the same; this is it for 3.11. The answers' bytes are still written at the end of the loop pass
(h1.py, h2.py): written at once, inside the read callback, each woke the client separately and cost
more than the task saved. Both together took a `simple` JSON infer over HTTP/1.1 from ~47 to ~35 us of
server CPU at full load (wrk -c16, the 2-core VM).
"""

import asyncio
import collections.abc
import logging
from collections.abc import Coroutine, Generator
from typing import Any

log = logging.getLogger("tensorgate.http")


def start(coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
    """Steps `coro` until it first waits; None when it finished, else the task that runs the rest (cancel
    it to cancel the coroutine)."""
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    except Exception:
        log.exception("unexpected error answering a request")
        return None
    return loop.create_task(_Resumed(coro, waiting_on))


def step(coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> tuple[bool, Any]:
    """(True, its result) when `coro` finished without waiting (no task made), else (False, the task that
    runs the rest). What it raises before it first waits is raised here."""
    try:
        waiting_on = coro.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, loop.create_task(_Resumed(coro, waiting_on))


_STARTED = object()


class _Resumed(collections.abc.Coroutine):
    """A coroutine already started, as a task's coroutine: its first step hands the task the future the
    coroutine waits on; every later send, throw and close goes straight to the coroutine. A task
    cancelled before its first step throws into it too, so the coroutine always learns it was cancelled
    (a plain `async def` wrapper would end without starting and leave it suspended: its finally blocks,
    a model's stream among them, then ran only when the garbage collector closed it; the fuzzer found
    that)."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self.coro = coro
        self.waiting_on = waiting_on

    def send(self, value: Any) -> Any:
        waiting_on = self.waiting_on
        if waiting_on is not _STARTED:
            self.waiting_on = _STARTED
            return waiting_on
        return self.coro.send(value)

    def throw(self, error: Any, value: Any = None, traceback: Any = None) -> Any:
        self.waiting_on = _STARTED
        if value is None and traceback is None:
            return self.coro.throw(error)
        return self.coro.throw(error, value, traceback)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        raise TypeError("_Resumed is a task's coroutine; it is not awaited")
