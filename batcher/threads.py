"""The worker threads a model version's instances execute in (batcher/execution.py: in_thread backends and
models staged on a GPU): one per instance, each taking the next call from one queue and handing its
result back to the event loop with a single call_soon_threadsafe.

asyncio's run_in_executor over a ThreadPoolExecutor did the same through a concurrent.futures Future (its
Condition, its callbacks, a second future chained to it): on the 2-core VM that Python was most of a
hand-off, and a Triton python model executed in a thread answered `simple` at ~3.6k req/s."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any


def _settle(future: asyncio.Future, failed: bool, outcome: Any) -> None:
    if future.cancelled():  # the caller went away; the thread ran on regardless
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class Threads:
    def __init__(self, count: int, name: str, initializer: Callable[[], None] = lambda: None) -> None:
        self.count = count
        self.name = name
        self.initializer = initializer
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.starting = threading.Lock()  # the first call may come from the loop or a loading thread

    def submit(self, function: Callable[[Any], Any], argument: Any) -> asyncio.Future:
        """`function(argument)` in one of the threads; the future of its result, on the running loop.
        Cancelling the future does not stop the call."""
        self._start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.calls.put((loop, future, function, argument))
        return future

    def run(self, function: Callable[[Any], Any], argument: Any) -> Any:
        """Blocking, from a thread that is not the event loop's (warmup at load): `function(argument)` in
        one of the threads, its result."""
        done = concurrent.futures.Future()
        self._start()
        self.calls.put((None, done, function, argument))
        return done.result()

    def _serve(self) -> None:
        self.initializer()
        while (call := self.calls.get()) is not None:
            loop, future, function, argument = call
            try:
                outcome, failed = function(argument), False
            except BaseException as e:  # the caller gets it, as it would in one thread
                outcome, failed = e, True
            if loop is None:  # run(): a thread waits on it
                if failed:
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
                continue
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, failed, outcome)
            del call, future, outcome  # nothing of the last call stays alive while the thread waits

    def _start(self) -> None:
        with self.starting:
            if not self.threads:
                for index in range(self.count):
                    thread = threading.Thread(target=self._serve, name=f"{self.name}_{index}", daemon=True)
                    thread.start()
                    self.threads.append(thread)

    def close(self) -> None:
        """The threads end once the calls queued before this have run."""
        for _ in self.threads:
            self.calls.put(None)
        self.threads = []
