"""What both load generators share: connecting with retries, and running connection loops until cancelled."""

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from bench.stats import Recorder


async def connect(
    factory: Callable[[], asyncio.Protocol], host: str, port: int, rec: Recorder
) -> tuple[asyncio.BaseTransport, Any]:
    """A connection to host:port; each refused attempt counts as an error and is retried."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return await loop.create_connection(factory, host, port)
        except OSError:
            rec.error()
            await asyncio.sleep(0.1)


async def run_until_cancelled(loops: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Runs the connection loops as tasks; when cancelled, cancels them and waits for them to end."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
