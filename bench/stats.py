"""Per-request bookkeeping shared by the load generators, the progress line, and the summary."""

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np


class Recorder:
    """Counts completions and keeps latencies (seconds) for one scenario.

    `record` is the only call on the hot path: one list append and two integer bumps.
    """

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ok = 0
        self.errors = 0
        self.started = time.perf_counter()
        self.stopped: float | None = None

    def record(self, latency: float, ok: bool) -> None:
        if self.stopped is not None:
            return
        self.latencies.append(latency)
        if ok:
            self.ok += 1
        else:
            self.errors += 1

    def error(self) -> None:
        """A failure with no latency to report (connection refused or lost)."""
        if self.stopped is None:
            self.errors += 1

    def reset(self) -> None:
        """Drop everything recorded so far: called when the warmup ends."""
        self.latencies = []
        self.ok = 0
        self.errors = 0
        self.started = time.perf_counter()

    def stop(self) -> None:
        if self.stopped is None:
            self.stopped = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return (self.stopped or time.perf_counter()) - self.started


@dataclass
class Summary:
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


def summarize(rec: Recorder) -> Summary:
    seconds = rec.elapsed
    if rec.latencies:
        p50, p90, p99 = np.percentile(np.asarray(rec.latencies), [50, 90, 99]) * 1e3
    else:
        p50 = p90 = p99 = float("nan")
    return Summary(
        requests=rec.ok,
        errors=rec.errors,
        seconds=seconds,
        rps=rec.ok / seconds if seconds > 0 else 0.0,
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
    )


async def show_progress(name: str, rec: Recorder, t0: float, interval: float = 0.5) -> None:
    """Rewrite one stderr line every `interval` s until cancelled: scenario, elapsed, count, current rate."""
    last_count, last_t = 0, time.perf_counter()
    try:
        while True:
            await asyncio.sleep(interval)
            now = time.perf_counter()
            count = rec.ok + rec.errors
            if count < last_count:  # the warmup just ended and the counters were reset
                last_count = 0
            rate = (count - last_count) / (now - last_t)
            last_count, last_t = count, now
            phase = "run" if rec.started > t0 else "warmup"
            sys.stderr.write(
                f"\r{name:<10} {phase:<6} {now - t0:6.1f}s {count:>9} req {rate:>9.0f} req/s"
                f"  errors {rec.errors}"
            )
            sys.stderr.flush()
    finally:
        sys.stderr.write("\r" + " " * 78 + "\r")
        sys.stderr.flush()


async def drive(
    name: str,
    rec: Recorder,
    load: "asyncio.Task[None]",
    warmup: float,
    duration: float,
    clocks: dict[str, Callable[[], float]] | None = None,
    warmed: Callable[[], Awaitable[object]] | None = None,
) -> tuple[Summary, dict[str, float]]:
    """Let `load` run for warmup + duration, measuring only the second part, then cancel it.

    `clocks` are CPU-seconds counters (this process, the server's pid); the second value returned is how
    many cores each kept busy during the measured part. `warmed` is awaited when the warmup ends, before
    the measured part starts (the load goes on meanwhile).
    """
    clocks = clocks or {}
    t0 = time.perf_counter()
    progress = asyncio.create_task(show_progress(name, rec, t0))
    try:
        await asyncio.sleep(warmup)
        if warmed is not None:
            await warmed()
        rec.reset()
        start = {key: clock() for key, clock in clocks.items()}
        await asyncio.sleep(duration)
        rec.stop()
        busy = {key: (clock() - start[key]) / rec.elapsed for key, clock in clocks.items()}
    finally:
        progress.cancel()
        load.cancel()
        outcomes = await asyncio.gather(progress, load, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, Exception):  # a bug in a load generator, not a server failure
            raise outcome
    return summarize(rec), busy
