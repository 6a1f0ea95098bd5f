"""One loaded model version: checks requests against its config, runs them, shapes the response."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from enum import Enum
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from batcher.direct import DirectScheduler
from batcher.dynamic import DynamicBatcher
from batcher.execution import Executor
from batcher.inflight import InFlight
from batcher.scheduler import Job
from batcher.sequence import SequenceBatcher
from batcher.staging import instance_count, make_staging
from batcher.stats import ModelStats
from codec.datatypes import BY_CONFIG, DataType
from codec.errors import ErrorKind, InferError, invalid
from codec.tensor import InferRequest, InferResponse, Tensor, as_dtype
from codec.trace import (
    BACKEND_OUTPUT,
    COMPUTE_END,
    COMPUTE_START,
    QUEUE_INPUT,
    QUEUE_START,
    REQUEST_END,
    REQUEST_START,
    Trace,
)
from server.backends import load_backend
from server.backends.base import stream_only_error
from server.sequence_config import initial_states

if TYPE_CHECKING:
    from batcher.scheduler import Scheduler
    from server.backends.base import Backend, Host

UNLOADED = "unloaded"  # the reason of a version unloaded on purpose (a clean end, not a failure)


class ModelState(Enum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


class TensorSpec:
    """An input or output of the config: its datatype and the shape a client sees (batch dim included)."""

    def __init__(self, entry: dict, max_batch_size: int) -> None:
        self.name: str = entry["name"]
        self.dtype: DataType = BY_CONFIG[entry["data_type"]]
        self.batched = max_batch_size > 0
        self.dims: tuple[int, ...] = tuple(entry["dims"])
        self.shape: tuple[int, ...] = ((-1,) if self.batched else ()) + self.dims
        self.fixed = -1 not in self.dims  # then a shape check is one tuple comparison
        reshape = entry.get("reshape")
        self.model_dims: tuple[int, ...] | None = tuple(reshape["shape"]) if reshape is not None else None
        self.optional: bool = bool(entry.get("optional", False))

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.dtype.v2, "shape": list(self.shape)}

    def matches(self, shape: tuple[int, ...]) -> bool:
        dims = shape[1:] if self.batched else shape
        if self.fixed:
            return dims == self.dims and len(shape) == len(self.shape)
        return len(dims) == len(self.dims) and all(
            want == -1 or want == got for want, got in zip(self.dims, dims, strict=True)
        )


class ModelVersion:
    def __init__(self, model_dir: Path, config: dict, version: int) -> None:
        self.name: str = config["name"]
        self.version = version
        self.version_str = str(version)
        self.version_dir = model_dir / self.version_str
        self.config = config
        self.max_batch_size: int = config.get("max_batch_size", 0)
        self.inputs = {e["name"]: TensorSpec(e, self.max_batch_size) for e in config["input"]}
        self.outputs = {e["name"]: TensorSpec(e, self.max_batch_size) for e in config["output"]}
        self.output_names = list(self.outputs)
        self.state = ModelState.UNAVAILABLE
        self.reason = ""
        self.backend: Backend | None = None
        # SequenceBatcher with sequence_batching, DynamicBatcher with dynamic_batching, else DirectScheduler
        self.scheduler: Scheduler | None = None
        self.executor: Executor | None = None
        self.stream_only = False  # the backend has execute_stream and no execute
        self.stats = ModelStats()  # Triton's statistics for this version (batcher/stats.py)
        self._open_streams = InFlight()  # infer_stream answers in progress: unload waits for them too

    def load(self, host: Host | None = None) -> None:
        """Blocking: imports and initializes the backend, handing it `host` (what it may use of the
        server: server/backends/base.py). Sets state and reason either way."""
        self.state = ModelState.LOADING
        try:
            backend = self.backend = load_backend(self.version_dir, self.config, self.version, host)
            staging = backend.staging  # the one a backend built for itself, else the config's
            if staging is None:
                staging = make_staging(self.config)
            self.executor = Executor(
                backend.execute,
                label=f"model '{self.name}' version {self.version}",
                is_async=backend.is_async,
                in_thread=backend.in_thread,
                instances=backend.instances or instance_count(self.config, staging.device),
                staging=staging,
                per_request=backend.per_request,  # it reads each request apart (Triton's python API)
            )
        except BaseException as e:  # a model's code may raise anything, SystemExit included
            if self.backend is not None:  # loaded, but no staging for it (e.g. a GPU id not present)
                with contextlib.suppress(Exception):
                    self.backend.close()
            self.backend = None
            self.state = ModelState.UNAVAILABLE
            self.reason = f"failed to load '{self.name}' version {self.version}: {type(e).__name__}: {e}"
            return
        if "sequence_batching" in self.config:
            try:
                self.scheduler = self._sequence_batcher(backend)
            except (OSError, ValueError, InferError) as e:  # an initial_state file; a streaming model
                self.executor.close()
                with contextlib.suppress(Exception):
                    backend.close()
                self.backend = self.executor = None
                self.state = ModelState.UNAVAILABLE
                self.reason = f"failed to load '{self.name}' version {self.version}: {e}"
                return
        elif "dynamic_batching" in self.config:
            self.scheduler = DynamicBatcher(self.executor, self.config, self.stats)
        else:
            self.scheduler = DirectScheduler(self.executor, self.stats)
        self.stream_only = backend.stream_only
        self.state = ModelState.READY
        self.reason = ""

    def _sequence_batcher(self, backend: Backend) -> SequenceBatcher:
        """The scheduler of a stateful model, its initial states read from `<model>/initial_state/`."""
        if backend.execute_stream is not None:
            raise ValueError(
                f"model '{self.name}' streams its answers (execute_stream or decoupled), which "
                "sequence_batching does not schedule"
            )
        states = initial_states(self.config, self.version_dir.parent)
        return SequenceBatcher(self.executor, self.config, self.stats, states)

    async def unload(self) -> None:
        self.state = ModelState.UNLOADING
        await self._open_streams.wait_idle()
        if self.scheduler is not None:
            await self.scheduler.drain()
            self.scheduler.close()
        try:
            if self.backend is not None:
                self.backend.close()
        finally:  # then the executor's staging releases the device memory the model no longer holds
            if self.executor is not None:
                self.executor.close()
        self.backend = self.scheduler = self.executor = None
        self.state = ModelState.UNAVAILABLE
        self.reason = UNLOADED

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    async def infer(self, request: InferRequest) -> InferResponse:
        if request.trace is not None:
            return await self._infer_traced(request, request.trace)
        if self.state is not ModelState.READY or self.scheduler is None:
            raise InferError(
                ErrorKind.UNAVAILABLE, f"model '{self.name}' version {self.version} is not ready"
            )
        if self.stream_only:  # refused as bad input, before it is counted (as Triton refuses it)
            raise stream_only_error(self.name)
        arrays, rows = self._inputs_and_rows(request)
        wanted = self._wanted_outputs(request)
        scheduler = self.scheduler
        if scheduler.now:  # the hot path of small models: no job, no coroutine
            if request.parameters:
                self._scheduling(request.parameters)  # checked as for any model, though nothing queues
            produced = scheduler.run_now(arrays, rows)
        else:
            priority, timeout = self._scheduling(request.parameters) if request.parameters else (0, 0)
            produced = await scheduler.run(Job(arrays, rows, priority, timeout, request))
        outputs = [self._response_tensor(name, produced) for name in wanted]
        return InferResponse(self.name, self.version_str, outputs, request.id)

    async def _infer_traced(self, request: InferRequest, trace: Trace) -> InferResponse:
        """`infer` for a sampled request: its REQUEST_START / REQUEST_END (its scheduler stamps the rest)
        and, at level TENSORS, its inputs and outputs (never the hot path)."""
        self._begin_trace(trace, request)
        try:
            if self.state is not ModelState.READY or self.scheduler is None:
                raise InferError(
                    ErrorKind.UNAVAILABLE, f"model '{self.name}' version {self.version} is not ready"
                )
            if self.stream_only:
                raise stream_only_error(self.name)
            arrays, rows = self._inputs_and_rows(request)
            wanted = self._wanted_outputs(request)
            priority, timeout = self._scheduling(request.parameters) if request.parameters else (0, 0)
            produced = await self.scheduler.run(Job(arrays, rows, priority, timeout, request, trace))
            outputs = [self._response_tensor(name, produced) for name in wanted]
            if trace.records_tensors:
                for tensor in outputs:
                    trace.tensor(BACKEND_OUTPUT, tensor.name, tensor.datatype, tensor.data)
            return InferResponse(self.name, self.version_str, outputs, request.id)
        finally:
            trace.stamp(REQUEST_END, perf_counter_ns())

    def _begin_trace(self, trace: Trace, request: InferRequest) -> None:
        trace.model_name, trace.model_version, trace.request_id = self.name, self.version, request.id or ""
        trace.stamp(REQUEST_START, perf_counter_ns())
        if trace.records_tensors:
            for tensor in request.inputs:
                if tensor.data is not None:
                    trace.tensor(QUEUE_INPUT, tensor.name, tensor.datatype, tensor.data)

    def _inputs_and_rows(self, request: InferRequest) -> tuple[dict[str, Any], int]:
        """The arrays the model executes on, and the request's batch size (1 without batching)."""
        arrays: dict[str, Any] = {}
        batch = None
        inputs = self.inputs
        for tensor in request.inputs:
            name, shape = tensor.name, tensor.shape
            spec = inputs.get(name)
            if spec is None or name in arrays or tensor.datatype != spec.dtype.v2 or not spec.matches(shape):
                raise self._input_error(tensor, spec, name in arrays)
            data = tensor.data
            if spec.batched:
                if shape[0] > self.max_batch_size:
                    raise invalid(
                        f"model '{self.name}', input '{name}' has batch size {shape[0]}, "
                        f"over the model's max_batch_size {self.max_batch_size}"
                    )
                if batch is not None and shape[0] != batch:
                    raise invalid(f"model '{self.name}': inputs disagree on the batch size")
                batch = shape[0]
            if spec.model_dims is not None:
                data = data.reshape(shape[:1] + spec.model_dims if spec.batched else spec.model_dims)
            arrays[name] = data
        if len(arrays) < len(inputs):
            missing = [n for n, s in inputs.items() if n not in arrays and not s.optional]
            if missing:
                raise invalid(f"model '{self.name}': missing input(s) {', '.join(repr(n) for n in missing)}")
        return arrays, 1 if batch is None else batch

    def _input_error(self, tensor: Tensor, spec: TensorSpec | None, repeated: bool) -> InferError:
        """What is wrong with an input that `_inputs_and_rows` refused."""
        if spec is None:
            problem = f"is unknown (expected: {', '.join(self.inputs)})"
        elif repeated:
            problem = "is given twice"
        elif tensor.datatype != spec.dtype.v2:
            problem = f"has datatype {tensor.datatype} where the model expects {spec.dtype.v2}"
        else:
            problem = f"has shape {list(tensor.shape)} where the model expects {list(spec.shape)}"
        return invalid(f"model '{self.name}', input '{tensor.name}' {problem}")

    def _scheduling(self, parameters: dict) -> tuple[int, int]:
        """The request parameters `priority` and `timeout` (microseconds in the queue), as Triton reads
        them: unsigned integers, 0 when absent."""
        values = []
        for key in ("priority", "timeout"):
            value = parameters.get(key, 0)
            if type(value) is not int or not 0 <= value < 1 << 64:
                raise invalid(
                    f"model '{self.name}': unable to parse '{key}': "
                    f"expected an unsigned integer, got {value!r}"
                )
            values.append(value)
        return values[0], values[1]

    def _wanted_outputs(self, request: InferRequest) -> list[str]:
        """The outputs to answer, in order: those requested, else all (a shared list: do not modify)."""
        if request.outputs is None:
            return self.output_names
        for requested in request.outputs:
            if requested.name not in self.outputs:
                raise invalid(
                    f"model '{self.name}': unknown output '{requested.name}' "
                    f"(expected: {', '.join(self.outputs)})"
                )
        return [o.name for o in request.outputs]

    def _response_tensor(self, name: str, produced: Any) -> Tensor:
        spec = self.outputs[name]
        if not isinstance(produced, dict) or name not in produced:
            raise InferError(ErrorKind.INTERNAL, f"model '{self.name}' did not return output '{name}'")
        array = as_dtype(produced[name], spec.dtype.numpy)
        if spec.model_dims is not None:
            array = array.reshape(array.shape[:1] + spec.dims if spec.batched else spec.dims)
        return Tensor(name, spec.dtype.v2, array.shape, array)

    def metadata(self, versions: list[str]) -> dict:
        return {
            "name": self.name,
            "versions": versions,
            "platform": self.config.get("platform") or self.config.get("backend", ""),
            "inputs": [s.metadata() for s in self.inputs.values()],
            "outputs": [s.metadata() for s in self.outputs.values()],
        }

    @property
    def streams(self) -> bool:
        """Whether the model answers in a stream (its backend has `execute_stream`)."""
        return self.backend is not None and self.backend.execute_stream is not None

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """One response per yield of the model's `execute_stream`. Bad requests raise here, at the call;
        what the model raises comes out of the iteration. Closing the iterator closes the model's."""
        backend = self.backend
        if backend is None or not self.ready:
            raise InferError(
                ErrorKind.UNAVAILABLE, f"model '{self.name}' version {self.version} is not ready"
            )
        if not self.streams:
            raise invalid(f"model '{self.name}' does not stream its answers: use plain infer")
        arrays, rows = self._inputs_and_rows(request)
        wanted = self._wanted_outputs(request)
        if backend.per_request:
            return self._stream(backend.execute_stream(arrays, request), wanted, request, rows)
        return self._stream(backend.execute_stream(arrays), wanted, request, rows)

    async def _stream(
        self, produced_stream: AsyncIterator[Any], wanted: list[str], request: InferRequest, rows: int
    ) -> AsyncIterator[InferResponse]:
        """The answers of one streamed request, counted in the statistics as one request executed alone
        from its start to its last answer (perf_analyzer reads them); a failed or abandoned one fails."""
        if not self.ready:  # created before an unload began, started after: the model may be gone
            await produced_stream.aclose()
            raise InferError(
                ErrorKind.UNAVAILABLE, f"model '{self.name}' version {self.version} is not ready"
            )
        self._open_streams.enter()
        start = perf_counter_ns()
        trace, request_id = request.trace, request.id
        if trace is not None:  # a stream has no queue: it computes from its start to its last answer
            self._begin_trace(trace, request)
            trace.stamp(QUEUE_START, start)
            trace.stamp(COMPUTE_START, start)
        finished = False
        try:
            async with aclosing(produced_stream):
                async for produced in produced_stream:
                    outputs = [self._response_tensor(name, produced) for name in wanted]
                    if trace is not None and trace.records_tensors:
                        for tensor in outputs:
                            trace.tensor(BACKEND_OUTPUT, tensor.name, tensor.datatype, tensor.data)
                    yield InferResponse(self.name, self.version_str, outputs, request_id)
            finished = True
        except InferError:
            raise
        except Exception as e:  # the model's execute_stream failed: as a failed execute, for every protocol
            raise self.executor.failure(e) from None
        finally:
            self._open_streams.leave()
            if trace is not None:
                end = perf_counter_ns()
                trace.stamp(COMPUTE_END, end)
                trace.stamp(REQUEST_END, end)
            if finished:
                self.stats.record_alone(rows, perf_counter_ns() - start)
            else:
                self.stats.record_failure(1, perf_counter_ns() - start)
