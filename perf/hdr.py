"""An HDR histogram of latencies in microseconds: three significant digits from 1 µs to about an hour, in
a fixed array of counts, so that windows and worker processes merge by adding arrays (HdrHistogram's
layout: 2048 linear sub-buckets for values below 2048, then 1024 more for each doubling).

The load generator keeps each window's raw latencies in a list (one append a request) and folds them in
here at the window's end, all at once with numpy."""

from __future__ import annotations

import numpy as np

SUB_BITS = 11  # 2048 sub-buckets: a bucket is at most 1/1024 of its value wide (3 significant digits)
SUB = 1 << SUB_BITS
HALF = SUB >> 1
MAGNITUDES = 22  # up to 2048 << 21 µs, about 71 minutes; longer latencies count in the last bucket
SIZE = SUB + (MAGNITUDES - 1) * HALF


def _index(values: np.ndarray) -> np.ndarray:
    """The bucket of each value (µs, integers >= 0)."""
    values = np.minimum(values, (SUB << (MAGNITUDES - 1)) - 1)
    magnitude = np.maximum(0, np.floor(np.log2(np.maximum(values, 1))).astype(np.int64) - SUB_BITS + 1)
    shifted = values >> magnitude  # in [HALF, SUB) above the first magnitude
    return np.where(magnitude == 0, values, SUB + (magnitude - 1) * HALF + shifted - HALF)


def _lowest(indices: np.ndarray) -> np.ndarray:
    """The smallest value each bucket holds."""
    magnitude = np.where(indices < SUB, 0, (indices - SUB) // HALF + 1)
    within = np.where(indices < SUB, indices, (indices - SUB) % HALF + HALF)
    return within << magnitude


class Histogram:
    def __init__(self, counts: np.ndarray | None = None, maximum: int = 0) -> None:
        self.counts = np.zeros(SIZE, np.int64) if counts is None else counts
        self.maximum = maximum  # exact, µs

    def record(self, seconds: list[float] | np.ndarray) -> None:
        """Latencies in seconds."""
        if len(seconds) == 0:
            return
        micros = np.rint(np.asarray(seconds, np.float64) * 1e6).astype(np.int64)
        np.add.at(self.counts, _index(micros), 1)
        self.maximum = max(self.maximum, int(micros.max()))

    def add(self, other: Histogram) -> None:
        self.counts += other.counts
        self.maximum = max(self.maximum, other.maximum)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def percentile(self, percent: float) -> float:
        """The latency (µs) at or below which `percent` of the values are: the middle of its bucket, as
        HdrHistogram reports it (within 1/2048 of the value), never above the maximum recorded."""
        total = self.total
        if total == 0:
            return float("nan")
        rank = max(1, int(np.ceil(percent / 100 * total)))
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        low = int(_lowest(np.array([index]))[0])
        high = int(_lowest(np.array([index + 1]))[0]) if index + 1 < SIZE else low + 1
        return float(min((low + high - 1) / 2, self.maximum))

    def mean(self) -> float:
        total = self.total
        if total == 0:
            return float("nan")
        lows = _lowest(np.arange(SIZE + 1))
        middles = (lows[:-1] + lows[1:] - 1) / 2
        return float((self.counts * middles).sum() / total)

    def summary(self) -> dict[str, float]:
        """p50, p90, p99, p999 and max (µs), as the reports give them."""
        return {
            "p50": self.percentile(50),
            "p90": self.percentile(90),
            "p99": self.percentile(99),
            "p999": self.percentile(99.9),
            "max": float(self.maximum) if self.total else float("nan"),
            "mean": self.mean(),
        }

    def to_wire(self) -> tuple[dict[int, int], int]:
        """The non-empty buckets and the maximum: what a worker process sends its parent."""
        nonzero = np.flatnonzero(self.counts)
        return {int(i): int(self.counts[i]) for i in nonzero}, self.maximum

    @classmethod
    def from_wire(cls, wire: tuple[dict[int, int], int]) -> Histogram:
        buckets, maximum = wire
        counts = np.zeros(SIZE, np.int64)
        for index, count in buckets.items():
            counts[int(index)] = count
        return cls(counts, maximum)
