"""Per model version statistics, counted the way Triton's statistics extension reports them.

- inference_count: rows inferred (the batch dimension; 1 per request for a model without batching);
  execution_count: batches executed; last_inference: ms since the epoch of the last answer.
- success / fail: requests answered / failed, with their whole time in the scheduler (queue + compute).
- queue, compute_input, compute_infer, compute_output: per successful request, the time it waited for
  its batch and the phases of that batch (input staging, execute, output staging and split).
- batch_stats: per batch size, batches executed and the time of each phase.
Each answered request's whole time is also kept, until the monitor takes it once a second for the
latency CDF (server/monitor.py); at most LATENCIES_KEPT between two takes.
- failures: failed requests by Triton's reason (REJECTED: its queue timeout expired; CANCELED: its caller
  went away before it ran; BACKEND: the model failed; OTHER), for the metrics' `reason` label.
- observer: None, or what the metrics' histograms and summaries observe each request with
  (server/metrics_latency.py, with --metrics-config): set by the server, never by a batcher.
"""

import time
from typing import Any

from tensorgate.codec.messages import Counts


class Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


class BatchStats:
    __slots__ = ("batch_size", "compute_input", "compute_infer", "compute_output")

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()

    def as_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "compute_input": self.compute_input.as_dict(),
            "compute_infer": self.compute_infer.as_dict(),
            "compute_output": self.compute_output.as_dict(),
        }


RESPONSE_DURATIONS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")


class ResponseStats:
    """Triton's response_stats of a decoupled model: per response index (its requests' first responses
    under "0", their second under "1", ...), how the responses went (success: with outputs; fail: an
    error; empty_response: the final flag alone; cancel: the client went away before it) and their time:
    compute_infer from the previous response (or the start) until the model sent it, compute_output from
    there until the server had it ready to send (core src/infer_stats.cc UpdateResponse*)."""

    def __init__(self) -> None:
        self.by_index: dict[int, dict[str, Duration]] = {}

    def record(self, index: int, outcome: str, infer_ns: int, output_ns: int = 0) -> None:
        """One response, number `index` of its request; `outcome` one of success, fail,
        empty_response, cancel."""
        entry = self.by_index.get(index)
        if entry is None:
            entry = self.by_index[index] = {name: Duration() for name in RESPONSE_DURATIONS}
        if outcome != "cancel":
            entry["compute_infer"].add(infer_ns)
        if outcome == "success" or (outcome == "fail" and output_ns > 0):
            entry["compute_output"].add(output_ns)
        entry[outcome].add(infer_ns + output_ns)

    def as_dict(self) -> dict:
        """Triton's JSON: {"0": {"compute_infer": {"count", "ns"}, ...}, ...}."""
        return {
            str(index): {name: duration.as_dict() for name, duration in entry.items()}
            for index, entry in sorted(self.by_index.items())
        }


LATENCIES_KEPT = 100_000
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # Triton's FailureReason (core src/infer_stats.h)
DURATIONS = (  # ModelStats' Duration fields
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
)  # fmt: skip
PHASES = ("compute_input", "compute_infer", "compute_output")  # BatchStats' Duration fields


class ModelStats:
    def __init__(self) -> None:
        self.latencies: list[int] = []  # ns of each request answered since the monitor last took them
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.batch_stats: dict[int, BatchStats] = {}
        self.cache_hit = Duration()  # the response cache: requests answered from it, and their lookups
        self.cache_miss = Duration()  # requests it could not answer: their lookups and insertions
        self.failures = dict.fromkeys(REASONS, 0)
        self.observer: Any = None

    def record_batch(self, rows: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution of `rows` rows (the requests in it are recorded apart)."""
        stats = self._execution(rows)
        stats.compute_input.add(input_ns)
        stats.compute_infer.add(infer_ns)
        stats.compute_output.add(output_ns)

    def record_success(
        self,
        requests: int,
        total_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        each_ns: list[int] | None = None,
    ) -> None:
        """`requests` answered from one batch; total_ns and queue_ns are their sums, `each_ns` the time of
        each (one request: total_ns)."""
        if len(self.latencies) < LATENCIES_KEPT:
            if each_ns is not None:
                self.latencies.extend(each_ns)
            else:
                self.latencies.append(total_ns // requests)
        self.success.add(total_ns, requests)
        self.queue.add(queue_ns, requests)
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)
        if self.observer is not None:
            queued = queue_ns // requests
            for ns in each_ns if each_ns is not None else (total_ns // requests,) * requests:
                self.observer.request(ns, queued, input_ns, infer_ns, output_ns)

    def record_alone(self, rows: int, ns: int) -> None:
        """One request executed alone with no queue and no staging: record_batch + record_success with
        all of its time in compute_infer, in one call (the hot path of small models)."""
        stats = self._execution(rows)
        if len(self.latencies) < LATENCIES_KEPT:
            self.latencies.append(ns)
        stats.compute_input.count += 1
        stats.compute_infer.add(ns)
        stats.compute_output.count += 1
        self.success.add(ns)
        self.queue.count += 1
        self.compute_input.count += 1
        self.compute_infer.add(ns)
        self.compute_output.count += 1
        if self.observer is not None:
            self.observer.request(ns, 0, 0, ns, 0)

    def record_cache_hit(self, ns: int) -> None:
        """A request answered from the response cache: a success, nothing executed or inferred (as
        Triton's UpdateSuccessCacheHit counts it)."""
        if len(self.latencies) < LATENCIES_KEPT:
            self.latencies.append(ns)
        self.success.add(ns)
        self.queue.count += 1
        self.cache_hit.add(ns)
        self.last_inference = time.time_ns() // 1_000_000
        if self.observer is not None:
            self.observer.cache_hit(ns)

    def record_cache_miss(self, ns: int) -> None:
        """A request the response cache could not answer, already recorded as executed: its lookup and
        insertion time, added to its duration too (Triton's UpdateSuccessCacheMiss)."""
        self.success.ns += ns
        self.cache_miss.add(ns)
        if self.observer is not None:
            self.observer.cache_miss(ns)

    def _execution(self, rows: int) -> BatchStats:
        """Counts one execution of `rows` rows; its batch size's stats."""
        rows = rows or 1  # a request of no rows still counts as one, as in Triton
        self.inference_count += rows
        self.execution_count += 1
        self.last_inference = time.time_ns() // 1_000_000
        stats = self.batch_stats.get(rows)
        if stats is None:
            stats = self.batch_stats[rows] = BatchStats(rows)
        return stats

    def take_latencies(self) -> list[int]:
        """The requests' times recorded since the last take."""
        latencies, self.latencies = self.latencies, []
        return latencies

    def record_failure(self, requests: int, total_ns: int, reason: str = "BACKEND") -> None:
        """`requests` failed, for `reason` (one of REASONS; most failures are the model's)."""
        self.fail.add(total_ns, requests)
        self.failures[reason] += requests
        self.last_inference = time.time_ns() // 1_000_000

    def absorb(self, earlier: "ModelStats") -> None:
        """Adds the counts of `earlier` (the same version before a reload), so counters never go back."""
        self.inference_count += earlier.inference_count
        self.execution_count += earlier.execution_count
        self.last_inference = max(self.last_inference, earlier.last_inference)
        for name in DURATIONS:
            getattr(self, name).add(getattr(earlier, name).ns, getattr(earlier, name).count)
        for reason, count in earlier.failures.items():
            self.failures[reason] += count
        for size, old in earlier.batch_stats.items():
            mine = self.batch_stats.setdefault(size, BatchStats(size))
            for phase in PHASES:
                getattr(mine, phase).add(getattr(old, phase).ns, getattr(old, phase).count)

    def take(self, model: str, version: int) -> Counts | None:
        """What was counted since the last take (None: nothing), these counters starting again from none:
        how a worker's own model instances report to the engine, which adds them (`add`)."""
        if not (self.execution_count or self.fail.count or self.cache_hit.count):
            return None
        durations = []
        for name in DURATIONS:
            duration = getattr(self, name)
            durations.append((duration.count, duration.ns))
            setattr(self, name, Duration())
        batches = [
            [size, *(n for phase in PHASES for n in (getattr(s, phase).count, getattr(s, phase).ns))]
            for size, s in self.batch_stats.items()
        ]
        counts = Counts(
            model,
            version,
            self.inference_count,
            self.execution_count,
            self.last_inference,
            durations,
            batches,
            [self.failures[reason] for reason in REASONS],
            self.take_latencies(),
        )
        self.inference_count = self.execution_count = 0
        self.batch_stats = {}
        self.failures = dict.fromkeys(REASONS, 0)
        return counts

    def add(self, counts: Counts) -> None:
        """Adds what another process counted (`take`); its requests' times reach the metrics' histograms
        as those of requests executed alone (all a worker runs: --worker-models inline)."""
        self.inference_count += counts.inference_count
        self.execution_count += counts.execution_count
        self.last_inference = max(self.last_inference, counts.last_inference)
        for name, (count, ns) in zip(DURATIONS, counts.durations, strict=True):
            getattr(self, name).add(ns, count)
        for size, *phases in counts.batches:
            mine = self.batch_stats.get(size)
            if mine is None:
                mine = self.batch_stats[size] = BatchStats(size)
            for i, phase in enumerate(PHASES):
                getattr(mine, phase).add(phases[2 * i + 1], phases[2 * i])
        for reason, count in zip(REASONS, counts.failures, strict=True):
            self.failures[reason] += count
        room = LATENCIES_KEPT - len(self.latencies)
        self.latencies.extend(counts.latencies[:room])
        if self.observer is not None:
            for ns in counts.latencies:
                self.observer.request(ns, 0, 0, ns, 0)

    def as_dict(self) -> dict:
        """Triton's ModelStatistics fields (without name and version), as its JSON writes them."""
        return {
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "batch_stats": [self.batch_stats[size].as_dict() for size in sorted(self.batch_stats)],
        }
