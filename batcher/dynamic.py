"""The dynamic batcher: Triton's `dynamic_batching` on an asyncio event loop, a `Scheduler`
(batcher/scheduler.py; the other is the direct path, batcher/direct.py).

Requests queue by priority level (batcher/queue.py). Whenever an instance is free, a batch is formed
from the front of the queue, as Triton's dynamic batch scheduler forms it:
- requests join in queue order while the rows stay within `max_batch_size` and their inputs agree
  (names, datatypes, non-batch dimensions; and their custom parameters, for a model given them); the
  first request that does not fit ends the batch;
- a batch that reaches a `preferred_batch_size` (by default `max_batch_size`) goes at once, at the
  largest preferred size reachable;
- otherwise the batch waits while the oldest request in it has waited less than
  `max_queue_delay_microseconds`, then goes as it is (0: at once, with whatever is queued).
Each batch's inputs are staged into one array per input, executed once, and its outputs are split back
per request as row views (no copy). `instance_group` count batches may be in flight at once; while all
are busy the queue keeps filling. With `preserve_ordering`, answers leave in the order the batches were
formed. The clock is injected: tests drive time by hand with `batcher.clock.ManualClock`.
"""

import asyncio
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np

from tensorgate.batcher.clock import Clock, MonotonicClock, Timer
from tensorgate.batcher.execution import Executor, Result, parameters_of
from tensorgate.batcher.inflight import InFlight
from tensorgate.batcher.queue import OUT, TIMED_OUT, PriorityQueues, QueuePolicy
from tensorgate.batcher.rate_limiter import Limited
from tensorgate.batcher.scheduler import Arrays, Job, Scheduler
from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.datatypes import BY_CONFIG
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.trace import QUEUE_START

_by_name = itemgetter(0)


def signature(inputs: Arrays) -> tuple:
    """What requests must share to share a batch: input names, datatypes and non-batch dimensions."""
    return tuple((name, array.dtype, array.shape[1:]) for name, array in sorted(inputs.items(), key=_by_name))


def ragged_signature(inputs: Arrays, ragged: frozenset[str]) -> tuple:
    """`signature` where the inputs with `allow_ragged_batch` may differ in their non-batch dimensions."""
    return tuple(
        (name, array.dtype, None if name in ragged else array.shape[1:])
        for name, array in sorted(inputs.items(), key=_by_name)
    )


class _Batch:
    __slots__ = ("jobs", "dispatched_ns", "outcome")

    def __init__(self, jobs: list[Job], dispatched_ns: int) -> None:
        self.jobs = jobs
        self.dispatched_ns = dispatched_ns
        self.outcome: list[Arrays] | InferError | None = None  # answers per job, or the batch's error


class DynamicBatcher(Scheduler):
    def __init__(
        self,
        executor: Executor,
        config: dict,
        stats: ModelStats | None = None,
        clock: Clock | None = None,
        limited: Limited | None = None,
    ) -> None:
        """`config`: the model configuration (model_config.py's normalized dict); its
        `dynamic_batching` section may be absent (all defaults). `limited`: the model's instances in the
        server's rate limiter (--rate-limit execution_count, batcher/rate_limiter.py), when its instance
        groups give a `rate_limiter`; each batch then waits for an instance whose resources are free."""
        self.executor = executor
        self.limited = limited
        self._awaiting_instance = 0  # requests in batches waiting for the rate limiter
        self.stats = stats if stats is not None else ModelStats()
        self.now = False  # requests wait in a queue: never run_now (see batcher/scheduler.py)
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        max_batch_size = int(config.get("max_batch_size", 0))
        # Without batching (max_batch_size 0) each request is a batch of one: the queue policies apply.
        self.batched = max_batch_size > 0
        self.max_batch_size = max(1, max_batch_size)
        section = config.get("dynamic_batching") or {}
        preferred = sorted({int(s) for s in section.get("preferred_batch_size") or ()}) or [
            self.max_batch_size
        ]
        self.preferred = frozenset(preferred)
        self.max_preferred = preferred[-1]
        self.delay_ns = int(section.get("max_queue_delay_microseconds", 0)) * 1000
        self.preserve_ordering = bool(section.get("preserve_ordering", False))
        self.queues = PriorityQueues(
            int(section.get("priority_levels", 0)),
            int(section.get("default_priority_level", 0)),
            QueuePolicy.from_config(section.get("default_queue_policy")),
            {
                int(k): QueuePolicy.from_config(v)
                for k, v in (section.get("priority_queue_policy") or {}).items()
            },
        )
        self._dtypes = {o["name"]: BY_CONFIG[o["data_type"]].numpy for o in config.get("output", ())}
        # inputs with allow_ragged_batch: requests may batch together whatever their non-batch dimensions
        self.ragged = executor.ragged if self.batched else frozenset()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first request
        self._free = executor.instances  # instances not executing a batch
        self._unanswered = InFlight()  # requests queued or in a batch not yet answered: drain() waits
        self._kicked = False
        self._timer: Timer | None = None
        self._timer_at: int | None = None
        self._tasks: set[asyncio.Task] = set()
        self._formed: deque[_Batch] = deque()  # preserve_ordering: batches not yet answered, in order
        self._traced = 0  # traced requests not yet answered: only then does a batch look for their traces
        # Called with each request's answer (its outputs or its InferError) before its future gets it,
        # whether or not its caller still waits; answers what the future gets. The sequence batcher's
        # (batcher/sequence_oldest.py): it keeps each sequence's state and sends the sequence's next request.
        self.on_answer: Callable[[Job, Arrays | InferError], Arrays | InferError] | None = None

    # ------------------------------------------------------------------------------------------ requests

    @property
    def pending(self) -> int:
        """Requests queued, not yet executing (Triton's nv_inference_pending_request_count): in the queue,
        or in a batch waiting for the rate limiter."""
        return len(self.queues) + self._awaiting_instance

    async def run(self, job: Job) -> Arrays:
        """This request's outputs: its rows of its batch's outputs. Its `rows` is its batch size (ignored
        without batching); its `priority` and `timeout_us` place it in the queues."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self.batched:
            rows = job.rows
            # The server checks this first (server/model.py); this guards direct users of the batcher.
            if rows > self.max_batch_size:
                raise invalid(f"batch size {rows} is over max_batch_size {self.max_batch_size}")
            job.size = max(1, rows)  # zero rows count as one, as in Triton
            job.signature = (
                signature(job.inputs) if not self.ragged else ragged_signature(job.inputs, self.ragged)
            )
            if self.executor.with_parameters:  # the model is given one set of parameters per batch
                job.signature = (job.signature, tuple(sorted(parameters_of(job).items())))
        else:
            job.size = 1
            job.signature = None
        job.arrival_ns = self.clock.now_ns()
        job.deadline_ns = 0  # none
        job.future = loop.create_future()
        job.where = OUT
        if job.trace is not None:
            job.trace.stamp(QUEUE_START, job.arrival_ns)
        self.queues.push(job, job.priority, job.timeout_us)
        if job.trace is not None:
            self._traced += 1
        self._unanswered.enter()
        self._kick()
        try:
            return await job.future
        except asyncio.CancelledError:
            if self.queues.remove(job):  # the caller went away before its batch was formed
                self.stats.record_failure(1, self.clock.now_ns() - job.arrival_ns, "CANCELED")
                self._unanswered.leave()
                self._kick()
            raise
        finally:
            if job.trace is not None:
                self._traced -= 1

    def enqueue(self, job: Job) -> None:
        """`run` without the wait, for a caller that made `job.future` itself and awaits it (the sequence
        batcher): the job is queued at its priority; `withdraw` takes it back while it is queued."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self.batched:
            job.size = max(1, job.rows)
            job.signature = (
                signature(job.inputs) if not self.ragged else ragged_signature(job.inputs, self.ragged)
            )
        else:
            job.size = 1
            job.signature = None
        job.arrival_ns = self.clock.now_ns()
        job.deadline_ns = 0
        job.where = OUT
        if job.trace is not None:
            job.trace.stamp(QUEUE_START, job.arrival_ns)
            self._traced += 1
            job.future.add_done_callback(self._untraced)
        self.queues.push(job, job.priority, job.timeout_us)
        self._unanswered.enter()
        self._kick()

    def _untraced(self, _: asyncio.Future) -> None:
        self._traced -= 1

    def withdraw(self, job: Job) -> bool:
        """Takes back a job `enqueue` queued, unless its batch was formed (False: it executes)."""
        if not self.queues.remove(job):
            return False
        self._unanswered.leave()
        self._kick()
        return True

    async def drain(self) -> None:
        """Waits until every queued request is answered and no batch is executing."""
        await self._unanswered.wait_idle()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None

    # ------------------------------------------------------------------------------------------ scheduling

    def _kick(self) -> None:
        """Schedules a look at the queue once the requests arriving in this loop iteration are queued."""
        if not self._kicked:
            self._kicked = True
            self._loop.call_soon(self._schedule)

    def _schedule(self) -> None:
        self._kicked = False
        while True:
            now = self.clock.now_ns()
            rejected = self.queues.expire(now)
            if rejected:
                self._reject(rejected, now)
            if not self._free or not self.queues:
                wake = None
                break
            count, wake = self._form(now)
            if not count:
                break
            self._dispatch(self.queues.take(count), now)
        self._arm(wake)

    def _form(self, now: int) -> tuple[int, int | None]:
        """How many requests from the front of the queue make the next batch now (0: none yet), and
        when to look again if the batch is waiting for its delay."""
        count = size = best = 0
        full = False  # the next request does not fit: the batch cannot grow
        first_signature = oldest = None
        for job in self.queues:
            if count:
                if size + job.size > self.max_preferred and not best:
                    best = count  # the largest batch within the preferred sizes
                if size + job.size > self.max_batch_size or job.signature != first_signature:
                    full = True
                    break
            else:
                first_signature, oldest = job.signature, job.arrival_ns
            count += 1
            size += job.size
            oldest = min(oldest, job.arrival_ns)
            if size in self.preferred:
                best = count
        if not count:
            return 0, None
        waited_enough = self.delay_ns and now - oldest >= self.delay_ns
        if best and not waited_enough:
            return best, None
        if full or size >= self.max_preferred or waited_enough or not self.delay_ns:
            return count, None
        return 0, oldest + self.delay_ns

    def _arm(self, wake: int | None) -> None:
        """One timer, at the next moment the queue needs a look: a batch's delay over, or a timeout."""
        deadline = self.queues.next_deadline()
        if deadline is not None:
            deadline += 1  # a request times out strictly after its deadline
            wake = deadline if wake is None else min(wake, deadline)
        if wake == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, wake
        if wake is not None:
            self._timer = self.clock.call_later(wake - self.clock.now_ns(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self._schedule()

    def _reject(self, jobs: list[Job], now: int) -> None:
        self.stats.record_failure(len(jobs), sum(now - w.arrival_ns for w in jobs), reason="REJECTED")
        for job in jobs:
            error: Any = InferError(ErrorKind.UNAVAILABLE, TIMED_OUT)
            if self.on_answer is not None:
                error = self.on_answer(job, error)
            if not job.future.done():
                job.future.set_exception(error)
        self._unanswered.leave(len(jobs))

    # ------------------------------------------------------------------------------------------ execution

    def _dispatch(self, jobs: list[Job], now: int) -> None:
        batch = _Batch(jobs, now)
        if self.preserve_ordering:
            self._formed.append(batch)
        self._free -= 1
        if self.executor.inline and self.limited is None:  # a plain execute runs here, on the loop
            try:
                result = self.executor.run_batch(jobs)
            except InferError as e:
                self._finish(batch, None, e, from_schedule=True)
            else:
                self._finish(batch, result, None, from_schedule=True)
            return
        task = self._loop.create_task(self._execute(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, batch: _Batch) -> None:
        try:
            if self.limited is None:
                result = await self.executor.run(batch.jobs)
            else:
                result = await self._run_limited(batch.jobs)
        except InferError as e:
            self._finish(batch, None, e)
        except asyncio.CancelledError:  # the loop is shutting down: nobody is left waiting for an answer
            self._finish(batch, None, InferError(ErrorKind.UNAVAILABLE, f"{self.executor.label} is stopping"))
            raise
        except Exception as e:  # the executor wraps the model's errors; this is a bug of ours
            self._finish(batch, None, self.executor.failure(e))
        else:
            self._finish(batch, result, None)

    async def _run_limited(self, jobs: list[Job]) -> Result:
        """The batch once the rate limiter gives it an instance whose resources are free."""
        limited = self.limited
        assert limited is not None  # _execute checked
        self._awaiting_instance += len(jobs)
        try:
            instance = await limited.limiter.acquire(limited)
        finally:
            self._awaiting_instance -= len(jobs)
        try:
            return await self.executor.run(jobs)
        finally:
            limited.limiter.release(instance)

    def _finish(
        self, batch: _Batch, result: Result | None, error: InferError | None, from_schedule: bool = False
    ) -> None:
        now = self.clock.now_ns()
        self._free += 1
        jobs = batch.jobs
        if result is not None:
            outputs, input_ns, infer_ns, output_ns, began = result
            if self._traced:
                for job in jobs:
                    if job.trace is not None:
                        job.trace.compute(began, input_ns, infer_ns, output_ns)
            try:
                batch.outcome = self._split(jobs, outputs)
            except InferError as e:
                error = e
            else:
                answered = jobs
                if self.executor.per_request:  # a request the model refused fails alone
                    outcome = zip(jobs, batch.outcome, strict=True)
                    failed = [w for w, answer in outcome if isinstance(answer, InferError)]
                    if failed:
                        self.stats.record_failure(len(failed), sum(now - w.arrival_ns for w in failed))
                        answered = [w for w in jobs if w not in failed]
                self.stats.record_batch(sum(w.size for w in jobs), input_ns, infer_ns, output_ns)
                if answered:
                    each = [now - w.arrival_ns for w in answered]
                    self.stats.record_success(
                        len(answered),
                        sum(each),
                        sum(batch.dispatched_ns - w.arrival_ns for w in answered),
                        input_ns,
                        infer_ns,
                        output_ns,
                        each,
                    )
        if error is not None:
            batch.outcome = error
            self.stats.record_failure(len(jobs), sum(now - w.arrival_ns for w in jobs))
        if not self.preserve_ordering:
            self._answer(batch)
        else:
            formed = self._formed
            while formed and formed[0].outcome is not None:
                self._answer(formed.popleft())
        if not from_schedule:  # _schedule looks at the queue again by itself
            self._kick()

    def _split(self, jobs: list[Job], outputs: Any) -> list[Arrays]:
        return split_outputs(self.executor, self.batched, self._dtypes, jobs, outputs)

    def _answer(self, batch: _Batch) -> None:
        outcome = batch.outcome
        hook = self.on_answer
        if isinstance(outcome, InferError):
            for job in batch.jobs:
                error: Any = InferError(outcome.kind, outcome.message)
                if hook is not None:
                    error = hook(job, error)
                if not job.future.done():  # done: its caller went away
                    job.future.set_exception(error)
        else:
            for job, answer in zip(batch.jobs, outcome, strict=True):
                if hook is not None:
                    answer = hook(job, answer)
                if job.future.done():
                    continue
                if isinstance(answer, InferError):
                    job.future.set_exception(answer)
                else:
                    job.future.set_result(answer)
        self._unanswered.leave(len(batch.jobs))


def split_outputs(
    executor: Executor, batched: bool, dtypes: dict, jobs: list[Job], outputs: Any
) -> list[Arrays]:
    """Each request's rows of a batch's outputs, as views (a per-request backend's answers as they are);
    outputs not among `dtypes` (the configured ones, name -> numpy dtype) are left out."""
    label = executor.label
    if executor.per_request:
        if not isinstance(outputs, list) or len(outputs) != len(jobs):
            got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
            raise InferError(ErrorKind.INTERNAL, f"{label} answered {got} responses for {len(jobs)} requests")
        return outputs
    if not isinstance(outputs, dict):
        raise InferError(
            ErrorKind.INTERNAL, f"{label} returned {type(outputs).__name__}, not a dict of outputs"
        )
    if not batched:
        return [outputs]
    total = sum(w.rows for w in jobs)
    arrays = {}
    for name, output in outputs.items():
        if dtypes and name not in dtypes:
            continue  # not a configured output: never answered
        if not isinstance(output, np.ndarray):
            try:
                output = np.asarray(output, dtype=dtypes.get(name))
            except Exception as e:  # outputs numpy cannot make an array of
                raise InferError(
                    ErrorKind.INTERNAL, f"{label} returned outputs that are not arrays: {e}"
                ) from None
        if output.ndim == 0 or output.shape[0] != total:
            got = "a scalar" if output.ndim == 0 else f"{output.shape[0]} rows"
            raise InferError(
                ErrorKind.INTERNAL,
                f"{label} returned {got} for output '{name}' where its batch has {total} rows "
                f"(from {len(jobs)} requests): an output must have one row per input row",
            )
        arrays[name] = output
    if len(jobs) == 1:
        return [arrays]
    answers, start = [], 0
    for job in jobs:
        end = start + job.rows
        answers.append({name: array[start:end] for name, array in arrays.items()})
        start = end
    return answers
