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
first-response histogram and the latency summaries (server/metrics_latency.py); the machine's and the pinned
memory pool's gauges (server/metrics_polled.py); and what python models record with `pb_utils.MetricFamily`
(server/backends/custom_metrics.py). The command line's settings: server/metrics_settings.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.errors import ErrorKind, InferError, http_status
from tensorgate.server import metrics_settings
from tensorgate.server.backends import custom_metrics
from tensorgate.server.metrics_family import build_family, version_labels
from tensorgate.server.metrics_latency import Histogram, observe, observed
from tensorgate.server.metrics_polled import Polled
from tensorgate.server.metrics_settings import Settings
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response
from tensorgate.server.statistics import ready_versions

if TYPE_CHECKING:
    from tensorgate.server.monitor import Monitor
    from tensorgate.server.repository import Repository

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
            yield build_family(
                name, documentation, "counter", [(version_labels(v), read(v.stats)) for v in versions]
            )
        failure = Metric(FAILURE, "Number of failed inference requests, all batch sizes", "counter")
        for version in versions:
            for reason in REASONS:
                labels = {**version_labels(version), "reason": reason}
                failure.add_sample(FAILURE, labels, failures(version.stats)[reason])
        yield failure
        yield from observed(versions)
        cached = [version for version in versions if version.cache is not None]
        for name, documentation, read in CACHE_COUNTERS if cached and latencies else ():
            yield build_family(
                name, documentation, "counter", [(version_labels(v), read(v.stats)) for v in cached]
            )
        yield build_family(
            PENDING,
            "Instantaneous number of pending requests awaiting execution per-model.",
            "gauge",
            [(version_labels(v), v.scheduler.pending if v.scheduler is not None else 0) for v in versions],
        )
        processes = [v for v in versions if v.backend is not None and v.backend.restarts is not None]
        if processes:
            yield build_family(
                RESTARTS,
                "Python model instances restarted after their process died",
                "counter",
                [(version_labels(v), v.backend.restarts) for v in processes],
            )


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
    settings = settings or metrics_settings.configured
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
        await repository.gather_stats()
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
