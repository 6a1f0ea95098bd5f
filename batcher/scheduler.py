"""How a model version's requests reach its backend.

This is the batcher's entry point. Without `dynamic_batching` every request executes alone, which is
all this module does for now; batch forming is built on the same interface.
"""

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

Arrays = dict[str, Any]


class DirectScheduler:
    """Executes each request alone, at most `instances` at once (instance_group count)."""

    def __init__(self, execute: Callable[[Arrays], Any], instances: int = 1) -> None:
        self._execute = execute
        self._slots = asyncio.Semaphore(instances)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def run(self, inputs: Arrays) -> Arrays:
        self._in_flight += 1
        self._idle.clear()
        try:
            async with self._slots:
                outputs = self._execute(inputs)
                if inspect.isawaitable(outputs):
                    outputs = await outputs
                return outputs
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def drain(self) -> None:
        """Waits until no request is executing or queued."""
        await self._idle.wait()
