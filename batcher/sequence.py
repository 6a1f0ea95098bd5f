"""The sequence batcher: Triton's `sequence_batching` for stateful models, the third `Scheduler`
(batcher/scheduler.py) beside the direct path and the dynamic batcher.

Every request names its sequence: `InferRequest.sequence_id` (a uint64 or a string) and
`.sequence_flags` (START, END), read by the codecs (codec/sequence.py). Here, as Triton's
SequenceBatchScheduler does:
- a START request opens a sequence; it takes a free slot, or waits in the backlog, in order, until one
  frees; any other request joins its sequence (one unknown is refused, with Triton's text), and the END
  request closes it: a later request of that ID needs a START again;
- the requests of a sequence execute one at a time, in arrival order; each gets the control inputs and
  the implicit state of its sequence (batcher/sequence_inputs.py), and each answer's state output is the
  sequence's next state;
- a sequence with no request for `max_sequence_idle_microseconds` is released (its slot freed, its state
  dropped) and its next request refused; a backlogged sequence whose requests' `timeout` passes is
  refused; a request whose caller goes away before it executes cancels its sequence, as Triton's
  request cancellation does;
- unload (drain) refuses the backlog and answers what holds a slot; the live sequences end with it.
How slots become batches is the strategy's: `direct` (batcher/sequence_direct.py: one batch slot of one
instance per sequence, empty slots READY false) or `oldest` (batcher/sequence_oldest.py: candidate
sequences feeding a dynamic batcher, at most one request of a sequence in a batch).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Protocol

from tensorgate.batcher.clock import Clock, MonotonicClock, Timer
from tensorgate.batcher.inflight import InFlight
from tensorgate.batcher.scheduler import Arrays, Job, Scheduler
from tensorgate.batcher.sequence_direct import DirectStrategy
from tensorgate.batcher.sequence_inputs import SequenceInputs
from tensorgate.batcher.sequence_oldest import OldestStrategy
from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.sequence import END, START

if TYPE_CHECKING:
    import numpy as np

    from tensorgate.batcher.execution import Executor

log = logging.getLogger("tensorgate.batcher")

IDLED_KEPT = 4096  # sequences remembered as idled out, for the message that refuses their next request
STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"
BACKLOG_TIMED_OUT = "timeout of the corresponding sequence has been expired"


class Sequence:
    """One live sequence: its requests waiting to execute, its slot, its implicit state."""

    __slots__ = ("id", "queue", "busy", "slot", "state", "last_ns", "deadline_ns", "cancelled")

    def __init__(self, sequence_id: int | str, now_ns: int) -> None:
        self.id = sequence_id
        self.queue: deque[Job] = deque()  # its requests waiting to execute, in arrival order
        self.busy = False  # one of its requests is executing (or in the oldest strategy's batch queue)
        self.slot: Any = None  # the strategy's slot; None: in the backlog (or ended)
        self.state: dict[str, np.ndarray] | None = None  # implicit state after its last answer
        self.last_ns = now_ns  # its last request's arrival or answer: when it went idle
        self.deadline_ns = 0  # in the backlog: when its requests' timeout expires (0: never)
        self.cancelled = False


class Strategy(Protocol):
    """How sequences holding a slot become batches (direct or oldest)."""

    pending: int  # requests it holds that are not executing yet

    def bind(self, sequence: Sequence) -> bool:
        """Gives `sequence` a free slot (sets `sequence.slot`); False when none is free."""
        ...

    def release(self, sequence: Sequence) -> None:
        """Frees the slot of a sequence that ended (none of its requests executing)."""
        ...

    def ready(self, sequence: Sequence) -> None:
        """`sequence` holds a slot, executes nothing and has a request queued: run it when it can."""
        ...

    def withdraw(self, job: Job) -> bool:
        """Takes back a request taken from its sequence, unless it already executes (False)."""
        ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class SequenceBatcher(Scheduler):
    def __init__(
        self,
        executor: Executor,
        config: dict,
        stats: ModelStats | None = None,
        initial_states: dict[str, np.ndarray] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`config`: the normalized model config (its `sequence_batching` normalized by
        server/sequence_config.py); `initial_states`: each state input's initial state (one request's,
        without the batch dimension), as server/sequence_config.initial_states reads them."""
        self.executor = executor
        self.stats = stats if stats is not None else ModelStats()
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.now = False  # requests wait for their sequence's turn: never run_now
        self.model = config["name"]
        section = config["sequence_batching"]
        self.idle_us = section["max_sequence_idle_microseconds"]
        self.batched = config.get("max_batch_size", 0) > 0
        self.inputs = SequenceInputs(config, initial_states or {})
        strategy = OldestStrategy if "oldest" in section else DirectStrategy
        self.strategy: Strategy = strategy(self, executor, config, self.stats, self.clock)
        self._live: dict[int | str, Sequence] = {}  # by ID: the sequences a request may still join
        self._backlog: deque[Sequence] = deque()  # sequences waiting for a slot, in arrival order
        self._idled: OrderedDict[int | str, None] = OrderedDict()  # IDs released for idling, the latest
        self._requests = InFlight()  # requests not answered yet: what drain() waits for
        self._queued = 0  # requests waiting in their sequence's queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: Timer | None = None
        self._timer_at: int | None = None
        self._stopping = False

    @property
    def pending(self) -> int:
        """Requests not executing yet (Triton's nv_inference_pending_request_count)."""
        return self._queued + self.strategy.pending

    def run_now(self, inputs: Arrays, rows: int = 1) -> Arrays:
        raise RuntimeError("the sequence batcher never runs a request now: await run(job)")

    # ------------------------------------------------------------------------------------------ requests

    async def run(self, job: Job) -> Arrays:
        """This request's outputs, once the requests of its sequence before it have executed."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = self.clock.now_ns()
        sequence = self._route(job, now)  # a refusal here is not counted, as Triton's failed enqueues
        job.future = loop.create_future()
        job.sequence = sequence
        job.arrival_ns = now
        sequence.queue.append(job)
        sequence.last_ns = now
        self._queued += 1
        self._requests.enter()
        if sequence.slot is None:
            if job.timeout_us:
                deadline = now + job.timeout_us * 1000
                sequence.deadline_ns = min(sequence.deadline_ns or deadline, deadline)
                self._arm(sequence.deadline_ns)
        elif not sequence.busy:
            self.strategy.ready(sequence)
        try:
            return await job.future
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _route(self, job: Job, now: int) -> Sequence:
        """The sequence `job` joins (opened when it starts one); raises Triton's refusals."""
        request = job.request
        sequence_id, flags = request.sequence_id, request.sequence_flags
        model = self.model
        if not sequence_id:
            raise invalid(
                f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
            )
        if self.batched and job.rows > 1:
            raise invalid(
                f"inference request to model '{model}' must specify batch-size 1 due to requirements of "
                "sequence batcher"
            )
        error = self.inputs.corrid_error(sequence_id)
        if error is not None:
            raise error
        sequence = self._live.get(sequence_id)
        if sequence is None:
            if not flags & START:
                message = (
                    f"inference request for sequence {sequence_id} to model '{model}' must specify the START "
                    "flag on the first request of the sequence"
                )
                if sequence_id in self._idled:
                    message += (
                        f" (sequence {sequence_id} was released after {self.idle_us} us without a request: "
                        "max_sequence_idle_microseconds)"
                    )
                raise invalid(message)
            if self._stopping:
                raise InferError(ErrorKind.UNAVAILABLE, STOPPING)
            self._idled.pop(sequence_id, None)
            sequence = self._live[sequence_id] = Sequence(sequence_id, now)
            if not self.strategy.bind(sequence):
                self._backlog.append(sequence)
        elif flags & START:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.",
                sequence_id,
                model,
            )
        if flags & END:  # a later request of this ID starts a new sequence
            del self._live[sequence_id]
        return sequence

    # --------------------------------------------------------------------------- what strategies call

    def prepare(self, sequence: Sequence) -> Job:
        """The next request of `sequence`, its control inputs and state filled in (still queued)."""
        job = sequence.queue[0]
        self.inputs.fill(job, sequence.id, sequence.state)
        return job

    def take(self, sequence: Sequence) -> Job:
        """Takes the prepared next request of `sequence` to execute: the sequence is busy until it is
        `finished`."""
        sequence.busy = True
        self._queued -= 1
        return sequence.queue.popleft()

    def finished(self, job: Job, answer: Arrays | InferError) -> Arrays | InferError:
        """A request executed (or failed): the sequence keeps its state output and sends its next
        request, or ends with its END request. Returns the request's answer (an error in place of outputs
        when the model left out a state output)."""
        sequence = job.sequence
        sequence.busy = False
        sequence.last_ns = self.clock.now_ns()
        if self.inputs.states and not isinstance(answer, InferError):
            state = self.inputs.next_state(answer)
            if isinstance(state, InferError):
                answer = state
            else:
                sequence.state = state
        self._requests.leave()
        if job.request.sequence_flags & END or sequence.cancelled:
            self._end(sequence)
        elif sequence.queue:
            self.strategy.ready(sequence)
        else:
            self._arm(sequence.last_ns + self.idle_us * 1000)
        return answer

    # ------------------------------------------------------------------------------ ending sequences

    def _end(self, sequence: Sequence) -> None:
        """The sequence is over (ended, idled out, cancelled): its slot goes to the backlog's next."""
        if self._live.get(sequence.id) is sequence:
            del self._live[sequence.id]
        sequence.state = None
        if sequence.slot is None:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        self.strategy.release(sequence)
        while self._backlog and self.strategy.bind(self._backlog[0]):
            waiting = self._backlog.popleft()
            waiting.deadline_ns = 0
            if waiting.queue:
                self.strategy.ready(waiting)

    def _fail(self, sequence: Sequence, kind: ErrorKind, message: str, reason: str = "REJECTED") -> None:
        """Refuses every request waiting in the sequence's queue (nv_inference_request_failure's `reason`:
        REJECTED as Triton counts a sequence timed out, CANCELED for a cancelled sequence's)."""
        now = self.clock.now_ns()
        while sequence.queue:
            job = sequence.queue.popleft()
            self._queued -= 1
            self._requests.leave()
            self.stats.record_failure(1, now - job.arrival_ns, reason)
            if not job.future.done():
                job.future.set_exception(InferError(kind, message))

    def _abandon(self, job: Job) -> None:
        """The caller of `job` went away. Before it executed: its sequence is cancelled (as Triton
        cancels the sequence of a cancelled request); once executing, it runs to its end as any other."""
        sequence = job.sequence
        if job in sequence.queue:
            sequence.queue.remove(job)
            self._queued -= 1
        elif self.strategy.withdraw(job):
            sequence.busy = False
        else:
            return
        self._requests.leave()
        self.stats.record_failure(1, self.clock.now_ns() - job.arrival_ns, "CANCELED")
        sequence.cancelled = True
        if self._live.get(sequence.id) is sequence:
            del self._live[sequence.id]  # a later request of this ID needs a START
        self._fail(
            sequence,
            ErrorKind.UNAVAILABLE,
            f"inference request for sequence {sequence.id} to model '{self.model}' was cancelled: an earlier "
            "request of the sequence was cancelled before it executed",
            "CANCELED",
        )
        if not sequence.busy:
            self._end(sequence)

    # ---------------------------------------------------------------------------------- the reaper

    def _arm(self, at: int) -> None:
        """The reaper's one timer, at the earliest moment a sequence may idle out or a backlog expire."""
        if self._timer_at is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later(at - self.clock.now_ns(), self._reap)

    def _reap(self) -> None:
        self._timer = self._timer_at = None
        now = self.clock.now_ns()
        idle_ns = self.idle_us * 1000
        wake = None
        for sequence in list(self._live.values()):
            if sequence.slot is None or sequence.busy or sequence.queue:
                continue  # waiting for a slot, or not idle: its answer arms the timer again
            due = sequence.last_ns + idle_ns
            if due > now:
                wake = due if wake is None else min(wake, due)
                continue
            log.info(
                "sequence %s of model '%s' released: no request for %s us (max_sequence_idle_microseconds)",
                sequence.id,
                self.model,
                self.idle_us,
            )
            self._idled[sequence.id] = None
            if len(self._idled) > IDLED_KEPT:
                self._idled.popitem(last=False)
            self._end(sequence)
        for sequence in list(self._backlog):
            if not sequence.deadline_ns:
                continue
            if sequence.deadline_ns > now:
                wake = sequence.deadline_ns if wake is None else min(wake, sequence.deadline_ns)
                continue
            self._fail(sequence, ErrorKind.UNAVAILABLE, BACKLOG_TIMED_OUT)
            self._end(sequence)
        if wake is not None:
            self._arm(wake)

    # --------------------------------------------------------------------------------------- unload

    async def drain(self) -> None:
        """Refuses the backlog (no new sequence starts), then waits until every request of a sequence
        holding a slot is answered."""
        self._stopping = True
        for sequence in list(self._backlog):
            self._fail(sequence, ErrorKind.UNAVAILABLE, STOPPING)
            self._end(sequence)
        await self._requests.wait_idle()
        await self.strategy.drain()

    def close(self) -> None:
        """The live sequences end with the model; their next requests are refused."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        self._live.clear()
        self.strategy.close()
