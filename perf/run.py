"""The measurement: each load level run by every load process at once, in windows, until stable.

Windows: with `--duration S`, one window of S seconds after `--warmup`; otherwise perf_analyzer's way,
windows of `--measurement-interval` ms until the last three agree within `--stability-percentage` (their
requests/s and their p50 latency each within that percent of the three's mean), at most `--max-trials`
windows; the level's figures are those three windows merged (or the last three, marked unstable).

Load processes: `--workers N` starts N processes (spawned), each with its share of the concurrency or
the rate and connections of its own; this process only tells them when a window ends and adds up what
they counted (their histograms merge exactly). `--workers 1` runs the load in this process.

The server's own view, where it has the statistics extension (KServe v2 over REST or gRPC): its counts
and cumulative queue and compute times read at each window's edge; a level reports their differences
over its measured windows, per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorgate.perf.hdr import Histogram
from tensorgate.perf.load import Load, Target, Window


@dataclass
class Level:
    concurrency: int = 0  # closed loop
    rate: float = 0.0  # open loop, requests/s
    poisson: bool = False

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency else f"rate {self.rate:g}/s"


@dataclass
class Windows:
    duration: float = 0.0  # > 0: one window this long
    warmup: float = 1.0
    interval: float = 5.0  # s, stability windows
    stability: float = 10.0  # percent
    max_trials: int = 10


@dataclass
class Result:
    """One level's figures against one server."""

    level: Level
    target: str
    seconds: float
    ok: int
    errors: Counter
    histogram: Histogram
    client_cpu: float
    stable: bool
    windows: int
    delayed: int = 0
    server: dict[str, float] = field(default_factory=dict)  # per request, µs; and its request count
    sent: int = 0  # every request of the level (warmup and windows not measured included)
    answered: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        latency = {k: round(v, 1) for k, v in self.histogram.summary().items()}
        doc: dict[str, Any] = {"target": self.target}
        if self.level.concurrency:
            doc["concurrency"] = self.level.concurrency
        else:
            doc["request_rate"] = self.level.rate
            doc["distribution"] = "poisson" if self.level.poisson else "constant"
            doc["delayed_sends"] = self.delayed
        doc.update(
            requests_per_s=round(self.requests_per_s, 1),
            requests=self.ok,
            errors=sum(self.errors.values()),
            errors_by_kind=dict(self.errors),
            latency_us=latency,
            seconds=round(self.seconds, 3),
            windows=self.windows,
            stable=self.stable,
            client_cpu_us_per_request=round(
                self.client_cpu / max(1, self.ok + sum(self.errors.values())) * 1e6, 1
            ),
            sent=self.sent,
            answered=self.answered,
            failed=self.failed,
        )
        if self.server:
            doc["server"] = self.server
        return doc


# ---------------------------------------------------------------------------------- the load processes


class Local:
    """The load in this process."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.load: Load | None = None

    async def start(self, level: Level, share: float, seed: int) -> None:
        self.load = Load(self.target)
        if level.concurrency:
            await self.load.start_closed(int(share))
        else:
            await self.load.start_open(share, level.poisson, seed)

    async def swap(self) -> Window:
        return self.load.swap()  # type: ignore[union-attr]

    async def stop(self) -> dict:
        return await self.load.stop()  # type: ignore[union-attr]

    def close(self) -> None:
        pass


async def _readable(loop: asyncio.AbstractEventLoop, connection: Any) -> None:  # noqa: ANN401
    """Until a pipe has something to read."""
    ready = loop.create_future()
    loop.add_reader(connection.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(connection.fileno())


def _worker_main(connection: Any, target_bytes: bytes) -> None:  # noqa: ANN401
    """A load process: runs `Local` on commands from its parent, answering each."""
    target = pickle.loads(target_bytes)  # noqa: S301 (from our own parent)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    local = Local(target)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        while True:
            await _readable(loop, connection)
            command, *args = connection.recv()
            if command == "start":
                await local.start(*args)
                connection.send(None)
            elif command == "swap":
                connection.send((await local.swap()).to_wire())
            elif command == "stop":
                connection.send(await local.stop())
            else:
                return

    with runner:
        runner.run(serve())


class Remote:
    """The load in a process of its own."""

    def __init__(self, target: Target) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(theirs, pickle.dumps(target)), daemon=True)
        self.process.start()
        theirs.close()

    async def _ask(self, *command: Any) -> Any:  # noqa: ANN401
        self.connection.send(command)
        await _readable(asyncio.get_running_loop(), self.connection)
        try:
            return self.connection.recv()
        except EOFError:
            raise RuntimeError(
                f"load process {self.process.pid} died (exit {self.process.exitcode})"
            ) from None

    async def start(self, level: Level, share: float, seed: int) -> None:
        await self._ask("start", level, share, seed)

    async def swap(self) -> Window:
        return Window.from_wire(await self._ask("swap"))

    async def stop(self) -> dict:
        return await self._ask("stop")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.send(("exit",))
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()


def shares(level: Level, workers: int) -> list[float]:
    """Each process's part of the concurrency (whole slots) or of the rate."""
    if level.concurrency:
        count = min(workers, level.concurrency)
        return [level.concurrency // count + (i < level.concurrency % count) for i in range(count)]
    return [level.rate / workers] * workers


# ---------------------------------------------------------------------------------- one level


async def run_level(
    runners: list[Local | Remote],
    level: Level,
    windows: Windows,
    label: str,
    stats: Callable[[], Any] | None,
    progress: Any = None,  # noqa: ANN401 (a tqdm bar, or None)
) -> Result:
    parts = shares(level, len(runners))
    active = runners[: len(parts)]
    await asyncio.gather(
        *(r.start(level, share, seed) for seed, (r, share) in enumerate(zip(active, parts, strict=True)))
    )
    snapshots: list[Any] = []
    measured: list[list[Window]] = []  # each window: one per process

    async def window(seconds: float, keep: bool) -> None:
        await asyncio.sleep(seconds)
        parts_ = list(await asyncio.gather(*(r.swap() for r in active)))
        if keep:
            measured.append(parts_)
            snapshots.append(await stats() if stats is not None else None)
        if progress is not None:
            ok = sum(w.ok for w in parts_)
            rate = ok / max(1e-9, max(w.seconds for w in parts_))
            progress.set_postfix_str(f"{label}: {rate:,.0f} req/s, window {len(measured)}")

    try:
        await window(windows.warmup, False)
        snapshots.append(await stats() if stats is not None else None)
        if windows.duration > 0:
            await window(windows.duration, True)
            chosen, stable = measured, True
        else:
            stable = False
            while len(measured) < windows.max_trials:
                await window(windows.interval, True)
                if len(measured) >= 3 and _stable(measured[-3:], windows.stability):
                    stable = True
                    break
            chosen = measured[-3:]
    finally:
        ended = await asyncio.gather(*(r.stop() for r in active))
    merged = Histogram()
    ok, errors, cpu, seconds, delayed = 0, Counter(), 0.0, 0.0, 0
    for parts_ in chosen:
        seconds += sum(w.seconds for w in parts_) / len(parts_)
        for w in parts_:
            merged.add(w.histogram)
            ok += w.ok
            errors.update(w.errors)
            cpu += w.cpu
            delayed += w.delayed
    result = Result(level, label, seconds, ok, errors, merged, cpu, stable, len(measured), delayed)
    result.sent = sum(e["sent"] for e in ended)
    result.answered = sum(e["answered"] for e in ended)
    result.failed = dict(sum((Counter(e["failed"]) for e in ended), Counter()))
    if stats is not None:
        first = snapshots[len(snapshots) - len(chosen) - 1]
        last = snapshots[-1]
        if first is not None and last is not None:
            result.server = server_view(first, last)
    return result


def _stable(last: list[list[Window]], percent: float) -> bool:
    rates, p50s = [], []
    for parts in last:
        merged = Histogram()
        for w in parts:
            merged.add(w.histogram)
        seconds = sum(w.seconds for w in parts) / len(parts)
        rates.append(sum(w.ok for w in parts) / seconds)
        p50s.append(merged.percentile(50))
    for values in (rates, p50s):
        mean = sum(values) / len(values)
        if not mean or any(abs(v - mean) > mean * percent / 100 for v in values):
            return False
    return True


def server_view(before: dict, after: dict) -> dict[str, float]:
    """The server's statistics over a span: its successful requests and, per request, its queue and
    compute times in µs (the KServe statistics extension's cumulative counts and nanoseconds)."""
    count = after["success_count"] - before["success_count"]
    view: dict[str, float] = {"requests": count, "failures": after["fail_count"] - before["fail_count"]}
    if count > 0:
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            view[f"{key}_us"] = round((after[key] - before[key]) / count / 1000, 1)
    return view


def start_runners(target: Target, workers: int) -> list[Local | Remote]:
    if workers <= 1:
        return [Local(target)]
    return [Remote(target) for _ in range(workers)]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
