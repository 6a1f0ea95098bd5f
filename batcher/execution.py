"""Executes one batch on a backend: inputs staged, `execute` called the way the backend needs, outputs back
on the host, each phase timed.

How `execute` runs:
- a plain function runs on the event loop (cheap numpy models: no thread hand-off);
- a backend with `in_thread = True`, and any model staged on a GPU (the staging is `blocking`: its copies
  and syncs wait on the device), runs in a worker thread, staging included, so the loop keeps serving; the
  threads are one per instance, each set up once by the staging (its device and compute stream);
- an `async def execute` is awaited on the loop, staging around it (on a GPU, its staging waits there).
The infer time of a batch staged on a GPU ends when the device has run what execute queued.
Any exception becomes an INTERNAL InferError naming the model; its traceback goes to the log.

Each request is a `Job` (batcher/scheduler.py). A `per_request` backend (Triton's python API:
`execute(requests)`) is given the batch's jobs apart, `execute(jobs)`, each with its arrays and its
request, nothing gathered, and answers a list with one entry per job: its outputs, or the InferError that
answers it alone. A `with_parameters` backend (our python API's `execute(inputs, parameters)`, ensembles)
is given beside the batch the custom parameters its requests share.
"""

import logging
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import numpy as np

from tensorgate.batcher.scheduler import Arrays, Job
from tensorgate.batcher.staging import HostStaging, Staging
from tensorgate.batcher.threads import Threads
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import custom_parameters

log = logging.getLogger("tensorgate.batcher")

# host outputs, the ns spent staging inputs, executing, and bringing outputs back, and when the execution
# started (perf_counter_ns: a traced request's COMPUTE_START, codec/trace.py)
Result = tuple[Arrays, int, int, int, int]


class Executor:
    def __init__(
        self,
        execute: Callable[[Arrays], Any],
        *,
        label: str,
        is_async: bool = False,
        in_thread: bool = False,
        instances: int = 1,
        queued: int = 1,
        staging: Staging | None = None,
        per_request: bool = False,
        with_parameters: bool = False,
        ragged: frozenset[str] = frozenset(),
        batch_inputs: tuple[dict, ...] = (),
    ) -> None:
        self.execute = execute
        self.per_request = per_request
        # Ragged batching (the config's allow_ragged_batch inputs and batch_input entries): such inputs are
        # given as the 1-D concatenation of the requests' elements, the batch inputs computed per batch,
        # as Triton's backends give them. A per-request backend reads each request's own tensors instead.
        self.ragged = ragged
        self.batch_inputs = batch_inputs
        self.collects = bool(ragged or batch_inputs) and not per_request
        # execute(inputs, parameters): the custom parameters its batch's requests share (the dynamic
        # batcher batches only requests whose custom parameters agree)
        self.with_parameters = with_parameters
        self.label = label  # "model 'm' version 1", for messages
        self.is_async = is_async
        self.staging: Staging = staging if staging is not None else HostStaging()
        self.in_thread = (in_thread or self.staging.blocking) and not is_async
        self.inline = not is_async and not self.in_thread
        self.instances = instances
        self.queued = queued  # batches an instance may hold at once (Backend.queued)
        # staging is then the identity for one request
        self.host = type(self.staging) is HostStaging and not self.collects
        self._threads: Threads | None = None

    def run_batch(self, jobs: list[Job]) -> Result:
        """Blocking: one batch of these jobs, in batch order."""
        try:
            if self.per_request:
                start = perf_counter_ns()
                produced = self.execute(jobs)
                return produced, 0, perf_counter_ns() - start, 0, start
            batch, start, staged = self._gather(jobs)
            produced = (
                self.execute(batch, parameters_of(jobs[0])) if self.with_parameters else self.execute(batch)
            )
            self.staging.finished()
            return self._finish(produced, start, staged)
        except InferError:
            raise
        except Exception as e:
            raise self.failure(e) from None

    def run_one(self, job: Job) -> Result:
        """Blocking: one request executed alone."""
        if self.per_request:
            produced, input_ns, infer_ns, output_ns, start = self.run_batch([job])
            return alone(produced), input_ns, infer_ns, output_ns, start
        if not self.host:
            return self.run_batch([job])
        try:
            start = perf_counter_ns()
            inputs = job.inputs
            produced = (
                self.execute(inputs, parameters_of(job)) if self.with_parameters else self.execute(inputs)
            )
            return produced, 0, perf_counter_ns() - start, 0, start
        except InferError:
            raise
        except Exception as e:
            raise self.failure(e) from None

    async def run_async(self, jobs: list[Job]) -> Result:
        """One batch through an `async def execute`."""
        try:
            if self.per_request:
                start = perf_counter_ns()
                produced = await self.execute(jobs)
                return produced, 0, perf_counter_ns() - start, 0, start
            batch, start, staged = self._gather(jobs)
            if self.with_parameters:
                return self._finish(await self.execute(batch, parameters_of(jobs[0])), start, staged)
            return self._finish(await self.execute(batch), start, staged)
        except InferError:
            raise
        except Exception as e:
            raise self.failure(e) from None

    async def run(self, jobs: list[Job]) -> Result:
        """One batch, however this backend executes."""
        if self.is_async:
            return await self.run_async(jobs)
        if self.in_thread:
            return await self.threads.submit(self.run_batch, jobs)
        return self.run_batch(jobs)

    @property
    def threads(self) -> Threads:
        if self._threads is None:
            self._threads = Threads(self.instances, "execute", self.staging.enter_thread)
        return self._threads

    def _gather(self, jobs: list[Job]) -> tuple[dict[str, Any], int, int]:
        """The batch arrays (each input's arrays of the jobs, in order, staged as one), and the clock
        before and after staging them."""
        start = perf_counter_ns()
        gather = self.staging.gather
        if self.collects:
            batch = {
                name: gather(name, parts) for name, parts in collect(jobs, self.ragged, self.batch_inputs)
            }
        else:
            batch = {name: gather(name, [job.inputs[name] for job in jobs]) for name in jobs[0].inputs}
        return batch, start, perf_counter_ns()

    def _finish(self, produced: Any, start: int, staged: int) -> Result:
        """Called once execute has run: the outputs on the host, and the input/infer/output times."""
        executed = perf_counter_ns()
        outputs = self._to_host(produced)
        return outputs, staged - start, executed - staged, perf_counter_ns() - executed, start

    def _to_host(self, produced: Any) -> Any:
        # Anything but a dict is left for the caller to reject with its own message.
        return self.staging.to_host(produced) if isinstance(produced, dict) and not self.host else produced

    def failure(self, error: Exception) -> InferError:
        log.error("%s: execute failed", self.label, exc_info=error)
        return InferError(ErrorKind.INTERNAL, f"{self.label} failed: {type(error).__name__}: {error}")

    def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        self.staging.close()


def collect(
    jobs: list[Job], ragged: frozenset[str], batch_inputs: tuple[dict, ...]
) -> list[tuple[str, list]]:
    """Each input of a batch as the parts to concatenate, as Triton's backends collect them: a ragged
    input's requests flattened (the batch is then 1-D), the others as they are; then each batch_input
    target, computed from its source input (backend common's BackendInputCollector)."""
    out = [
        (
            name,
            [job.inputs[name].reshape(-1) for job in jobs]
            if name in ragged
            else [job.inputs[name] for job in jobs],
        )
        for name in jobs[0].inputs
    ]
    for entry in batch_inputs:
        value = batch_input(entry, [job.inputs[entry["source_input"][0]] for job in jobs])
        out.extend((target, [value]) for target in entry["target_name"])
    return out


def batch_input(entry: dict, sources: list[Any]) -> np.ndarray:
    """The value of one batch_input (model_config.proto BatchInput.Kind) for a batch whose source input
    the requests give as `sources`, in batch order."""
    kind = entry["kind"]
    dtype = np.float32 if entry["data_type"] == "TYPE_FP32" else np.int32
    counts = [int(np.prod(a.shape)) for a in sources]
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts), dtype=dtype)  # only its shape means something
    # BATCH_ITEM_SHAPE, BATCH_ITEM_SHAPE_FLATTEN: each batch item's shape, without the batch dimension
    items = [list(a.shape[1:]) for a in sources for _ in range(a.shape[0])]
    shapes = np.array(items, dtype=dtype).reshape(len(items), max(a.ndim for a in sources) - 1)
    return shapes if kind == "BATCH_ITEM_SHAPE" else shapes.reshape(-1)


def parameters_of(job: Job) -> dict[str, Any]:
    """The custom parameters of a job's request (none for a job without one)."""
    request = job.request
    return custom_parameters(request.parameters) if request is not None else {}


def alone(answers: Any) -> Any:
    """The one answer of a per-request batch of one: its outputs, or its error raised."""
    if not isinstance(answers, list) or len(answers) != 1:
        raise InferError(ErrorKind.INTERNAL, f"a per-request backend answered {answers!r} for one request")
    if isinstance(answers[0], InferError):
        raise answers[0]
    return answers[0]
