"""grps's `app_monitor`: where models record their own metrics (server/monitor.py samples them each second).

A leaf: it imports nothing of the server, so a backend can hand it to model code (`from
grps_framework.monitor.monitor import app_monitor`, server/backends/module.py) without pulling in the
monitor, its statistics and the repository behind them.
"""

import math
import threading

AGGREGATIONS = ("max", "min", "avg", "inc", "cdf")
MAX_VALUES = 100_000  # values a cdf metric keeps per second; past that the second's sample is its first ones


class AppMonitor:
    """Where models record their own metrics, as grps's app_monitor: each call adds a value to the
    current second of `name`, aggregated as the method says (a name keeps its first aggregation)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[str, tuple[str, list]] = {}  # name -> (aggregation, [values this second])
        self._kinds: dict[str, str] = {}

    def max(self, name: str, value: float) -> None:
        self._put(name, "max", value)

    def min(self, name: str, value: float) -> None:
        self._put(name, "min", value)

    def avg(self, name: str, value: float) -> None:
        self._put(name, "avg", value)

    def inc(self, name: str, value: float = 1) -> None:
        self._put(name, "inc", value)

    def cdf(self, name: str, value: float) -> None:
        self._put(name, "cdf", value)

    def record(self, name: str, aggregation: str, value: float) -> None:
        """A value aggregated as `aggregation` (max, min, avg, inc or cdf); raises ValueError on a bad
        name, value or aggregation."""
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"metric '{name}': no aggregation {aggregation!r}")
        self._put(name, aggregation, value)

    def _check(self, name: str, aggregation: str, value: float) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a metric name is a non-empty string")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"metric '{name}': a value is a finite int or float, got {value!r}")
        with self._lock:
            kind = self._kinds.setdefault(name, aggregation)
        if kind != aggregation:
            raise ValueError(f"metric '{name}' is aggregated as {kind}, not {aggregation}")

    def _put(self, name: str, aggregation: str, value: float) -> None:
        self._check(name, aggregation, value)
        with self._lock:
            entry = self._current.get(name)
            if entry is None:
                self._current[name] = (aggregation, [value])
            elif len(entry[1]) < MAX_VALUES:
                entry[1].append(value)

    def take(self) -> tuple[dict[str, str], dict[str, list]]:
        """Every metric's aggregation, and the values recorded since the last take."""
        with self._lock:
            current, self._current = self._current, {}
            return dict(self._kinds), {name: values for name, (_, values) in current.items()}


app_monitor = AppMonitor()
