"""Runs a request's coroutine at once, and makes it a task only if it has to wait.

Most answers (health, metadata, an infer on a model executed inline) never wait: for them a task is pure
cost, its creation and a trip through the event loop's ready queue. Python 3.12's eager task factory
does the same; this is it for 3.11. The answers' bytes are still written at the end of the loop pass
(h1.py, h2.py): written at once, inside the read callback, each woke the client separately and cost
more than the task saved. Both together took a `simple` JSON infer over HTTP/1.1 from ~47 to ~35 us of
server CPU at full load (wrk -c16, the 2-core VM).
"""

import asyncio
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
    return loop.create_task(_resume(coro, waiting_on))


def step(coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> tuple[bool, Any]:
    """(True, its result) when `coro` finished without waiting (no task made), else (False, the task that
    runs the rest). What it raises before it first waits is raised here."""
    try:
        waiting_on = coro.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, loop.create_task(_resume(coro, waiting_on))


async def _resume(coro: Coroutine[Any, Any, Any], waiting_on: Any) -> Any:
    return await _Resumed(coro, waiting_on)


class _Resumed:
    """An awaitable that goes on with a coroutine already started: it first hands the task the future
    the coroutine is waiting on, then relays each result (or exception, cancellation included) back."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        self.coro = coro
        self.waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting_on = self.coro, self.waiting_on
        while True:
            try:
                value = yield waiting_on
            except BaseException as error:  # noqa: B036 - relayed to the coroutine, which decides
                try:
                    waiting_on = coro.throw(error)
                except StopIteration as finished:
                    return finished.value
            else:
                try:
                    waiting_on = coro.send(value)
                except StopIteration as finished:
                    return finished.value
