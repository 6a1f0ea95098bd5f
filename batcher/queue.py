"""The dynamic batcher's queues: one per priority level, each with its queue policy (Triton's semantics).

- Levels run from 1 (served first) to `priority_levels`; without priority levels there is one queue, 0.
  A request's `priority` 0 or above the last level means `default_priority_level`.
- A level's policy: `max_queue_size` (0 = unbounded) refuses a request at once; a request's timeout is
  `default_timeout_microseconds` (0 = none), or the request's own `timeout` when `allow_timeout_override`
  is set and it is smaller. Past its timeout a queued request is rejected (REJECT) or moved behind the
  level's requests that have not timed out (DELAY), where it still joins batches.
- Requests leave in order: level by level, and within a level those not timed out first, oldest first.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from tensorgate.codec.errors import ErrorKind, InferError

if TYPE_CHECKING:
    from tensorgate.batcher.scheduler import Job

REJECT, DELAY = "REJECT", "DELAY"
QUEUE_FULL = "Exceeds maximum queue size"
TIMED_OUT = "Request timeout expired"

# Where a job is (Job.where).
QUEUED, DELAYED, OUT = 0, 1, 2


class QueuePolicy(NamedTuple):
    timeout_action: str = REJECT
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_config(cls, policy: dict | None) -> QueuePolicy:
        """From a ModelQueuePolicy message as model_config.py normalizes it (missing fields: defaults)."""
        policy = policy or {}
        return cls(
            policy.get("timeout_action", REJECT),
            int(policy.get("default_timeout_microseconds", 0)),
            bool(policy.get("allow_timeout_override", False)),
            int(policy.get("max_queue_size", 0)),
        )

    def timeout_us(self, requested_us: int) -> int:
        """The request's timeout in the queue (0: none). As in Triton, an override only ever shortens a
        default timeout: without one, a request's `timeout` is ignored."""
        if self.allow_timeout_override and 0 < requested_us < self.default_timeout_us:
            return requested_us
        return self.default_timeout_us


class _Level:
    __slots__ = ("policy", "fresh", "delayed")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.fresh: deque[Job] = deque()  # not timed out, in arrival order
        self.delayed: deque[Job] = deque()  # timed out under DELAY, in the order they timed out

    def __len__(self) -> int:
        return len(self.fresh) + len(self.delayed)


class PriorityQueues:
    def __init__(
        self,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        default_policy: QueuePolicy | None = None,
        policies: dict[int, QueuePolicy] | None = None,
    ) -> None:
        self.priority_levels = priority_levels
        self.default_level = default_priority_level if priority_levels else 0
        self.default_policy = default_policy if default_policy is not None else QueuePolicy()
        self.policies = policies or {}
        self._levels: dict[int, _Level] = {}
        self._order: list[int] = []  # the levels that have a queue, ascending
        self._size = 0
        self._deadlines: list[tuple[int, int, Job]] = []  # a heap; entries of jobs gone are skipped
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        return self._size

    def level_of(self, priority: int) -> int:
        if not self.priority_levels:
            return 0
        if priority == 0 or priority > self.priority_levels:
            return self.default_level
        return priority

    def _level(self, number: int) -> _Level:
        level = self._levels.get(number)
        if level is None:
            level = self._levels[number] = _Level(self.policies.get(number, self.default_policy))
            bisect.insort(self._order, number)
        return level

    def push(self, job: Job, priority: int = 0, timeout_us: int = 0) -> None:
        """Queues `job` at its priority's level; raises UNAVAILABLE when that level is full."""
        job.level = self.level_of(priority)
        level = self._level(job.level)
        if level.policy.max_queue_size and len(level) >= level.policy.max_queue_size:
            raise InferError(ErrorKind.UNAVAILABLE, QUEUE_FULL)
        timeout = level.policy.timeout_us(timeout_us)
        if timeout:
            job.deadline_ns = job.arrival_ns + timeout * 1000
            heapq.heappush(self._deadlines, (job.deadline_ns, next(self._tiebreak), job))
        level.fresh.append(job)
        job.where = QUEUED
        self._size += 1

    def __iter__(self) -> Iterator[Job]:
        """The queued requests in the order they leave."""
        for number in self._order:
            level = self._levels[number]
            yield from level.fresh
            yield from level.delayed

    def take(self, count: int) -> list[Job]:
        """Removes and returns the first `count` requests in leaving order."""
        taken: list[Job] = []
        for number in self._order:
            level = self._levels[number]
            for part in (level.fresh, level.delayed):
                while part and len(taken) < count:
                    job = part.popleft()
                    job.where = OUT
                    taken.append(job)
            if len(taken) == count:
                break
        self._size -= len(taken)
        return taken

    def remove(self, job: Job) -> bool:
        """Takes `job` out wherever it is queued (a caller gone); False when it is not queued."""
        if job.where == OUT:
            return False
        level = self._levels[job.level]
        (level.fresh if job.where == QUEUED else level.delayed).remove(job)
        job.where = OUT
        self._size -= 1
        return True

    def expire(self, now_ns: int) -> list[Job]:
        """Applies the timeout action to every request past its timeout (strictly after its deadline);
        returns those rejected, already out of the queue."""
        rejected: list[Job] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now_ns:
            job = heapq.heappop(deadlines)[2]
            if job.where != QUEUED:
                continue
            level = self._levels[job.level]
            level.fresh.remove(job)
            if level.policy.timeout_action == DELAY:
                level.delayed.append(job)
                job.where = DELAYED
            else:
                job.where = OUT
                self._size -= 1
                rejected.append(job)
        return rejected

    def next_deadline(self) -> int | None:
        """The earliest deadline of a request still waiting to time out, if any."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].where != QUEUED:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None
