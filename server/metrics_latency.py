"""Triton's latency histogram and summaries (`--metrics-config histogram_latencies=true`,
`summary_latencies=true`): each ready version's `Latencies`, observed as each request's stats are recorded
(`ModelStats.observer`), and their families on the metrics page. The first-response histogram's buckets
come from the config's `model_metrics`; the summaries' quantiles are exact over a window that ages as
prometheus-cpp's does. (`Histogram` also writes the histograms python models record: server/metrics.py.)
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from tensorgate.server.metrics_family import version_labels
from tensorgate.server.metrics_settings import Settings
from tensorgate.server.statistics import ready_versions

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository import Repository

log = logging.getLogger("tensorgate.metrics")

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)  # Triton's default (core metric_model_reporter.h)
SUMMARY_KEPT = 100_000  # observations kept per age bucket; beyond, a uniform sample of them


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
                for sample in latencies.first_response.samples(FIRST_RESPONSE, version_labels(version)):
                    family.add_sample(*sample)
        yield family
    for name, documentation in SUMMARIES + CACHE_SUMMARIES:
        windows = [(v, latencies.summaries[name]) for v, latencies in watched if name in latencies.summaries]
        if not windows:
            continue
        family = Metric(name, documentation, "summary")
        for version, window in windows:
            quantiles = watched[0][1].settings.quantiles
            for sample in window.samples(name, version_labels(version), quantiles):
                family.add_sample(*sample)
        yield family
