"""How a model version's requests reach its backend.

This is the batcher's entry point. Without `dynamic_batching` every request executes alone, which is
all this module does for now; batch forming is built on the same interface.
"""

import asyncio
from collections.abc import Callable
from typing import Any

Arrays = dict[str, Any]


class DirectScheduler:
    """Executes each request alone.

    A plain `execute` runs to completion on the event loop, so requests never overlap: that suits the
    small numpy models the python backend serves, and costs no thread hand-off. An `async def execute`
    runs with at most `instances` (instance_group count) in flight at once.
    """

    def __init__(self, execute: Callable[[Arrays], Any], is_async: bool, instances: int = 1) -> None:
        self._execute = execute
        self._is_async = is_async
        self._slots = asyncio.Semaphore(instances)
        self._in_flight = 0
        self._drained: asyncio.Event | None = None

    async def run(self, inputs: Arrays) -> Arrays:
        if not self._is_async:
            return self._execute(inputs)
        self._in_flight += 1
        try:
            async with self._slots:
                return await self._execute(inputs)
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._drained is not None:
                self._drained.set()

    async def drain(self) -> None:
        """Waits until no request is executing or waiting to execute."""
        if self._in_flight:
            self._drained = asyncio.Event()
            await self._drained.wait()
