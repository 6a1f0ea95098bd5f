"""The two interfaces between the server and its backends, written down: `Backend`, what the server reads
of a loaded backend, and `Host`, what a backend may use of the server that loads it (handed to it at
load: `load_backend(..., host)`).

A leaf among the backends: every backend and the server import it; it imports none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from tensorgate.codec.errors import ErrorKind, InferError

if TYPE_CHECKING:
    from tensorgate.batcher.rate_limiter import RateLimiter
    from tensorgate.batcher.staging import Staging
    from tensorgate.server.app_monitor import AppMonitor
    from tensorgate.server.model import ModelVersion


class Backend(Protocol):
    """One loaded model version, as the server reads it (server/model.py, server/endpoints/customized.py;
    nothing else reads a backend). A backend class subclasses it for the defaults of the optional members.
    """

    # How the batcher calls `execute` (batcher/execution.py).
    is_async: bool = False  # execute is `async def`: awaited on the event loop
    in_thread: bool = False  # execute blocks (a forward pass): the batcher runs it in a worker thread
    instances: int = 0  # batches in flight at once; 0: the config's instance_group count
    # batches each instance may hold at once without the dynamic batcher (batcher/direct.py): above 1, the
    # next waits in an instance's process while it executes one (server/backends/process.py)
    queued: int = 1
    staging: Staging | None = None  # the staging it built for itself (its device); None: the config's
    # Triton's python API: `execute(jobs)` is given the batch's requests apart (batcher/job.py: each with
    # its arrays and its InferRequest) and answers one entry per job, its outputs or the InferError that
    # answers it alone; `execute_stream(inputs, request)` gets the request beside its arrays.
    per_request: bool = False
    # `execute(inputs, parameters)` (and `execute_stream(inputs, parameters)`): given the custom parameters
    # of its requests (codec.tensor.custom_parameters), which the dynamic batcher keeps one per batch.
    with_parameters: bool = False

    # Streaming: `execute_stream(inputs)`, an async generator, one answer per yield (None: the backend does
    # not stream). A `stream_only` backend has no plain execute: a plain infer is refused before it counts.
    execute_stream: Callable[..., AsyncIterator[Any]] | None = None
    stream_only: bool = False

    # Instances restarted after their process died (server/backends/process.py); None: not processes.
    restarts: int | None = None

    # grps customized HTTP (server/endpoints/customized.py): handle_http(http), plain or async.
    handle_http: Callable[[Any], Any] | None = None

    def execute(self, inputs: dict[str, Any]) -> Any:
        """One batch: input name -> array (the batch dimension first when the model batches), answered as
        output name -> array; an awaitable of that when `is_async`."""
        ...

    def close(self) -> None:
        """Releases the model; called once, at unload, when no batch is executing any more."""
        ...


class Host(Protocol):
    """What a backend may use of the server that loads it, handed to it at load: the other models its
    model calls (BLS, ensemble steps), each through its own scheduler and batcher; the event loop they
    serve on (a BLS call from a worker thread goes through it); and where its models record their own
    metrics (grps's app_monitor). The repository is the server's (server/repository.py)."""

    app_monitor: AppMonitor
    loop: asyncio.AbstractEventLoop | None  # None until the server runs
    python_execution_mode: (
        str  # EXECUTION_MODE for python models whose config names none (--python-execution-mode)
    )
    rate_limiter: RateLimiter | None  # --rate-limit execution_count, else None

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The ready version of model `name` that a request naming `version` ("": the newest ready one)
        reaches; raises InferError (NOT_FOUND, UNAVAILABLE) as a request for it is answered."""
        ...

    def model(self, name: str) -> Any:
        """Model `name` (server/model.py Model: `is_ready(version)`); raises InferError NOT_FOUND."""
        ...

    async def load_model(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """The repository API's load (pb_utils.load_model); raises InferError as that API answers."""
        ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """The repository API's unload (pb_utils.unload_model)."""
        ...


def stream_only_error(model: str) -> InferError:
    """The answer to a plain infer of a model that only streams its answers (`Backend.stream_only`)."""
    return InferError(
        ErrorKind.INVALID_ARGUMENT,
        f"model '{model}' only streams its answers: use grps streaming or gRPC ModelStreamInfer",
    )
