"""The direct path: a `Scheduler` (batcher/scheduler.py) for a model without `dynamic_batching`, each
request executed alone. The other implementation is the dynamic batcher (batcher/dynamic.py).
"""

import asyncio
from time import perf_counter_ns

from tensorgate.batcher.execution import Executor, alone
from tensorgate.batcher.inflight import InFlight
from tensorgate.batcher.rate_limiter import Instance, Limited
from tensorgate.batcher.scheduler import Arrays, Job, Scheduler
from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.errors import InferError
from tensorgate.codec.trace import QUEUE_START


class DirectScheduler(Scheduler):
    """Executes each request alone.

    A plain `execute` runs to completion on the event loop, so requests never overlap and there is
    nothing to wait for. An `async def execute`, or a backend that runs in a worker thread, runs with at
    most `instances` (instance_group count) requests in flight, or `queued` times that where a backend's
    instances hold more than one (Backend.queued); the others wait their turn.
    """

    def __init__(
        self, executor: Executor, stats: ModelStats | None = None, limited: Limited | None = None
    ) -> None:
        """`limited`: the model's instances in the server's rate limiter (batcher/rate_limiter.py), when
        its instance groups give a `rate_limiter`: each request then waits for an instance whose resources
        are free."""
        self.executor = executor
        self.stats = stats if stats is not None else ModelStats()
        self.limited = limited
        # then run_now() is run() without a coroutine: numpy on the event loop
        self.now = (
            executor.inline
            and executor.host
            and not (executor.per_request or executor.with_parameters)
            and limited is None
        )
        # no queue: requests waiting for an instance are counted as executing; under the rate limiter,
        # those waiting for resources are pending
        self.pending = 0
        self._slots = asyncio.Semaphore(executor.instances * executor.queued)
        self._in_flight = InFlight()  # requests executing or waiting for a slot: what drain() waits for

    async def run(self, job: Job) -> Arrays:
        """The model's outputs for one request; its priority and timeout matter only to the dynamic
        batcher."""
        if self.now:
            if job.trace is None:
                return self.run_now(job.inputs, job.rows)
            return self._run_now_traced(job)
        executor = self.executor
        if self.limited is not None:
            return await self._run_limited(job)
        if not executor.inline:
            return await self._run_waiting(job)
        start = perf_counter_ns()
        if job.trace is not None:
            job.trace.stamp(QUEUE_START, start)
        try:
            outputs, input_ns, infer_ns, output_ns, began = executor.run_one(job)
        except InferError:
            self.stats.record_failure(1, perf_counter_ns() - start)
            raise
        self._record(job.rows, perf_counter_ns() - start, 0, input_ns, infer_ns, output_ns)
        if job.trace is not None:
            job.trace.compute(began, input_ns, infer_ns, output_ns)
        return outputs

    def run_now(self, inputs: Arrays, rows: int = 1) -> Arrays:
        """`run` without a coroutine, where `now` says it never waits: numpy on the event loop, the whole
        time counted as compute_infer. The hot path of small models."""
        start = perf_counter_ns()
        try:
            outputs = self.executor.execute(inputs)
        except InferError:
            self.stats.record_failure(1, perf_counter_ns() - start)
            raise
        except Exception as e:
            self.stats.record_failure(1, perf_counter_ns() - start)
            raise self.executor.failure(e) from None
        self.stats.record_alone(rows, perf_counter_ns() - start)
        return outputs

    def _run_now_traced(self, job: Job) -> Arrays:
        """`run_now` for a traced request (never the hot path): no queue, no staging, the whole time in
        compute_infer, as the statistics count it."""
        trace = job.trace
        assert trace is not None  # run checked it
        start = perf_counter_ns()
        trace.stamp(QUEUE_START, start)
        outputs = self.run_now(job.inputs, job.rows)
        trace.compute(start, 0, perf_counter_ns() - start, 0)
        return outputs

    async def _run_waiting(self, job: Job) -> Arrays:
        executor = self.executor
        self._in_flight.enter()
        handed_off = False  # once a worker thread has the request, its completion ends it
        start = perf_counter_ns()
        if job.trace is not None:
            job.trace.stamp(QUEUE_START, start)
        try:
            await self._slots.acquire()
            queue_ns = perf_counter_ns() - start
            if executor.in_thread:
                work = executor.threads.submit(executor.run_one, job)
                work.add_done_callback(self._thread_done)
                handed_off = True
                # A caller that goes away does not stop the thread: its slot frees when the thread ends.
                outputs, input_ns, infer_ns, output_ns, began = await asyncio.shield(work)
            else:
                try:
                    outputs, input_ns, infer_ns, output_ns, began = await executor.run_async([job])
                    if executor.per_request:
                        outputs = alone(outputs)
                finally:
                    self._slots.release()
        except InferError:
            self.stats.record_failure(1, perf_counter_ns() - start)
            raise
        finally:
            if not handed_off:
                self._in_flight.leave()
        self._record(job.rows, perf_counter_ns() - start, queue_ns, input_ns, infer_ns, output_ns)
        if job.trace is not None:
            job.trace.compute(began, input_ns, infer_ns, output_ns)
        return outputs

    async def _run_limited(self, job: Job) -> Arrays:
        """`run` under the rate limiter: the request waits for a slot, then for an instance whose
        resources are free, then executes; the resources are held until it is over, even when its caller
        goes away meanwhile."""
        limited = self.limited
        assert limited is not None  # run checked
        executor = self.executor
        self._in_flight.enter()
        start = perf_counter_ns()
        if job.trace is not None:
            job.trace.stamp(QUEUE_START, start)
        try:
            self.pending += 1  # waiting for a slot and for the rate limiter: not yet executing
            try:
                await self._slots.acquire()
                try:
                    instance = await limited.limiter.acquire(limited)
                except BaseException:
                    self._slots.release()
                    raise
            finally:
                self.pending -= 1
        except BaseException:
            self._in_flight.leave()
            raise
        queue_ns = perf_counter_ns() - start
        work = asyncio.ensure_future(executor.run([job]))
        work.add_done_callback(lambda done: self._limited_done(done, instance))
        try:
            outputs, input_ns, infer_ns, output_ns, began = await asyncio.shield(work)
            if executor.per_request:
                outputs = alone(outputs)
        except InferError:
            self.stats.record_failure(1, perf_counter_ns() - start)
            raise
        self._record(job.rows, perf_counter_ns() - start, queue_ns, input_ns, infer_ns, output_ns)
        if job.trace is not None:
            job.trace.compute(began, input_ns, infer_ns, output_ns)
        return outputs

    def _limited_done(self, work: asyncio.Future, instance: Instance) -> None:
        if not work.cancelled():
            work.exception()  # retrieved here: the caller may be gone
        assert self.limited is not None  # only _run_limited hands work here
        self.limited.limiter.release(instance)
        self._slots.release()
        self._in_flight.leave()

    def _record(
        self, rows: int, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        self.stats.record_batch(rows, input_ns, infer_ns, output_ns)
        self.stats.record_success(1, total_ns, queue_ns, input_ns, infer_ns, output_ns)

    def _thread_done(self, work: asyncio.Future) -> None:
        if not work.cancelled():
            work.exception()  # retrieved here: the caller may be gone
        self._slots.release()
        self._in_flight.leave()

    async def drain(self) -> None:
        """Waits until no request is executing or waiting to execute."""
        await self._in_flight.wait_idle()

    def close(self) -> None:
        """Nothing to release: no timers, no queue."""
