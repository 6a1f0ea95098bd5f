"""One loaded model version: checks requests against its config, runs them, shapes the response."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from enum import Enum
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, cast

from tensorgate.batcher.direct import DirectScheduler
from tensorgate.batcher.dynamic import DynamicBatcher
from tensorgate.batcher.execution import Executor
from tensorgate.batcher.inflight import InFlight
from tensorgate.batcher.rate_limiter import Limited, RateLimitError, limits_config
from tensorgate.batcher.scheduler import Job
from tensorgate.batcher.sequence import SequenceBatcher
from tensorgate.batcher.staging import instance_count, make_staging
from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.datatypes import BY_CONFIG, DataType
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.tensor import (
    InferRequest,
    InferResponse,
    Tensor,
    as_dtype,
    check_reserved,
    custom_parameters,
)
from tensorgate.codec.trace import (
    BACKEND_OUTPUT,
    COMPUTE_END,
    COMPUTE_START,
    QUEUE_INPUT,
    QUEUE_START,
    REQUEST_END,
    REQUEST_START,
    Trace,
)
from tensorgate.server.backends import load_backend
from tensorgate.server.backends.base import stream_only_error
from tensorgate.server.classification import Labels, classify, ensemble_labels, read_labels
from tensorgate.server.response_cache import ResponseCache, cache_for
from tensorgate.server.sequence_config import initial_states
from tensorgate.server.warmup import WarmupError, samples
from tensorgate.server.warmup import run as run_warmup

if TYPE_CHECKING:
    from tensorgate.batcher.scheduler import Scheduler
    from tensorgate.server.backends.base import Backend, Host

UNLOADED = "unloaded"  # the reason of a version unloaded on purpose (a clean end, not a failure)
_serials = itertools.count(1)


class ModelState(Enum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


READY = ModelState.READY  # read for every request: an enum's member costs ~45 ns more to look up


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
        self.streams = False  # the model answers in a stream: its backend has execute_stream
        self.stats = ModelStats()  # Triton's statistics for this version (batcher/stats.py)
        self.labels: Labels = {}  # output name -> its classification labels (server/classification.py)
        self.cache: ResponseCache | None = None  # the server's response cache, when the config enables it
        self._open_streams = InFlight()  # infer_stream answers in progress: unload waits for them too
        self.limited: Limited | None = None  # its instances in the server's rate limiter, if limited
        self.serial = next(_serials)  # this load of the version, apart from any other in this process

    def load(self, host: Host | None = None, cache: ResponseCache | None = None) -> None:
        """Blocking: imports and initializes the backend, handing it `host` (what it may use of the
        server: server/backends/base.py), then runs the config's warmup samples. `cache`: the server's
        response cache, used when the config enables it. Sets state and reason either way."""
        self.state = ModelState.LOADING
        try:
            self.cache = cache_for(self.config, cache)
            labels = read_labels(self.version_dir.parent, self.config)
            self.labels = ensemble_labels(self.config, labels, host)
            warmup = samples(self.config, self.version_dir.parent, self.inputs)
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
                queued=backend.queued,
                staging=staging,
                per_request=backend.per_request,  # it reads each request apart (Triton's python API)
                with_parameters=backend.with_parameters,  # it is given the requests' custom parameters
                ragged=self._ragged() if self.max_batch_size > 0 else frozenset(),
                batch_inputs=tuple(self.config.get("batch_input") or ()),
            )
            limiter = host.rate_limiter if host is not None else None  # --rate-limit execution_count
            # (sequence batching is not rate-limited: docs/scheduling/rate-limiter.md)
            if limiter is not None and limits_config(self.config) and "sequence_batching" not in self.config:
                self.limited = limiter.register(self.executor.label, self.config)
            loop = host.loop if host is not None else None
            stream = _stream_of(backend) if backend.stream_only else None
            for sample in warmup:  # before the version is ready: nothing else runs it yet
                run_warmup(sample, self.executor, self.max_batch_size > 0, loop, stream)
        except BaseException as e:  # a model's code may raise anything, SystemExit included
            if self.backend is not None:  # loaded, but no staging for it (e.g. a GPU id not present)
                with contextlib.suppress(Exception):
                    self.backend.close()
            if self.executor is not None:
                self.executor.close()
            self.backend = self.executor = None
            self._unlimit()
            self.state = ModelState.UNAVAILABLE
            why = str(e) if isinstance(e, (WarmupError, RateLimitError)) else f"{type(e).__name__}: {e}"
            self.reason = f"failed to load '{self.name}' version {self.version}: {why}"
            return
        if "sequence_batching" in self.config:
            try:
                self.scheduler = self._sequence_batcher(backend)
            except (OSError, ValueError, InferError) as e:  # an initial_state file; a streaming model
                self.executor.close()
                with contextlib.suppress(Exception):
                    backend.close()
                self.backend = self.executor = None
                self._unlimit()
                self.state = ModelState.UNAVAILABLE
                self.reason = f"failed to load '{self.name}' version {self.version}: {e}"
                return
        elif "dynamic_batching" in self.config:
            # DynamicBatcher subclasses the Scheduler protocol without run_now: its `now` is False
            self.scheduler = DynamicBatcher(  # type: ignore[abstract]
                self.executor, self.config, self.stats, limited=self.limited
            )
        else:
            self.scheduler = DirectScheduler(self.executor, self.stats, self.limited)
        self.stream_only = backend.stream_only
        self.streams = backend.execute_stream is not None
        self.state = ModelState.READY
        self.reason = ""

    def _ragged(self) -> frozenset[str]:
        """The inputs with `allow_ragged_batch` (requests batch together whatever their shapes)."""
        return frozenset(e["name"] for e in self.config["input"] if e.get("allow_ragged_batch"))

    def _unlimit(self) -> None:
        """Takes the version's instances out of the rate limiter, if they were in it."""
        if self.limited is not None:
            self.limited.limiter.unregister(self.limited)
            self.limited = None

    def _sequence_batcher(self, backend: Backend) -> SequenceBatcher:
        """The scheduler of a stateful model, its initial states read from `<model>/initial_state/`."""
        if backend.execute_stream is not None:
            raise ValueError(
                f"model '{self.name}' streams its answers (execute_stream or decoupled), which "
                "sequence_batching does not schedule"
            )
        states = initial_states(self.config, self.version_dir.parent)
        assert self.executor is not None  # load made it
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
            self._unlimit()
        self.backend = self.scheduler = self.executor = None
        self.streams = False
        self.state = ModelState.UNAVAILABLE
        self.reason = UNLOADED

    @property
    def inline(self) -> bool:
        """Whether each request runs at once on the event loop and leaves nothing behind in the server: a
        plain `execute` of our API, no batcher, no response cache, no stream, no rate limiter, nothing on
        a device. Such a version may also run in every front-end worker (--worker-models inline)."""
        scheduler = self.scheduler
        runs_now = scheduler is not None and scheduler.now
        return self.ready and runs_now and self.cache is None and not self.streams

    @property
    def ready(self) -> bool:
        return self.state is READY

    def not_ready(self) -> str:
        """Triton's text for a request to this version while it is not ready, with the reason."""
        text = f"Request for unknown model: '{self.name}' version {self.version} is not at ready state"
        return f"{text}: {self.reason}" if self.reason else text

    async def infer(self, request: InferRequest) -> InferResponse:
        if request.trace is not None:
            return await self._infer_traced(request, request.trace)
        if self.state is not READY or self.scheduler is None:
            raise InferError(ErrorKind.UNAVAILABLE, self.not_ready())
        if self.stream_only:  # refused as bad input, before it is counted (as Triton refuses it)
            raise stream_only_error(self.name)
        arrays, rows = self._inputs_and_rows(request)
        wanted = self._wanted_outputs(request)
        scheduler = self.scheduler
        if self.cache is not None:
            produced = await self._cached(request, arrays, rows)
        elif scheduler.now:  # the hot path of small models: no job, no coroutine
            if request.parameters:
                self._scheduling(request.parameters)  # checked as for any model, though nothing queues
            produced = scheduler.run_now(arrays, rows)
        else:
            priority, timeout = self._scheduling(request.parameters) if request.parameters else (0, 0)
            produced = await scheduler.run(Job(arrays, rows, priority, timeout, request))
        outputs = [self._response_tensor(name, produced) for name in wanted]
        if request.outputs is not None:
            self._classify(request, outputs)
        return InferResponse(self.name, self.version_str, outputs, request.id)

    async def _infer_traced(self, request: InferRequest, trace: Trace) -> InferResponse:
        """`infer` for a sampled request: its REQUEST_START / REQUEST_END (its scheduler stamps the rest)
        and, at level TENSORS, its inputs and outputs (never the hot path)."""
        self._begin_trace(trace, request)
        try:
            if self.state is not READY or self.scheduler is None:
                raise InferError(ErrorKind.UNAVAILABLE, self.not_ready())
            if self.stream_only:
                raise stream_only_error(self.name)
            arrays, rows = self._inputs_and_rows(request)
            wanted = self._wanted_outputs(request)
            if self.cache is not None:
                produced = await self._cached(request, arrays, rows, trace)
            else:
                priority, timeout = self._scheduling(request.parameters) if request.parameters else (0, 0)
                produced = await self.scheduler.run(Job(arrays, rows, priority, timeout, request, trace))
            outputs = [self._response_tensor(name, produced) for name in wanted]
            if request.outputs is not None:
                self._classify(request, outputs)
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

    async def _cached(
        self, request: InferRequest, arrays: dict[str, Any], rows: int, trace: Trace | None = None
    ) -> Any:
        """The model's outputs through the response cache (server/response_cache.py): a hit skips the
        scheduler and the model; a miss runs them and keeps the answer. Both are timed for the
        statistics as Triton times them (a miss: the lookup and the insertion)."""
        # infer and _infer_traced call it with both set
        cache: ResponseCache = self.cache  # type: ignore[assignment]
        scheduler: Scheduler = self.scheduler  # type: ignore[assignment]
        priority, timeout = self._scheduling(request.parameters) if request.parameters else (0, 0)
        start = perf_counter_ns()
        key = cache.key(self.name, self.version_str, arrays, custom_parameters(request.parameters))
        produced = cache.get(key) if key is not None else None
        looked = perf_counter_ns()
        if produced is not None:
            self.stats.record_cache_hit(looked - start)
            return produced
        if scheduler.now and trace is None:
            produced = scheduler.run_now(arrays, rows)
        else:
            produced = await scheduler.run(Job(arrays, rows, priority, timeout, request, trace))
        if key is not None:
            inserting = perf_counter_ns()
            kept = self._cacheable(produced)
            if kept is not None:
                cache.put(key, kept)
            self.stats.record_cache_miss(looked - start + perf_counter_ns() - inserting)
        return produced

    def _cacheable(self, produced: Any) -> dict[str, Any] | None:
        """Every output of the config from a model's answer, as host arrays of their datatypes; None when
        the answer lacks one (it is then not kept: a later request could want it)."""
        if not isinstance(produced, dict) or not all(name in produced for name in self.outputs):
            return None
        return {name: as_dtype(produced[name], spec.dtype.numpy) for name, spec in self.outputs.items()}

    def _inputs_and_rows(self, request: InferRequest) -> tuple[dict[str, Any], int]:
        """The arrays the model executes on, and the request's batch size (1 without batching). A fault
        is answered with Triton's text (core src/infer_request.cc), which clients match."""
        arrays: dict[str, Any] = {}
        batch = None
        inputs = self.inputs
        for tensor in request.inputs:
            name, shape = tensor.name, tensor.shape
            spec = inputs.get(name)
            if spec is None or name in arrays or tensor.datatype != spec.dtype.v2 or not spec.matches(shape):
                raise self._input_error(request, tensor, spec, name in arrays)
            data = tensor.data
            if spec.batched:
                if batch is not None and shape[0] != batch:
                    raise invalid(
                        f"{_log_request(request)}input '{name}' batch size does not match other inputs "
                        f"for '{self.name}'"
                    )
                batch = shape[0]
            if spec.model_dims is not None:
                data = data.reshape(shape[:1] + spec.model_dims if spec.batched else spec.model_dims)
            arrays[name] = data
        if batch is not None and batch > self.max_batch_size:
            raise invalid(
                f"{_log_request(request)}inference request batch-size must be <= {self.max_batch_size} "
                f"for '{self.name}'"
            )
        if len(arrays) < len(inputs):
            missing = [n for n, s in inputs.items() if n not in arrays and not s.optional]
            if missing:
                raise invalid(self._missing_inputs(request, arrays, missing))
        return arrays, 1 if batch is None else batch

    def _missing_inputs(self, request: InferRequest, given: dict, missing: list[str]) -> str:
        """Triton's text for a request that leaves out required inputs."""
        required = sum(not s.optional for s in self.inputs.values())
        expected = (
            f"expected {len(self.inputs)} inputs"
            if required == len(self.inputs)
            else f"expected number of inputs between {required} and {len(self.inputs)}"
        )
        return (
            f"{_log_request(request)}{expected} but got {len(given)} inputs for model '{self.name}'. "
            f"Got input(s) [{','.join(repr(n) for n in given)}], but missing required input(s) "
            f"[{','.join(repr(n) for n in missing)}]. Please provide all required input(s)."
        )

    def _input_error(
        self, request: InferRequest, tensor: Tensor, spec: TensorSpec | None, repeated: bool
    ) -> InferError:
        """What is wrong with an input that `_inputs_and_rows` refused, in Triton's words."""
        prefix = _log_request(request)
        if spec is None:
            return invalid(f"unexpected inference input '{tensor.name}' for model '{self.name}'")
        if repeated:
            return invalid(f"{prefix}input '{tensor.name}' already exists in request")
        if tensor.datatype != spec.dtype.v2:
            return invalid(
                f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                f"'{self.name}' expects '{spec.dtype.v2}'"
            )
        note = (
            "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
            "prepended to each input shape. If you want to specify the full shape including the batch dim "
            "in your input dims config, try setting max_batch_size to zero. See the model configuration "
            "docs for more info on max_batch_size."
            if spec.batched
            else ""
        )
        return invalid(
            f"{prefix}unexpected shape for input '{tensor.name}' for model '{self.name}'. Expected "
            f"{_dims(spec.shape)}, got {_dims(tensor.shape)}. {note}"
        )

    def _scheduling(self, parameters: dict) -> tuple[int, int]:
        """The request parameters `priority` and `timeout` (microseconds in the queue), as Triton reads
        them: unsigned integers, 0 when absent. The other parameters are the model's (a "triton_" key
        Triton does not name is refused)."""
        check_reserved(parameters)
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
                raise invalid(f"unexpected inference output '{requested.name}' for model '{self.name}'")
        return [o.name for o in request.outputs]

    def _classify(self, request: InferRequest, outputs: list[Tensor]) -> None:
        """Replaces each output requested with `classification: N` by its top N classes, in place."""
        for i, requested in enumerate(request.outputs or ()):
            if requested.class_count:
                labels = self.labels.get(requested.name)
                outputs[i] = classify(outputs[i], requested.class_count, labels, self.max_batch_size > 0)

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

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """One response per yield of the model's `execute_stream`. Bad requests raise here, at the call;
        what the model raises comes out of the iteration. Closing the iterator closes the model's."""
        backend = self.backend
        if backend is None or not self.ready:
            raise InferError(ErrorKind.UNAVAILABLE, self.not_ready())
        if not self.streams:
            raise invalid(f"model '{self.name}' does not stream its answers: use plain infer")
        arrays, rows = self._inputs_and_rows(request)
        wanted = self._wanted_outputs(request)
        # backend.execute_stream is set: self.streams checked it
        if backend.per_request:
            return self._stream(backend.execute_stream(arrays, request), wanted, request, rows)  # type: ignore[misc]
        if backend.with_parameters:
            stream = backend.execute_stream(arrays, custom_parameters(request.parameters))  # type: ignore[misc]
            return self._stream(stream, wanted, request, rows)
        return self._stream(backend.execute_stream(arrays), wanted, request, rows)  # type: ignore[misc]

    async def _stream(
        self, produced_stream: AsyncIterator[Any], wanted: list[str], request: InferRequest, rows: int
    ) -> AsyncIterator[InferResponse]:
        """The answers of one streamed request, counted in the statistics as one request executed alone
        from its start to its last answer (perf_analyzer reads them); a failed or abandoned one fails."""
        if not self.ready:  # created before an unload began, started after: the model may be gone
            await produced_stream.aclose()  # type: ignore[attr-defined]  # Backend.execute_stream's: a generator
            raise InferError(ErrorKind.UNAVAILABLE, self.not_ready())
        self._open_streams.enter()
        start = perf_counter_ns()
        trace, request_id = request.trace, request.id
        if trace is not None:  # a stream has no queue: it computes from its start to its last answer
            self._begin_trace(trace, request)
            trace.stamp(QUEUE_START, start)
            trace.stamp(COMPUTE_START, start)
        finished = False
        try:
            async with aclosing(produced_stream):  # type: ignore[type-var]  # as above
                async for produced in produced_stream:
                    outputs = [self._response_tensor(name, produced) for name in wanted]
                    if trace is not None and trace.records_tensors:
                        for tensor in outputs:
                            trace.tensor(BACKEND_OUTPUT, tensor.name, tensor.datatype, tensor.data)
                    if request.outputs is not None:
                        self._classify(request, outputs)
                    yield InferResponse(self.name, self.version_str, outputs, request_id)
            finished = True
        except InferError:
            raise
        except Exception as e:  # the model's execute_stream failed: as a failed execute, for every protocol
            raise cast(Executor, self.executor).failure(e) from None  # load made it; unload waits for us
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


def _stream_of(backend: Backend) -> Callable[[Job], AsyncIterator[Any]]:
    """How a job's request reaches a backend that only streams (warmup runs its samples so)."""
    stream = backend.execute_stream
    assert stream is not None  # load calls it for a backend that only streams
    if backend.per_request:
        return lambda job: stream(job.inputs, job.request)
    if backend.with_parameters:
        return lambda job: stream(job.inputs, custom_parameters(job.request.parameters))
    return lambda job: stream(job.inputs)


def _log_request(request: InferRequest) -> str:
    """The prefix Triton's request errors carry (InferenceRequest::LogRequest)."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _dims(shape: tuple[int, ...]) -> str:
    """A shape as Triton's messages write it: [-1,16]."""
    return "[" + ",".join(str(d) for d in shape) + "]"
