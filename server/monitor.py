"""grps's monitor: the server's and each model's metrics, per second, for the last minutes.

Once a second a timer on the event loop reads the same counters Triton's statistics and Prometheus
read (each ready version's `ModelStats`, batcher/stats.py) and turns their change into one point per
metric, so serving a request costs nothing more than the counting it already does (plus its latency
appended to a list, for the CDF). Metrics carry grps's names: `*qps`, `*fail_rate(%)`,
`*latency_avg(ms)`, `*latency_max(ms)`, `*latency_cdf(ms)` (p80, p90, p99, p99.9, p99.99 of the last
second), `*cpu_usage(%)` (of one core) and `*mem_usage(%)` of the process, `*mem_rss(MIB)`, and per GPU
`*gpu<i>_usage(%)` and `*gpu<i>_mem_usage(MIB)` when torch sees CUDA devices. A request to an ensemble
or a BLS model counts for it and for each model it calls, as in Triton's per-model counters.

Models add their own metrics through `app_monitor` (grps's API: `max`, `min`, `avg`, `inc`, `cdf`;
server/app_monitor.py), from any thread; `from grps_framework.monitor.monitor import app_monitor` finds
it too (server/backends/module.py). Everything is served as JSON by `GET /grps/v1/monitor/metrics`
(grps's path), drawn by the page at `/`, written by `--monitor-log` in grps_monitor.log's form, and the
models' own metrics are exported to Prometheus.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.ma  # noqa: F401 (np.percentile imports it on first use: ~9 ms on the event loop, paid at start instead)

from tensorgate.server.app_monitor import app_monitor
from tensorgate.server.statistics import ready_versions

if TYPE_CHECKING:
    from tensorgate.server.app_monitor import AppMonitor

log = logging.getLogger("tensorgate.monitor")

WINDOW = 300  # seconds of points kept per metric
CDF_PERCENTS = (80.0, 90.0, 99.0, 99.9, 99.99)
CDF_SUFFIXES = ("80", "90", "99", "999", "9999")  # grps_monitor.log's names for them
AGGREGATIONS = ("max", "min", "avg", "inc", "cdf")

QPS, FAIL_RATE, LATENCY_AVG, LATENCY_MAX, LATENCY_CDF = (
    "*qps",
    "*fail_rate(%)",
    "*latency_avg(ms)",
    "*latency_max(ms)",
    "*latency_cdf(ms)",
)
CPU_USAGE, MEM_USAGE, MEM_RSS = "*cpu_usage(%)", "*mem_usage(%)", "*mem_rss(MIB)"


def aggregate(aggregation: str, values: list) -> float | list | None:
    """One second of a metric: a number, the CDF points for cdf, None when nothing was recorded."""
    if aggregation == "inc":
        return float(sum(values))
    if not values:
        return None
    if aggregation == "max":
        return float(max(values))
    if aggregation == "min":
        return float(min(values))
    if aggregation == "avg":
        return float(sum(values) / len(values))
    return [[p, float(v)] for p, v in zip(CDF_PERCENTS, np.percentile(values, CDF_PERCENTS), strict=True)]


class _Counts:
    """What one version's counters read at the last tick."""

    __slots__ = ("success", "fail", "success_ns", "queue_ns", "infer_ns", "batches")

    def __init__(self, stats: Any = None) -> None:
        if stats is None:  # nothing counted yet
            self.success = self.fail = self.success_ns = self.queue_ns = self.infer_ns = 0
            self.batches: dict[int, int] = {}
            return
        self.success = stats.success.count
        self.fail = stats.fail.count
        self.success_ns = stats.success.ns
        self.queue_ns = stats.queue.ns
        self.infer_ns = stats.compute_infer.ns
        self.batches = {size: b.compute_infer.count for size, b in stats.batch_stats.items()}


_ZERO = _Counts()


class Monitor:
    def __init__(self, repository: Any, log_path: Path | None = None, app: AppMonitor = app_monitor) -> None:
        self.repository = repository
        self.log_path = log_path
        self.app = app
        self.series: dict[str, deque] = {}  # metric -> (unix time, value) points
        self.cdfs: dict[str, list] = {}  # cdf metric -> its last second's [[percent, value], ...]
        self.kinds: dict[str, str] = {}  # metric -> aggregation (the models' own; built-ins named here)
        self.models: dict[tuple[str, str], dict[str, deque]] = {}  # (model, version) -> its series
        self._last: dict[int, _Counts] = {}  # id(ModelStats) -> counters at the last tick
        self._cpu = self._cpu_seconds()
        self._wall = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None
        self._sampled = False

    # ------------------------------------------------------------------------------------------ clock

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._handle = loop.call_later(1.0, self._tick, loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_later(1.0, self._tick, loop)
        try:
            self.sample(time.time())
        except Exception:  # the monitor must never take the server down
            log.exception("the monitor could not sample its metrics")

    # --------------------------------------------------------------------------------------- sampling

    def sample(self, now: float) -> None:
        """Adds one point to every metric: the change of the counters since the last sample."""
        wall = time.monotonic()
        elapsed = max(wall - self._wall, 1e-3)
        self._wall = wall
        success = fail = success_ns = 0
        latencies: list[int] = []
        versions = ready_versions(self.repository)
        for version in versions:
            stats = version.stats
            counts = _Counts(stats)
            # a version loaded later counts from its first sample (a reload's counters carry the old
            # version's); at the first sample every version counts from zero: what was served since start
            before = self._last.get(id(stats)) or (counts if self._sampled else _ZERO)
            self._last[id(stats)] = counts
            success += counts.success - before.success
            fail += counts.fail - before.fail
            success_ns += counts.success_ns - before.success_ns
            latencies.extend(stats.take_latencies())
            series = self.models.setdefault((version.name, version.version_str), _model_series())
            _add_model_point(series, now, elapsed, counts, before)
        self._sampled = True
        live = {id(v.stats) for v in versions}
        self._last = {key: counts for key, counts in self._last.items() if key in live}
        names = {(v.name, v.version_str) for v in versions}
        self.models = {key: series for key, series in self.models.items() if key in names}
        total = success + fail
        self._add(now, QPS, total / elapsed)
        self._add(now, FAIL_RATE, 100.0 * fail / total if total else 0.0)
        self._add(now, LATENCY_AVG, success_ns / success / 1e6 if success else 0.0)
        self._add(now, LATENCY_MAX, max(latencies) / 1e6 if latencies else 0.0)
        self.cdfs[LATENCY_CDF] = aggregate("cdf", [ns / 1e6 for ns in latencies]) or _zero_cdf()
        cpu = self._cpu_seconds()
        self._add(now, CPU_USAGE, 100.0 * (cpu - self._cpu) / elapsed)
        self._cpu = cpu
        rss = _rss_bytes()
        self._add(now, MEM_USAGE, 100.0 * rss / _total_memory())
        self._add(now, MEM_RSS, rss / 2**20)
        for name, value in _gpu_metrics().items():
            self._add(now, name, value)
        kinds, values = self.app.take()
        self.kinds.update(kinds)
        for name, aggregation in kinds.items():
            value = aggregate(aggregation, values.get(name, []))
            if aggregation == "cdf":
                if value is not None:
                    self.cdfs[name] = value
            elif value is not None:
                self._add(now, name, value)
        if self.log_path is not None:
            self._write_log()

    def _add(self, now: float, name: str, value: float) -> None:
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = deque(maxlen=WINDOW)
        series.append((now, round(value, 4)))

    @staticmethod
    def _cpu_seconds() -> float:
        times = os.times()
        return times.user + times.system

    # ---------------------------------------------------------------------------------------- answers

    def last(self) -> dict[str, float]:
        """Every metric's last value, under grps_monitor.log's names (a cdf as name_80 ... name_9999)."""
        out = {name: points[-1][1] for name, points in self.series.items() if points}
        for name, points in self.cdfs.items():
            for suffix, (_, value) in zip(CDF_SUFFIXES, points, strict=True):
                out[f"{name}_{suffix}"] = value
        return out

    def snapshot(self) -> dict:
        """What `GET /grps/v1/monitor/metrics` answers (see docs/operations/monitor.md)."""
        metrics: dict[str, dict] = {
            name: {"label": "trend", "data": [[t, v] for t, v in points]}
            for name, points in self.series.items()
        }
        for name, points in self.cdfs.items():
            metrics[name] = {"label": "cdf", "data": points}
        models = []
        for entry in self.repository.index():
            key = (entry["name"], entry.get("version", ""))
            series = self.models.get(key)
            model = {k: entry.get(k, "") for k in ("name", "version", "state", "reason")}
            if series is not None:
                for name in ("qps", "queue_us", "compute_us"):
                    model[name] = [[t, round(v, 3)] for t, v in series[name]]
                model["requests"] = sum(n for _, n in series["requests"])
                histogram: dict[int, int] = {}
                for _, counts in series["batches"]:
                    for size, n in counts.items():
                        if n:
                            histogram[size] = histogram.get(size, 0) + n
                model["batch_sizes"] = {str(size): histogram[size] for size in sorted(histogram)}
            models.append(model)
        return {
            "now": time.time(),
            "window_s": WINDOW,
            "metrics": metrics,
            "custom": dict(self.kinds),
            "models": models,
        }

    def _write_log(self) -> None:
        """grps_monitor.log: rewritten every second with each metric's last value."""
        lines = "".join(f"{name} : {value:.2f}\n" for name, value in self.last().items())
        try:
            self.log_path.write_text(lines)
        except OSError as e:
            log.error("cannot write the monitor log %s: %s", self.log_path, e)


def _add_model_point(
    series: dict[str, deque], now: float, elapsed: float, counts: _Counts, before: _Counts
) -> None:
    """One second of one model version: requests, requests/s, queue and compute time per request, and
    the batches executed by size."""
    done = counts.success - before.success
    answered = done + counts.fail - before.fail
    series["requests"].append((now, answered))
    series["qps"].append((now, answered / elapsed))
    series["queue_us"].append((now, (counts.queue_ns - before.queue_ns) / done / 1e3 if done else 0.0))
    series["compute_us"].append((now, (counts.infer_ns - before.infer_ns) / done / 1e3 if done else 0.0))
    batches = {size: n - before.batches.get(size, 0) for size, n in counts.batches.items()}
    series["batches"].append((now, batches))


def _model_series() -> dict[str, deque]:
    return {name: deque(maxlen=WINDOW) for name in ("requests", "qps", "queue_us", "compute_us", "batches")}


def _zero_cdf() -> list:
    return [[p, 0.0] for p in CDF_PERCENTS]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 40


def _gpu_metrics() -> dict[str, float]:
    """Per CUDA device the server's torch uses: utilisation (when pynvml answers) and memory in use."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch.version, "cuda", None) or not torch.cuda.is_initialized():
        return {}
    out = {}
    for index in range(torch.cuda.device_count()):
        try:
            free, total = torch.cuda.mem_get_info(index)
            out[f"*gpu{index}_mem_usage(MIB)"] = (total - free) / 2**20
            out[f"*gpu{index}_usage(%)"] = float(torch.cuda.utilization(index))
        except Exception:  # no pynvml: memory only
            continue
    return out
