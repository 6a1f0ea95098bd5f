"""Triton's custom metrics for python models: `pb_utils.MetricFamily` and its `Metric`s, on `/metrics`.

A model makes a family (`MetricFamily(name, description, kind)`, kind COUNTER, GAUGE or HISTOGRAM), a
series of it per label set (`family.Metric(labels={...}, buckets=[...])`, buckets for a histogram only),
then `increment`, `set`, `observe` and reads `value()`, with the errors of Triton's core
(src/metric_family.cc). Every series lives in the server's `REGISTRY`, which server/metrics.py exports.

In a model's own process (`EXECUTION_MODE process`) the same calls are checked and counted in the
process's registry, and each one is also sent to the server (`forward`, set by server/backends/stub.py),
whose registry applies it (server/backends/instance.py): /metrics shows the server's. `value()` answers
from the process's registry: what this process recorded.

Names starting `nv_`, `tensorgate_` or `python_gc_` are refused: they are the server's own series.
As in Triton, making a family again with the same name, kind and description gives the same family, and
a Metric again with the same labels the same series. Unlike Triton, series stay until the server exits
(Triton removes them when the model's objects are deleted).
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from collections.abc import Callable

from tensorgate.server.backends.pb_errors import TritonModelException

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2  # TRITONSERVER_MetricKind
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The server's own series: a model's family of the same name would make /metrics list a name twice.
RESERVED = ("nv_", "tensorgate_", "python_gc_")
OPERATION = "triton_custom_metric"  # the msg.Metric aggregation that carries a process's operation


def _error(message: str) -> Exception:
    return TritonModelException(message)


class Series:
    """One label set of a family: a value (counter, gauge) or a histogram's buckets, sum and count."""

    def __init__(self, kind: int, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.kind = kind
        self.labels = labels
        self.value = 0.0
        self.buckets = buckets or []
        self.counts = [0] * len(self.buckets)  # per bucket, not cumulative
        self.sum = 0.0
        self.count = 0


class Family:
    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple[tuple[str, str], ...], Series] = {}


class Registry:
    """Every family and series, and the operations on them (from any thread: models run in several)."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}
        self.lock = threading.Lock()

    def family(self, name: str, description: str, kind: int) -> Family:
        if kind not in KIND_NAMES:
            raise _error("Unsupported kind passed to MetricFamily constructor.")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _error(f"Invalid metric family name '{name}'.")
        if name.startswith(RESERVED):
            prefixes = ", ".join(RESERVED)
            raise _error(
                f"Metric family name '{name}' is reserved: names starting {prefixes} are the server's."
            )
        with self.lock:
            found = self.families.get(name)
            if found is None:
                found = self.families[name] = Family(name, str(description), kind)
            elif found.kind != kind or found.description != description:
                raise _error(f"Metric family '{name}' already exists with a different kind or description.")
            return found

    def series(self, family: Family, labels: dict | None, buckets: list | None) -> Series:
        labels = dict(labels or {})
        for key, value in labels.items():
            if not isinstance(key, str) or not _LABEL.fullmatch(key) or not isinstance(value, str):
                raise _error(f"Invalid label '{key}': labels are names to string values.")
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise _error("Bucket boundaries not found in Metric args.")
            buckets = [float(b) for b in buckets]
            if buckets != sorted(buckets):
                raise _error("Histogram buckets must be in increasing order.")
        elif buckets is not None:
            kind = "counter" if family.kind == COUNTER else "gauge"
            raise _error(f"Unexpected args found in {kind} Metric constructor.")
        key = tuple(sorted(labels.items()))
        with self.lock:
            found = family.series.get(key)
            if found is None:
                found = family.series[key] = Series(family.kind, labels, buckets)
            return found

    def increment(self, series: Series, value: float) -> None:
        if series.kind == HISTOGRAM:
            raise _error("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
        if series.kind == COUNTER and value < 0:
            raise _error(
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                "values."
            )
        with self.lock:
            series.value += value

    def set(self, series: Series, value: float) -> None:
        if series.kind == COUNTER:
            raise _error("TRITONSERVER_METRIC_KIND_COUNTER does not support Set")
        if series.kind == HISTOGRAM:
            raise _error("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set")
        with self.lock:
            series.value = value

    def observe(self, series: Series, value: float) -> None:
        if series.kind == COUNTER:
            raise _error("TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")
        if series.kind == GAUGE:
            raise _error("TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")
        with self.lock:
            at = bisect.bisect_left(series.buckets, value)  # a bucket counts values <= its bound
            if at < len(series.counts):
                series.counts[at] += 1
            series.sum += value
            series.count += 1

    def value(self, series: Series) -> float:
        if series.kind == HISTOGRAM:
            raise _error("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
        return series.value

    def apply(self, operation: list) -> None:
        """An operation a model's process sent (`forward`): [family, description, kind, labels, buckets,
        what, value], checked in the process already."""
        name, description, kind, labels, buckets, what, value = operation
        series = self.series(self.family(name, description, kind), labels, buckets)
        if what == "increment":
            self.increment(series, value)
        elif what == "set":
            self.set(series, value)
        elif what == "observe":
            self.observe(series, value)

    def snapshot(self) -> list[tuple[Family, list[Series]]]:
        """The families and their series as they are now (copies, for a scrape)."""
        with self.lock:
            return [
                (family, [_copy(s) for s in family.series.values()])
                for _, family in sorted(self.families.items())
            ]


def _copy(series: Series) -> Series:
    copy = Series(series.kind, series.labels, series.buckets)
    copy.value, copy.counts, copy.sum, copy.count = (
        series.value,
        list(series.counts),
        series.sum,
        series.count,
    )
    return copy


REGISTRY = Registry()
# In a model's process: sends each operation to the server (server/backends/stub.py), else None.
forward: Callable[[list], None] | None = None


def _send(family: Family, series: Series, what: str, value: float) -> None:
    if forward is not None:
        buckets = series.buckets if family.kind == HISTOGRAM else None
        forward([family.name, family.description, family.kind, series.labels, buckets, what, value])


class Metric:
    """One series of a MetricFamily, as `family.Metric(labels=..., buckets=...)` makes it."""

    def __init__(self, family: Family, labels: dict | None = None, buckets: list | None = None) -> None:
        self._family = family
        self._series = REGISTRY.series(family, labels, buckets)
        _send(family, self._series, "create", 0.0)  # the series shows on /metrics before any operation

    def increment(self, value: float) -> None:
        REGISTRY.increment(self._series, float(value))
        _send(self._family, self._series, "increment", float(value))

    def set(self, value: float) -> None:
        REGISTRY.set(self._series, float(value))
        _send(self._family, self._series, "set", float(value))

    def observe(self, value: float) -> None:
        REGISTRY.observe(self._series, float(value))
        _send(self._family, self._series, "observe", float(value))

    def value(self) -> float:
        return REGISTRY.value(self._series)


class MetricFamily:
    """Triton's `pb_utils.MetricFamily(name, description, kind)`."""

    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._family = REGISTRY.family(name, description, kind)

    def Metric(self, labels: dict | None = None, buckets: list | None = None) -> Metric:  # noqa: N802 (Triton's name)
        return Metric(self._family, labels, buckets)


def apply_forwarded(text: str) -> None:
    """The server's side of `forward`: `text` is the operation as JSON, as a model's process sends it in
    a msg.Metric whose aggregation is OPERATION (server/backends/instance.py)."""
    REGISTRY.apply(json.loads(text))
