"""The worker threads models execute in (batcher/threads.py): one per instance, results and exceptions
back on the event loop, a caller that goes away does not stop its call, and a loading thread can wait on
one (warmup)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tensorgate.batcher.threads import Threads


def test_calls_run_in_as_many_threads_as_instances_and_answer_on_the_loop() -> None:
    started = []
    threads = Threads(2, "test", lambda: started.append(threading.current_thread().name))
    both = threading.Barrier(2, timeout=5)  # passes only if two calls run at once

    def meet(value: int) -> tuple[int, str]:
        both.wait()
        return value * 2, threading.current_thread().name

    async def main() -> list:
        return await asyncio.gather(threads.submit(meet, 1), threads.submit(meet, 2))

    (one, first), (two, second) = asyncio.run(main())
    assert (one, two) == (2, 4) and first != second
    assert sorted(started) == ["test_0", "test_1"]  # each thread set up once
    threads.close()


def test_an_exception_reaches_the_caller() -> None:
    threads = Threads(1, "test")

    def fail(_: object) -> None:
        raise ValueError("13 is unlucky")

    async def main() -> None:
        with pytest.raises(ValueError, match="13 is unlucky"):
            await threads.submit(fail, None)

    asyncio.run(main())
    threads.close()


def test_a_cancelled_caller_leaves_its_call_running_and_the_thread_serving() -> None:
    threads = Threads(1, "test")
    release, ran = threading.Event(), []

    def slow(value: int) -> int:
        release.wait(5)
        ran.append(value)
        return value

    async def main() -> int:
        first = threads.submit(slow, 1)
        await asyncio.sleep(0.05)
        first.cancel()
        release.set()
        return await threads.submit(slow, 2)

    assert asyncio.run(main()) == 2
    assert ran == [1, 2]
    threads.close()


def test_a_thread_that_is_not_the_loop_waits_on_a_call() -> None:
    threads = Threads(1, "test")
    assert threads.run(lambda value: value + 1, 41) == 42
    with pytest.raises(ZeroDivisionError):
        threads.run(lambda value: value / 0, 1)
    threads.close()
