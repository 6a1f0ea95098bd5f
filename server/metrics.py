"""Prometheus metrics on their own port (`GET /metrics`), with Triton's names, so its dashboards work.

A prometheus_client collector reads each ready model version's `ModelStats` at scrape time: serving a
request costs nothing more. The text is Triton's: counters named without a `_total` suffix
(`nv_inference_request_success{model="m",version="1"} 3`). prometheus_client's own writer would append
`_total` to every counter sample (the OpenMetrics convention), renaming Triton's series, so the few
lines that write the classic text format (0.0.4) are here.

The port is a second listener in the same process and event loop, with its own one-route router: the
inference endpoints and their hot path know nothing of it.

Beside Triton's series, prometheus_client's standard `python_gc_*` counters say how often the cycle
collector ran and how many objects it freed, in the process that answers (the engine, with `--workers`):
serving a request should leave it nothing (its pauses land in the latency's tail). And the memory of each
of the server's processes (the engine, each `--workers` worker, each python model's process), read from
/proc at scrape time: resident (RSS, shared pages counted in each) and proportional (PSS: a page shared by
n processes counts 1/n in each, so the processes' PSS add up to what the server costs the machine).

Triton's other series, as its dashboards read them: failures by `reason`; with `--metrics-config`, the
first-response histogram (buckets from the config's `model_metrics`) and the latency summaries, observed
as each request's stats are recorded (`ModelStats.observer`); with `--allow-cpu-metrics` and
`--allow-gpu-metrics`, the machine's, read by a thread every `--metrics-interval-ms`; the pinned memory
pool's gauges; and what python models record with `pb_utils.MetricFamily` (server/backends/custom_metrics.py).
"""

from __future__ import annotations

import argparse
import bisect
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.errors import ErrorKind, InferError, http_status
from tensorgate.server.backends import custom_metrics
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response
from tensorgate.server.statistics import ready_versions

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.monitor import Monitor
    from tensorgate.server.repository import Repository

log = logging.getLogger("tensorgate.metrics")

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
PLAIN = b"text/plain; charset=utf-8"  # the 404 and 405 answers
METRICS_PATH = "/metrics"

APP_METRIC = "tensorgate_app_metric"
RESIDENT = "tensorgate_process_resident_memory_bytes"
PROPORTIONAL = "tensorgate_process_proportional_memory_bytes"
RESTARTS = "tensorgate_python_instance_restarts"  # ours: a process-mode python model's (a counter)
PENDING = "nv_inference_pending_request_count"  # a gauge: requests in the model's queue now
FAILURE = "nv_inference_request_failure"  # labelled `reason` too: Triton's FailureReason (batcher/stats.py)
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# Triton's per model version counters (core src/metrics.cc): name, HELP text, what it counts.
COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda s: s.success.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
)
# The cumulative durations, unless --metrics-config counter_latencies=false.
LATENCY_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: s.success.ns // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s.compute_output.ns // 1000,
    ),
)


# Triton's per model counters of the response cache (core src/metrics.cc), for versions that use it.
CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.cache_hit.count),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: s.cache_hit.ns // 1000,
    ),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.cache_miss.count),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: s.cache_miss.ns // 1000,
    ),
)


class ModelMetrics:
    """A prometheus_client collector: Triton's counters for every ready model version, labelled
    `model` and `version`, and with --metrics-config its histograms and summaries."""

    def __init__(self, repository: Repository, settings: Settings | None = None) -> None:
        self.repository = repository
        self.settings = settings or Settings()

    def collect(self) -> Iterator[Metric]:
        versions = ready_versions(self.repository)
        latencies = LATENCY_COUNTERS if self.settings.counter_latencies else ()
        for name, documentation, read in COUNTERS + latencies:
            family = Metric(name, documentation, "counter")
            for version in versions:
                family.add_sample(
                    name, {"model": version.name, "version": version.version_str}, read(version.stats)
                )
            yield family
        failure = Metric(FAILURE, "Number of failed inference requests, all batch sizes", "counter")
        for version in versions:
            for reason in REASONS:
                labels = {"model": version.name, "version": version.version_str, "reason": reason}
                failure.add_sample(FAILURE, labels, failures(version.stats)[reason])
        yield failure
        yield from observed(versions)
        cached = [version for version in versions if version.cache is not None]
        for name, documentation, read in CACHE_COUNTERS if cached and latencies else ():
            family = Metric(name, documentation, "counter")
            for version in cached:
                family.add_sample(
                    name, {"model": version.name, "version": version.version_str}, read(version.stats)
                )
            yield family
        pending = Metric(
            PENDING, "Instantaneous number of pending requests awaiting execution per-model.", "gauge"
        )
        for version in versions:
            queued = version.scheduler.pending if version.scheduler is not None else 0
            pending.add_sample(PENDING, {"model": version.name, "version": version.version_str}, queued)
        yield pending
        processes = [v for v in versions if v.backend is not None and v.backend.restarts is not None]
        if processes:
            family = Metric(RESTARTS, "Python model instances restarted after their process died", "counter")
            for version in processes:
                labels = {"model": version.name, "version": version.version_str}
                family.add_sample(RESTARTS, labels, version.backend.restarts)
            yield family


def failures(stats: ModelStats) -> dict[str, int]:
    """The failures by reason; a build whose compiled batcher/stats.py predates them: all BACKEND."""
    found = getattr(stats, "failures", None)
    return found if found is not None else {**dict.fromkeys(REASONS, 0), "BACKEND": stats.fail.count}


class ProcessMemory:
    """A prometheus_client collector: the memory of this process and of its children, by their role."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    def collect(self) -> Iterator[Metric]:
        resident = Metric(RESIDENT, "Resident memory of each process of the server, in bytes", "gauge")
        proportional = Metric(
            PROPORTIONAL,
            "Proportional set size (shared pages split between their sharers), in bytes",
            "gauge",
        )
        for pid, role in self.processes():
            sizes = self.sizes(pid)
            if sizes is None:
                continue  # gone meanwhile
            labels = {"process": role, "pid": str(pid)}
            resident.add_sample(RESIDENT, labels, sizes[0])
            proportional.add_sample(PROPORTIONAL, labels, sizes[1])
        yield resident
        yield proportional

    def processes(self) -> list[tuple[int, str]]:
        """This process ("engine") and its children, each named by what it runs."""
        found = [(os.getpid(), "engine")]
        me = str(os.getpid())
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                if parent != me:
                    continue
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError):
                continue
            if b"--worker-of" in command:
                found.append((int(entry.name), "worker"))
            elif any(b"tensorgate.server.backends.stub" in part for part in command):
                found.append((int(entry.name), "python_model"))
        return found

    def sizes(self, pid: int) -> tuple[int, int] | None:
        """(RSS, PSS) in bytes, from /proc/PID/smaps_rollup."""
        try:
            text = (self.proc / str(pid) / "smaps_rollup").read_text()
        except OSError:
            return None
        fields = {}
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name in ("Rss", "Pss"):
                fields[name] = int(value.split()[0]) * 1024  # kB
        return fields.get("Rss", 0), fields.get("Pss", 0)


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of every family, each sample under the name it carries."""
    lines: list[str] = []
    for family in registry.collect():
        kind = "untyped" if family.type == "unknown" else family.type
        name = family.name
        if kind == "counter" and family.samples and all(s.name == name + "_total" for s in family.samples):
            name += "_total"  # prometheus_client's own counters (python_gc_*): named as their samples are
        lines.append(f"# HELP {name} {_escape(family.documentation, quote=False)}")
        lines.append(f"# TYPE {name} {kind}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sample.labels.items())
            value = str(sample.value) if isinstance(sample.value, int) else floatToGoString(sample.value)
            lines.append(f"{sample.name}{{{labels}}} {value}" if labels else f"{sample.name} {value}")
    return ("\n".join(lines) + "\n").encode()


def _escape(text: str, quote: bool = True) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if quote else text


class AppMetrics:
    """A prometheus_client collector: the metrics models record through app_monitor (server/monitor.py),
    their last second's value as a gauge labelled with the metric's grps name and aggregation (a cdf
    as one sample per point, labelled `quantile`)."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        family = Metric(APP_METRIC, "A metric a model records (grps app_monitor), its last second", "gauge")
        for name, aggregation in sorted(self.monitor.kinds.items()):
            labels = {"name": name, "aggregation": aggregation}
            if aggregation == "cdf":
                for percent, value in self.monitor.cdfs.get(name, ()):
                    family.add_sample(APP_METRIC, {**labels, "quantile": f"{percent / 100:g}"}, value)
            elif self.monitor.series.get(name):
                family.add_sample(APP_METRIC, labels, self.monitor.series[name][-1][1])
        yield family


# ------------------------------------------------------------------------------ --metrics-config

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)  # Triton's default (core metric_model_reporter.h)
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
SUMMARY_KEPT = 100_000  # observations kept per age bucket; beyond, a uniform sample of them


@dataclass
class Settings:
    """What the metrics page serves, from --metrics-config, --allow-cpu-metrics, --allow-gpu-metrics
    and --metrics-interval-ms."""

    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    max_age_s: float = 60.0  # prometheus-cpp's summary window, which Triton keeps
    age_buckets: int = 5
    cpu: bool = False
    gpu: bool = False
    interval_s: float = 2.0


def settings_from(args: argparse.Namespace) -> Settings:
    """The Settings of a command line. Triton's way with bad values: each is logged, its default kept."""
    settings = Settings(
        cpu=args.allow_cpu_metrics,
        gpu=args.allow_gpu_metrics,
        interval_s=max(args.metrics_interval_ms, 1.0) / 1000,
    )
    for entry in args.metrics_config:
        setting, equals, value = entry.partition("=")
        if not equals:
            log.error("--metrics-config %s: expected <setting>=<value>", entry)
        elif setting in ("counter_latencies", "histogram_latencies", "summary_latencies"):
            # As Triton reads them: counters go only with "false", the others come only with "true".
            default = setting == "counter_latencies"
            setattr(settings, setting, value != "false" if default else value == "true")
        elif setting == "summary_quantiles":
            settings.quantiles = _quantiles(value) or settings.quantiles
        elif setting in ("summary_max_age", "summary_age_buckets"):
            try:
                number = float(value) if setting == "summary_max_age" else int(value)
            except ValueError:
                number = 0
            if number <= 0:
                log.error("--metrics-config %s: expected a positive number", entry)
            elif setting == "summary_max_age":
                settings.max_age_s = float(number)
            else:
                settings.age_buckets = int(number)
        else:
            log.warning("--metrics-config %s: unknown setting, ignored", entry)
    return settings


def _quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`0.5:0.05,0.9:0.01`, pairs Triton cannot read logged with its texts and left out."""
    pairs = []
    for pair in text.split(","):
        quantile, colon, error = pair.partition(":")
        if not colon:
            log.error(
                "Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", pair
            )
            continue
        try:
            pairs.append((float(quantile), float(error)))
        except ValueError as e:
            log.error("Invalid option: [%s]. Error: %s", pair, e)
    return tuple(pairs)


configured = Settings()  # the server's, set by configure() before the metrics port is built


def configure(args: argparse.Namespace) -> None:
    """Reads the command line's metrics settings, for `metrics_router` (server/engine.py)."""
    global configured
    configured = settings_from(args)


class Histogram:
    """Cumulative buckets (`le`), sum and count, as Prometheus histograms are."""

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        at = bisect.bisect_left(self.bounds, value)
        if at < len(self.counts):
            self.counts[at] += 1
        self.sum += value
        self.count += 1

    def samples(self, name: str, labels: dict[str, str]) -> Iterator[tuple[str, dict[str, str], float]]:
        yield name + "_count", labels, self.count
        yield name + "_sum", labels, self.sum
        total = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            total += count
            yield name + "_bucket", {**labels, "le": _bound(bound)}, total
        yield name + "_bucket", {**labels, "le": "+Inf"}, self.count


class Window:
    """A summary's quantiles over its last max_age, as prometheus-cpp ages them: observations go to the
    newest of `age_buckets` slots, each max_age / age_buckets long; quantiles are exact over the slots
    still in the window (prometheus-cpp's estimate within its error is never needed)."""

    def __init__(self, max_age_s: float, age_buckets: int) -> None:
        self.max_age = max_age_s
        self.step = max_age_s / age_buckets
        self.slots: deque[list[Any]] = deque(maxlen=age_buckets)  # [start, values, seen]
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        now = time.monotonic()
        if not self.slots or now - self.slots[-1][0] >= self.step:
            self.slots.append([now, [], 0])
        slot = self.slots[-1]
        slot[2] += 1
        if len(slot[1]) < SUMMARY_KEPT:
            slot[1].append(value)
        else:  # reservoir sampling: each observation of the slot kept with the same chance
            at = random.randrange(slot[2])
            if at < SUMMARY_KEPT:
                slot[1][at] = value
        self.sum += value
        self.count += 1

    def quantile(self, values: list[float], q: float) -> float:
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    def samples(
        self, name: str, labels: dict[str, str], quantiles: tuple[tuple[float, float], ...]
    ) -> Iterator[tuple[str, dict[str, str], float]]:
        since = time.monotonic() - self.max_age
        values = sorted(v for slot in self.slots if slot[0] >= since for v in slot[1])
        for q, _ in quantiles:
            yield name, {**labels, "quantile": _bound(q)}, self.quantile(values, q)
        yield name + "_sum", labels, self.sum
        yield name + "_count", labels, self.count


def _bound(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


# Triton's summaries (core src/metrics.cc): name, HELP text, and which of a request's times (µs).
SUMMARIES = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached requests)"),  # noqa: E501
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached requests)"),  # noqa: E501
    ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include cached requests)"),  # noqa: E501
    ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not include cached requests)"),  # noqa: E501
    ("nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)"),  # noqa: E501
)  # fmt: skip
CACHE_SUMMARIES = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds."),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds."),
)  # fmt: skip


class Latencies:
    """A version's histograms and summaries (ModelStats.observer): each request observed as its stats
    record it. Which ones: --metrics-config; the histogram's buckets: the config's model_metrics."""

    def __init__(self, settings: Settings, config: dict, cached: bool) -> None:
        self.settings = settings
        self.first_response = None
        if settings.histogram_latencies:
            self.first_response = Histogram(histogram_buckets(config, FIRST_RESPONSE, FIRST_RESPONSE_BUCKETS))
        self.summaries: dict[str, Window] = {}
        if settings.summary_latencies:
            names = [name for name, _ in SUMMARIES]
            if (
                cached
            ):  # Triton leaves the request summary out with the cache (it would mislead), adds its own
                names = names[1:] + [name for name, _ in CACHE_SUMMARIES]
            self.summaries = {name: Window(settings.max_age_s, settings.age_buckets) for name in names}

    def request(self, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One answered request. Its first response is its answer (a stream's: its end)."""
        if self.first_response is not None:
            self.first_response.observe(total_ns / 1e6)
        if self.summaries:
            times = (total_ns, queue_ns, input_ns, infer_ns, output_ns)
            for (name, _), ns in zip(SUMMARIES, times, strict=True):
                window = self.summaries.get(name)
                if window is not None:
                    window.observe(ns / 1000)

    def cache_hit(self, ns: int) -> None:
        if self.first_response is not None:
            self.first_response.observe(ns / 1e6)
        if "nv_cache_hit_summary_per_model" in self.summaries:
            self.summaries["nv_cache_hit_summary_per_model"].observe(ns / 1000)

    def cache_miss(self, ns: int) -> None:
        if "nv_cache_miss_summary_per_model" in self.summaries:
            self.summaries["nv_cache_miss_summary_per_model"].observe(ns / 1000)


def histogram_buckets(config: dict, family: str, default: tuple[float, ...]) -> list[float]:
    """A histogram's buckets: the config's `model_metrics { metric_control [...] }` for `family`, else
    the default. Triton warns of a family it cannot customize, and so do we."""
    buckets = list(default)
    for control in (config.get("model_metrics") or {}).get("metric_control") or ():
        name = (control.get("metric_identifier") or {}).get("family", "")
        if name != family:
            log.warning(
                "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.",
                name,
            )
            continue
        given = (control.get("histogram_options") or {}).get("buckets") or []
        try:
            buckets = sorted(float(b) for b in given)
        except (TypeError, ValueError):
            log.warning("model '%s': model_metrics buckets %r are not numbers", config.get("name"), given)
    return buckets


def observe(repository: Repository, settings: Settings) -> None:
    """Gives each ready version without one its Latencies."""
    for version in ready_versions(repository):
        if getattr(version.stats, "observer", None) is None:
            version.stats.observer = Latencies(settings, version.config, version.cache is not None)


def observed(versions: list[ModelVersion]) -> Iterator[Metric]:
    """The families of the versions' Latencies, labelled `model` and `version`."""
    watched = [
        (v, v.stats.observer) for v in versions if isinstance(getattr(v.stats, "observer", None), Latencies)
    ]
    if not watched:
        return
    if any(latencies.first_response is not None for _, latencies in watched):
        family = Metric(
            FIRST_RESPONSE, "Duration from request to first response in milliseconds", "histogram"
        )
        for version, latencies in watched:
            if latencies.first_response is not None:
                labels = {"model": version.name, "version": version.version_str}
                for sample in latencies.first_response.samples(FIRST_RESPONSE, labels):
                    family.add_sample(*sample)
        yield family
    for name, documentation in SUMMARIES + CACHE_SUMMARIES:
        windows = [(v, latencies.summaries[name]) for v, latencies in watched if name in latencies.summaries]
        if not windows:
            continue
        family = Metric(name, documentation, "summary")
        for version, window in windows:
            labels = {"model": version.name, "version": version.version_str}
            quantiles = watched[0][1].settings.quantiles
            for sample in window.samples(name, labels, quantiles):
                family.add_sample(*sample)
        yield family


# ------------------------------------------------------------------ polled: CPU, GPU, pinned memory

PINNED_TOTAL = "nv_pinned_memory_pool_total_bytes"
PINNED_USED = "nv_pinned_memory_pool_used_bytes"


class Polled:
    """A prometheus_client collector: what a thread reads every --metrics-interval-ms, as Triton polls
    it: the CPU's utilization and memory from /proc (--allow-cpu-metrics), each GPU's from NVML
    (--allow-gpu-metrics; none where NVML or a GPU is missing), and the pinned memory pool's gauges
    (always; 0, as we keep no pinned pool)."""

    def __init__(self, settings: Settings, proc: Path = Path("/proc")) -> None:
        self.settings = settings
        self.proc = proc
        self.families: list[Metric] = []
        self.last_cpu: list[int] = []
        self.nvml: Any = None
        self.gpus: list[tuple[Any, str, float]] = []  # (handle, uuid, energy at start in mJ)
        if settings.gpu:
            self._open_nvml()
        self.poll()
        if settings.cpu or self.gpus:
            threading.Thread(target=self._run, name="metrics-poll", daemon=True).start()

    def collect(self) -> Iterator[Metric]:
        yield from self.families
        total = Metric(PINNED_TOTAL, "Pinned memory pool total memory size, in bytes", "gauge")
        total.add_sample(PINNED_TOTAL, {}, 0)
        used = Metric(PINNED_USED, "Pinned memory pool used memory size, in bytes", "gauge")
        used.add_sample(PINNED_USED, {}, 0)
        yield total
        yield used

    def _run(self) -> None:
        while True:
            time.sleep(self.settings.interval_s)
            self.poll()

    def poll(self) -> None:
        families = []
        if self.settings.cpu:
            families += self._cpu()
        if self.gpus:
            families += self._gpu()
        self.families = families  # one assignment: a scrape sees one poll's values

    def _cpu(self) -> list[Metric]:
        """Triton's: utilization since the last poll from /proc/stat's first line, memory from
        /proc/meminfo (used = MemTotal - MemAvailable); 0 where they cannot be read."""
        utilization = 0.0
        try:
            fields = (self.proc / "stat").read_text().splitlines()[0].split()
            ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        except (OSError, IndexError, ValueError):
            ticks = []
        if len(ticks) == 8:
            last = self.last_cpu or [0] * 8
            diff = [max(new - old, 0) for new, old in zip(ticks, last, strict=True)]
            busy = diff[0] + diff[1] + diff[2] + diff[5] + diff[6] + diff[7]
            idle = diff[3] + diff[4]
            utilization = busy / (busy + idle) if busy + idle else 0.0
            self.last_cpu = ticks
        memory = {}
        try:
            for line in (self.proc / "meminfo").read_text().splitlines():
                name, _, value = line.partition(":")
                memory[name] = int(value.split()[0]) * 1024
        except (OSError, IndexError, ValueError):
            memory = {}
        total, available = memory.get("MemTotal", 0), memory.get("MemAvailable", 0)
        used = total - available if available <= total else 0
        return [
            _gauge("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", [({}, utilization)]),
            _gauge("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", [({}, total)]),
            _gauge("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", [({}, used)]),
        ]

    def _open_nvml(self) -> None:
        try:
            import pynvml  # nvidia-ml-py, the gpu extra

            pynvml.nvmlInit()
            gpus = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                gpus.append((handle, uuid, self._energy(pynvml, handle)))
        except Exception as e:  # no nvidia-ml-py, no driver, no GPU
            log.info("--allow-gpu-metrics: no GPU metrics: NVML is not available (%s)", e)
            return
        if not gpus:
            log.info("--allow-gpu-metrics: no GPU metrics: NVML sees no GPU")
        self.nvml, self.gpus = pynvml, gpus

    @staticmethod
    def _energy(nvml: Any, handle: Any) -> float:
        try:
            return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))  # mJ
        except Exception:
            return math.nan  # not supported by this GPU

    def _gpu(self) -> list[Metric]:
        """Triton's GPU gauges, per GPU, labelled `gpu_uuid`; a value NVML cannot read is left out."""
        nvml = self.nvml
        reads: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name, _, _ in GPU_METRICS}
        for handle, uuid, energy_at_start in self.gpus:
            labels = {"gpu_uuid": uuid}
            readers: dict[str, Callable[[], float]] = {
                "nv_gpu_utilization": lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100,
                "nv_gpu_memory_total_bytes": lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h).total,
                "nv_gpu_memory_used_bytes": lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h).used,
                "nv_gpu_power_usage": lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000,
                "nv_gpu_power_limit": lambda h=handle: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
                "nv_energy_consumption": lambda h=handle, e=energy_at_start: (
                    (self._energy(nvml, h) - e) / 1e3
                ),
            }
            for name, read in readers.items():
                try:
                    value = float(read())
                except Exception:
                    continue
                if not math.isnan(value):
                    reads[name].append((labels, value))
        return [_family(name, help_, kind, reads[name]) for name, help_, kind in GPU_METRICS if reads[name]]


GPU_METRICS = (  # Triton's (core src/metrics.cc): name, HELP text, type
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge"),
    ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter"),
)


def _family(name: str, documentation: str, kind: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    family = Metric(name, documentation, kind)
    for labels, value in samples:
        family.add_sample(name, labels, value)
    return family


def _gauge(name: str, documentation: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    return _family(name, documentation, "gauge", samples)


class CustomMetrics:
    """A prometheus_client collector: the families python models make with pb_utils.MetricFamily
    (server/backends/custom_metrics.py), under their names, with their labels."""

    def collect(self) -> Iterator[Metric]:
        for family, series in custom_metrics.REGISTRY.snapshot():
            metric = Metric(family.name, family.description, custom_metrics.KIND_NAMES[family.kind])
            for one in series:
                if family.kind != custom_metrics.HISTOGRAM:
                    metric.add_sample(family.name, one.labels, one.value)
                    continue
                histogram = Histogram(one.buckets)
                histogram.counts, histogram.sum, histogram.count = one.counts, one.sum, one.count
                for sample in histogram.samples(family.name, one.labels):
                    metric.add_sample(*sample)
            yield metric


def metrics_router(
    repository: Repository, monitor: Monitor | None = None, settings: Settings | None = None
) -> Router:
    """`GET /metrics` (and HEAD) answers the registry's text; anything else 404 or 405, in plain text.
    `settings`: the command line's (`configure`) unless given."""
    settings = settings or configured
    if settings.histogram_latencies or settings.summary_latencies:
        observe(repository, settings)
        repository.change_watchers.append(lambda: observe(repository, settings))  # versions loaded later
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelMetrics(repository, settings))
    registry.register(Polled(settings))
    registry.register(CustomMetrics())
    registry.register(ProcessMemory())
    GCCollector(registry=registry)
    if monitor is not None:
        registry.register(AppMetrics(monitor))

    async def metrics(request: HttpRequest) -> HttpResponse:
        return body_response(exposition(registry), CONTENT_TYPE)

    router = Router(fallback_errors=_plain_error)
    router.add("GET", METRICS_PATH, metrics, _plain_error)
    return router


def _plain_error(error: InferError) -> HttpResponse:
    if error.fixed_http_status == 405:
        return body_response(b"method not allowed: use GET\n", PLAIN, 405)
    if error.kind == ErrorKind.NOT_FOUND:
        return body_response(b"not found: this port serves GET /metrics\n", PLAIN, 404)
    return body_response(error.message.encode() + b"\n", PLAIN, http_status(error))
