"""Triton's python backend API: a model.py written for Triton runs unchanged.

    import triton_python_backend_utils as pb_utils          # server/backends/pb_utils.py

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config): ...   # optional
        def initialize(self, args): ...                              # optional
        def execute(self, requests): return [pb_utils.InferenceResponse(...) for each request]
        def finalize(self): ...                                      # optional

`args` holds strings, as Triton's: model_config (JSON), model_name, model_version, model_repository,
model_instance_kind, model_instance_name, model_instance_device_id. `execute` receives the requests of
one batch apart (dynamic batching gives several, each with its own tensors), runs in a worker thread (so
a BLS `exec()` may block on another model; `async def execute` runs on the event loop and uses
`await async_exec()`), and answers one response per request, in order; a response with a TritonError
fails its request alone, an exception fails the batch. This module runs such a model in threads of the
server (`EXECUTION_MODE thread`: `instance_group` count threads share the one model object). By default
each instance is a process of its own instead, as Triton's stubs are (server/backends/python.py decides;
server/backends/process.py runs this API's model there through server/backends/stub.py).

Decoupled models (`model_transaction_policy { decoupled: true }`) answer through
`request.get_response_sender()`, from any thread, until TRITONSERVER_RESPONSE_COMPLETE_FINAL: they are
served to streaming clients (ModelStreamInfer, grps streaming) as our `execute_stream` models are, and a
plain infer is refused as for those.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import tensorgate.server.backends.pb_utils as pb_utils
from tensorgate.batcher.sequence_inputs import added_inputs
from tensorgate.batcher.staging import instance_count
from tensorgate.batcher.stats import ResponseStats
from tensorgate.codec.datatypes import BY_CONFIG
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.backends.base import Backend, stream_only_error
from tensorgate.server.backends.module import ModelModule

if TYPE_CHECKING:
    from tensorgate.batcher.scheduler import Job
    from tensorgate.server.backends.base import Host

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonBackend(Backend):
    per_request = True  # execute(jobs): each request apart (batcher/execution.py)

    def __init__(self, module: ModelModule, config: dict, version: int) -> None:
        self._module = module
        self.name = config["name"]
        self.version = version
        self.dtypes = {entry["name"]: BY_CONFIG[entry["data_type"]].v2 for entry in config["input"]}
        # the control and state inputs a sequence batcher adds to each request
        self.dtypes.update({name: BY_CONFIG[t].v2 for name, t in added_inputs(config).items()})
        self.model = module.model_class()
        execute = getattr(self.model, "execute", None)
        if execute is None:
            raise TypeError(f"{module.path}: TritonPythonModel must define execute(self, requests)")
        self.is_async = inspect.iscoroutinefunction(execute)
        self.in_thread = not self.is_async
        self._threads: ThreadPoolExecutor | None = None
        decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        self.stream_only = decoupled
        if decoupled:
            self.execute = self._refuse
        elif self.is_async:
            self.execute = self._execute_async
        else:
            # Its threads awaited on the loop, not the batcher's: a caller that goes away while execute
            # runs is seen here, and reaches the model as request.is_cancelled().
            self.is_async, self.in_thread = True, False
            self._threads = ThreadPoolExecutor(instance_count(config, "cpu"), f"{self.name}-execute")
            self.execute = self._execute
        self.execute_stream = self._execute_decoupled if decoupled else None
        self.response_stats = ResponseStats()  # its decoupled responses' (response_stats)
        if hasattr(self.model, "initialize"):
            self.model.initialize(initialize_args(config, version, module.path))

    def _requests(self, jobs: list[Job]) -> list[pb_utils.InferenceRequest]:
        name, version, dtypes = self.name, self.version, self.dtypes
        return [pb_utils.received_request(name, version, job.inputs, dtypes, job.request) for job in jobs]

    async def _execute(self, jobs: list[Job]) -> list:
        requests = self._requests(jobs)
        work = asyncio.get_running_loop().run_in_executor(self._threads, self.model.execute, requests)
        return self._answers(len(requests), await returned(work, jobs, requests))

    async def _execute_async(self, jobs: list[Job]) -> list:
        requests = self._requests(jobs)
        work = asyncio.ensure_future(self.model.execute(requests))
        return self._answers(len(requests), await returned(work, jobs, requests))

    def _refuse(self, jobs: list[Job]) -> list:
        raise stream_only_error(self.name)

    def _answers(self, count: int, responses: Any) -> list:
        """One entry per request: its outputs, or the InferError that answers it."""
        if not isinstance(responses, list) or len(responses) != count:
            got = (
                f"{len(responses)} responses"
                if isinstance(responses, list)
                else repr(type(responses).__name__)
            )
            raise InferError(
                ErrorKind.INTERNAL,
                f"model '{self.name}': execute() must return a list of one InferenceResponse per request "
                f"({count}), got {got}",
            )
        return [self._outputs(response) for response in responses]

    def _outputs(self, response: Any) -> dict | InferError:
        if not isinstance(response, pb_utils.InferenceResponse):
            return InferError(
                ErrorKind.INTERNAL,
                f"model '{self.name}': execute() returned {type(response).__name__} where an "
                "InferenceResponse was expected",
            )
        if response.has_error():
            return pb_utils.as_infer_error(response.error())
        return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}

    async def _execute_decoupled(self, inputs: dict[str, Any], request: Any = None) -> AsyncIterator[dict]:
        """A decoupled model's answers to one request, as they are sent, until the FINAL flag."""
        loop = asyncio.get_running_loop()
        sent: asyncio.Queue = asyncio.Queue()

        def deliver(response: pb_utils.InferenceResponse | BaseException | None, flags: int) -> None:
            loop.call_soon_threadsafe(sent.put_nowait, (response, flags, perf_counter_ns()))

        sender = pb_utils.InferenceResponseSender(deliver)
        received = pb_utils.received_request(self.name, self.version, inputs, self.dtypes, request, sender)
        if self.is_async:
            running = asyncio.ensure_future(self.model.execute([received]))
        else:
            running = loop.run_in_executor(None, self.model.execute, [received])

        def finished(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is not None:
                sent.put_nowait((future.exception(), FINAL, 0))

        running.add_done_callback(finished)
        # Triton's response_stats: each response's compute_infer from the previous send() (or the start)
        # to its own, its compute_output from there to its outputs ready here
        counted, start, index, over = self.response_stats, perf_counter_ns(), 0, False
        try:
            while True:
                response, flags, sent_ns = await sent.get()
                if isinstance(response, BaseException):
                    over = True
                    raise response
                if response is not None:
                    outputs = self._outputs(response)
                    ready = perf_counter_ns()
                    if isinstance(outputs, InferError):
                        over = True
                        counted.record(index, "fail", max(0, sent_ns - start))  # no outputs to compute
                        raise outputs
                    counted.record(index, "success", max(0, sent_ns - start), ready - sent_ns)
                    start, index = max(start, sent_ns), index + 1
                    yield outputs
                elif flags & FINAL:
                    counted.record(index, "empty_response", max(0, sent_ns - start))
                if flags & FINAL:
                    over = True
                    return
        finally:
            if not over:  # the client went away
                counted.record(index, "cancel", perf_counter_ns() - start)
            sender._cancelled = True  # the client went away, or the answers are over

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False)
        self._module.unload(self.model)


async def returned(work: asyncio.Future, jobs: list[Job], requests: list[pb_utils.InferenceRequest]) -> Any:
    """What the model's execute returns. A request whose caller goes away meanwhile (its job's future
    cancelled, in the dynamic batcher's batch; or this call cancelled) is marked cancelled for
    `is_cancelled()`, and the model runs on until it returns: its instance is busy until then."""
    for job, request in zip(jobs, requests, strict=True):
        future = getattr(job, "future", None)
        mark_cancelled(future, lambda request=request: setattr(request, "_cancelled", True))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        for request in requests:
            request._cancelled = True
        with contextlib.suppress(Exception):
            await work
        raise


def mark_cancelled(future: asyncio.Future | None, mark: Callable[[], None]) -> None:
    """`mark()` once `future` (a job's, as its caller awaits it) is cancelled."""
    if future is not None:
        future.add_done_callback(lambda done: mark() if done.cancelled() else None)


def complete(version_dir: Path, config: dict, host: Host | None = None) -> dict:
    """The config as the model's `auto_complete_config(auto_complete_model_config)` completes it (a
    model without one leaves it as it is)."""
    module = ModelModule(version_dir, config, 0, host)
    try:
        complete_config = getattr(module.model_class, "auto_complete_config", None)
        if not module.uses_triton_api or complete_config is None:
            return config
        given = pb_utils.ModelConfig(copy.deepcopy(config))
        completed = complete_config(given)
        return (completed if isinstance(completed, pb_utils.ModelConfig) else given).as_dict()
    finally:
        module.close()


def initialize_args(config: dict, version: int, model_path: Path, instance: int = 0) -> dict[str, str]:
    """initialize's `args`, as Triton gives them, for instance number `instance` of the model (its kind
    and device: those its instance group places it on, batcher/staging.py placements)."""
    from tensorgate.batcher.staging import placements

    every = placements(config)
    placed = every[instance % len(every)]
    return {
        "model_config": json.dumps(config),
        "model_name": config["name"],
        "model_version": str(version),
        "model_repository": str(model_path.parent.parent),
        "model_instance_kind": placed.kind,
        "model_instance_name": f"{config['name']}_{instance}",
        "model_instance_device_id": str(placed.device_id),
    }
