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
import copy
import inspect
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tensorgate.server.backends.pb_utils as pb_utils
from tensorgate.batcher.sequence_inputs import added_inputs
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
        decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        self.stream_only = decoupled
        if decoupled:
            self.execute = self._refuse
        elif self.is_async:
            self.execute = self._execute_async
        else:
            self.execute = self._execute
        self.execute_stream = self._execute_decoupled if decoupled else None
        if hasattr(self.model, "initialize"):
            self.model.initialize(initialize_args(config, version, module.path))

    def _requests(self, jobs: list[Job]) -> list[pb_utils.InferenceRequest]:
        name, version, dtypes = self.name, self.version, self.dtypes
        return [pb_utils.received_request(name, version, job.inputs, dtypes, job.request) for job in jobs]

    def _execute(self, jobs: list[Job]) -> list:
        requests = self._requests(jobs)
        return self._answers(len(requests), self.model.execute(requests))

    async def _execute_async(self, jobs: list[Job]) -> list:
        requests = self._requests(jobs)
        return self._answers(len(requests), await self.model.execute(requests))

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
            loop.call_soon_threadsafe(sent.put_nowait, (response, flags))

        sender = pb_utils.InferenceResponseSender(deliver)
        received = pb_utils.received_request(self.name, self.version, inputs, self.dtypes, request, sender)
        if self.is_async:
            running = asyncio.ensure_future(self.model.execute([received]))
        else:
            running = loop.run_in_executor(None, self.model.execute, [received])

        def finished(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is not None:
                sent.put_nowait((future.exception(), FINAL))

        running.add_done_callback(finished)
        try:
            while True:
                response, flags = await sent.get()
                if isinstance(response, BaseException):
                    raise response
                if response is not None:
                    outputs = self._outputs(response)
                    if isinstance(outputs, InferError):
                        raise outputs
                    yield outputs
                if flags & FINAL:
                    return
        finally:
            sender._cancelled = True  # the client went away, or the answers are over

    def close(self) -> None:
        self._module.unload(self.model)


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
    """initialize's `args`, as Triton gives them, for instance number `instance` of the model."""
    groups = config.get("instance_group") or [{}]
    kind = groups[0].get("kind", "KIND_CPU")
    gpus = groups[0].get("gpus") or [0]
    return {
        "model_config": json.dumps(config),
        "model_name": config["name"],
        "model_version": str(version),
        "model_repository": str(model_path.parent.parent),
        "model_instance_kind": "GPU" if kind == "KIND_GPU" else "CPU",
        "model_instance_name": f"{config['name']}_{instance}",
        "model_instance_device_id": str(gpus[0]) if kind == "KIND_GPU" else "0",
    }
