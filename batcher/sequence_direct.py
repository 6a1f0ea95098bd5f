"""The sequence batcher's `direct` strategy (Triton's DirectSequenceBatch): each sequence bound to one
batch slot of one model instance until it ends, so a model that keeps state per slot finds it there.

There are max(1, max_batch_size) slots per instance (instance_group count); a new sequence takes the
lowest free slot number of any instance. An instance executes one batch at a time: rows 0 to its highest
slot with a request ready, each row the next request of that slot's sequence, or a "null" row where the
slot is empty (or its request's shapes differ from the batch's): the inputs of another request of the
batch, with READY (and every other control) false and CORRID 0, whose answer is dropped.
`direct { max_queue_delay_microseconds, minimum_slot_utilization }`: with both set, a batch waits until
that share of the slots has a request ready, or its oldest request has waited that long.

Statistics, as Triton's backends report them: a batch counts its rows, empty slots included
(inference_count, batch_stats); each request its own success or failure.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import TYPE_CHECKING

from tensorgate.batcher.dynamic import signature, split_outputs
from tensorgate.batcher.execution import Executor, Result
from tensorgate.batcher.inflight import InFlight
from tensorgate.batcher.scheduler import Job
from tensorgate.batcher.sequence_inputs import state_outputs
from tensorgate.codec.datatypes import BY_CONFIG
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.trace import QUEUE_START

if TYPE_CHECKING:
    from tensorgate.batcher.clock import Clock, Timer
    from tensorgate.batcher.sequence import Sequence, SequenceBatcher
    from tensorgate.batcher.stats import ModelStats


class _Instance:
    __slots__ = ("slots", "busy")

    def __init__(self, width: int) -> None:
        self.slots: list[Sequence | None] = [None] * width  # the sequence bound to each batch slot
        self.busy = False  # executing a batch


class DirectStrategy:
    def __init__(
        self, core: SequenceBatcher, executor: Executor, config: dict, stats: ModelStats, clock: Clock
    ) -> None:
        self.core = core
        self.executor = executor
        self.stats = stats
        self.clock = clock
        self.batched = config.get("max_batch_size", 0) > 0
        self.width = max(1, config.get("max_batch_size", 0))
        direct = config["sequence_batching"]["direct"]
        self.delay_ns = direct["max_queue_delay_microseconds"] * 1000
        self.utilization = direct["minimum_slot_utilization"]
        self.instances = [_Instance(self.width) for _ in range(executor.instances)]
        # free slots as (slot number, instance): the lowest slot number first, as Triton picks them
        self._free = [(slot, number) for number in range(executor.instances) for slot in range(self.width)]
        heapq.heapify(self._free)
        outputs = {e["name"]: e["data_type"] for e in config.get("output", ())} | state_outputs(config)
        self._dtypes = {name: BY_CONFIG[t].numpy for name, t in outputs.items()}
        self.pending = 0  # its requests wait in their sequences' queues, counted by the core
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kicked = False
        self._timer: Timer | None = None
        self._batches = InFlight()
        self._tasks: set[asyncio.Task] = set()

    def bind(self, sequence: Sequence) -> bool:
        if not self._free:
            return False
        slot, number = heapq.heappop(self._free)
        self.instances[number].slots[slot] = sequence
        sequence.slot = (number, slot)
        return True

    def release(self, sequence: Sequence) -> None:
        number, slot = sequence.slot
        self.instances[number].slots[slot] = None
        heapq.heappush(self._free, (slot, number))
        sequence.slot = None

    def ready(self, sequence: Sequence) -> None:
        self._kick()

    def _kick(self) -> None:
        """A look at the slots once the requests arriving in this loop iteration are queued."""
        if not self._kicked:
            self._kicked = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._schedule)

    def withdraw(self, job: Job) -> bool:
        return False  # a request leaves its sequence's queue only to execute

    # ------------------------------------------------------------------------------------------ batches

    def _schedule(self) -> None:
        self._kicked = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self.clock.now_ns()
        wake = None
        for instance in self.instances:
            if instance.busy:
                continue
            jobs, at = self._form(instance, now)
            if jobs:
                self._dispatch(instance, jobs, now)
            elif at is not None:
                wake = at if wake is None else min(wake, at)
        if wake is not None:
            self._timer = self.clock.call_later(wake - now, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _form(self, instance: _Instance, now: int) -> tuple[list[Job] | None, int | None]:
        """The next batch of an idle instance, or when to look again (a batch waiting for its delay)."""
        slots = instance.slots
        ready = [i for i, s in enumerate(slots) if s is not None and s.queue and not s.busy]
        if not ready:
            return None, None
        if self.delay_ns and self.utilization and len(ready) / self.width < self.utilization:
            oldest = min(slots[i].queue[0].arrival_ns for i in ready)
            if now - oldest < self.delay_ns:
                return None, oldest + self.delay_ns
        core = self.core
        first = slots[ready[0]]
        representative = core.prepare(first)
        shape = signature(representative.inputs)
        rows: list[Job | None] = []
        for index in range(ready[-1] + 1):
            sequence = slots[index]
            if sequence is first:
                rows.append(core.take(first))
            elif (
                sequence is not None and sequence.queue and signature(core.prepare(sequence).inputs) == shape
            ):
                rows.append(core.take(sequence))
            else:
                rows.append(None)
        if None not in rows:
            return rows, None
        null_inputs = core.inputs.null_inputs(representative.inputs)
        return [job if job is not None else _null_job(null_inputs) for job in rows], None

    def _dispatch(self, instance: _Instance, jobs: list[Job], now: int) -> None:
        instance.busy = True
        self._batches.enter()
        if self.executor.inline:  # a plain execute runs here, on the loop
            try:
                result = self.executor.run_batch(jobs)
            except InferError as e:
                self._finish(instance, jobs, now, None, e)
            else:
                self._finish(instance, jobs, now, result, None)
            return
        task = self._loop.create_task(self._execute(instance, jobs, now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, instance: _Instance, jobs: list[Job], dispatched: int) -> None:
        try:
            result = await self.executor.run(jobs)
        except InferError as e:
            self._finish(instance, jobs, dispatched, None, e)
        except asyncio.CancelledError:  # the loop is shutting down
            error = InferError(ErrorKind.UNAVAILABLE, f"{self.executor.label} is stopping")
            self._finish(instance, jobs, dispatched, None, error)
            raise
        except Exception as e:  # the executor wraps the model's errors; this is a bug of ours
            self._finish(instance, jobs, dispatched, None, self.executor.failure(e))
        else:
            self._finish(instance, jobs, dispatched, result, None)

    def _finish(
        self,
        instance: _Instance,
        jobs: list[Job],
        dispatched: int,
        result: Result | None,
        error: InferError | None,
    ) -> None:
        now = self.clock.now_ns()
        instance.busy = False
        answers = None
        input_ns = infer_ns = output_ns = 0
        if result is not None:
            outputs, input_ns, infer_ns, output_ns, began = result
            for job in jobs:
                if job.trace is not None:
                    job.trace.stamp(QUEUE_START, job.arrival_ns)
                    job.trace.compute(began, input_ns, infer_ns, output_ns)
            try:
                answers = split_outputs(self.executor, self.batched, self._dtypes, jobs, outputs)
            except InferError as e:
                error = e
            else:
                self.stats.record_batch(len(jobs), input_ns, infer_ns, output_ns)
        for index, job in enumerate(jobs):
            if job.sequence is None:
                continue  # an empty slot's row: nobody to answer
            answer = answers[index] if answers is not None else InferError(error.kind, error.message)
            answer = self.core.finished(job, answer)
            if isinstance(answer, InferError):
                self.stats.record_failure(1, now - job.arrival_ns)
                if not job.future.done():
                    job.future.set_exception(answer)
            else:
                total = now - job.arrival_ns
                self.stats.record_success(
                    1, total, dispatched - job.arrival_ns, input_ns, infer_ns, output_ns
                )
                if not job.future.done():
                    job.future.set_result(answer)
        self._batches.leave()
        self._kick()  # the next batch, if any is ready

    async def drain(self) -> None:
        await self._batches.wait_idle()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _null_job(inputs: dict) -> Job:
    """The row of an empty slot: no request, no sequence, no one to answer."""
    job = Job(inputs)
    job.sequence = None
    return job
