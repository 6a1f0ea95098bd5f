"""`triton_python_backend_utils`, ours: what a model.py written for Triton's python backend imports as
`pb_utils` (no file of Triton's is needed; the python backend puts this module in `sys.modules` under
that name before it runs a model.py). Its job: Triton's API as a model sees it, every name of it found
here, and the requests that cross between a model and the server.

The names and behaviour follow Triton's python_backend README. Defined beside this module, and imported
here as the API: Tensor and the datatype helpers (pb_tensors.py), InferenceResponse and the response
sender of decoupled models (pb_responses.py), TritonError and TritonModelException (pb_errors.py),
ModelConfig and the config helpers (pb_model_config.py), Logger (pb_logger.py), MetricFamily
(custom_metrics.py). Defined here, as they share where a model's calls go: InferenceRequest (received
by `execute`, or built by the model to call another model: BLS), the model loading calls (load_model,
unload_model, is_model_ready: the server's repository API) and the flag constants of requests.

What Triton spreads over shared memory and a stub process runs here in the server's process: tensors
are numpy arrays, always on the CPU, and a BLS call goes through the called model's own scheduler and
batcher without serializing anything: the server the calls go to is the host the python backend loaded
the model for (`attach_host`, at load; one per process, as Triton's stub serves one server). In a
model's own process (`EXECUTION_MODE process`), BLS calls go to the server through the `Caller` the
process attaches (server/backends/stub.py).
"""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferRequest as _Request
from tensorgate.codec.tensor import RequestedOutput as _RequestedOutput
from tensorgate.codec.tensor import Tensor as _WireTensor
from tensorgate.codec.tensor import custom_parameters
from tensorgate.server.backends import pb_errors, pb_logger, pb_model_config, pb_responses, pb_tensors
from tensorgate.server.backends.custom_metrics import Metric, MetricFamily  # noqa: F401 (Triton's API)
from tensorgate.server.backends.pb_errors import TritonError, TritonModelException
from tensorgate.server.backends.pb_logger import Logger, LogLevel  # noqa: F401 (Triton's API)
from tensorgate.server.backends.pb_model_config import (  # noqa: F401 (Triton's API)
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
)
from tensorgate.server.backends.pb_responses import (  # noqa: F401 (Triton's API)
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponse,
    InferenceResponseSender,
    get_output_tensor_by_name,
)
from tensorgate.server.backends.pb_tensors import (  # noqa: F401 (Triton's API)
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Host

# The modules that define Triton's API: a model.py that imported a name of one uses Triton's API
# (server/backends/module.py).
API_MODULES = frozenset(
    module.__name__ for module in (pb_errors, pb_logger, pb_model_config, pb_responses, pb_tensors)
) | {__name__}

TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2

_host: "Host | None" = None  # where BLS calls go: the server's models and event loop


class Caller(Protocol):
    """Where a model's BLS calls go when it runs in a process of its own (server/backends/stub.py): to
    the server, answered with the call's responses (one; a decoupled call's all)."""

    def exec(self, request: "InferenceRequest", decoupled: bool) -> "list[InferenceResponse]": ...

    async def async_exec(self, request: "InferenceRequest", decoupled: bool) -> "list[InferenceResponse]": ...

    def control(self, operation: str, arguments: dict) -> Any:
        """A model loading call (load_model, unload_model, is_model_ready) run by the server: its
        result, or raises TritonModelException with the server's error."""
        ...

    def watch_cancels(self) -> None:
        """From now on, the server's word that a request's client went away reaches its request."""
        ...


_caller: Caller | None = None


def attach_caller(caller: Caller) -> None:
    """A model's process: its BLS calls go to the server through `caller`."""
    global _caller
    _caller = caller


def attach_host(host: "Host") -> None:
    """The server's, not Triton's: called by the python backend as it loads a model (server/backends/
    module.py), so that the model's BLS calls reach that server's models."""
    global _host
    _host = host


# ------------------------------------------------------------------------------------------- errors


_KIND_OF_CODE = {
    TritonError.INVALID_ARG: ErrorKind.INVALID_ARGUMENT,
    TritonError.NOT_FOUND: ErrorKind.NOT_FOUND,
    TritonError.UNAVAILABLE: ErrorKind.UNAVAILABLE,
    TritonError.UNSUPPORTED: ErrorKind.UNIMPLEMENTED,
    TritonError.CANCELLED: ErrorKind.UNAVAILABLE,
}
_CODE_OF_KIND = {kind: code for code, kind in _KIND_OF_CODE.items() if code != TritonError.CANCELLED}


def as_infer_error(error: "TritonError") -> InferError:
    """A model's TritonError as the error every protocol answers."""
    return InferError(_KIND_OF_CODE.get(error.code(), ErrorKind.INTERNAL), error.message())


# ------------------------------------------------------------------------------------------- requests


class InferenceTrace:
    """A request's trace, as `request.trace()` gives it: handed to a BLS request
    (`InferenceRequest(..., trace=request.trace())`), the call is traced as a child of this request's
    trace (when the request is traced at all)."""

    def __init__(self, trace: Any = None) -> None:
        self._trace = trace  # codec.trace.Trace, or None for a request that is not traced

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The W3C context the client sent with the traced request, as JSON (Triton's form), else None."""
        if self._trace is None or not self._trace.traceparent:
            return None
        return json.dumps({"traceparent": self._trace.traceparent})


class InferenceRequest:
    """A request: one that `execute` receives, or one a model builds to call another model (BLS)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_version: int = -1,
        correlation_id: int | str = 0,
        request_id: str = "",
        flags: int = 0,
        timeout: int = 0,
        parameters: dict | str | None = None,
        trace: InferenceTrace | None = None,
        **_ignored: Any,  # preferred_memory: meaningless in one process
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._request_id = request_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self._sender: InferenceResponseSender | None = None
        self._cancelled = False  # a non-decoupled request: its client went away (set by the server)
        self._trace = trace if trace is not None else InferenceTrace()

    # what a model reads of a request it received
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as Triton gives them."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        """This request's trace: pass it to a BLS request to trace that call as its child."""
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                f"model '{self._model_name}' is not decoupled: answer from execute() instead of a sender"
            )
        return self._sender

    def is_cancelled(self) -> bool:
        """Whether the request's client went away (its call cancelled, its connection closed): a model
        may stop working on it early."""
        if self._sender is not None:
            return self._sender.is_cancelled()
        if not self._cancelled and _caller is not None:
            _caller.watch_cancels()
        return self._cancelled

    def set_release_flags(self, flags: int) -> None:
        """Accepted for compatibility: requests are released when their answers are sent."""

    # BLS: this request sent to another model of the same server
    def exec(self, decoupled: bool = False) -> Any:
        """Blocking BLS call, from a model's execute running in a worker thread. An error comes back as
        a response with `has_error()`; `decoupled=True` gives an iterator over the responses."""
        if _caller is not None:
            responses = _caller.exec(self, decoupled)
            return iter(responses) if decoupled else responses[0]
        loop = None if _host is None else _host.loop
        if loop is None:
            raise TritonModelException("BLS needs the server running: no repository is bound")
        if _runs_on(loop):
            raise TritonModelException(
                "exec() would block the event loop: "
                "in an `async def execute`, use `await request.async_exec()`"
            )
        if decoupled:
            return iter(asyncio.run_coroutine_threadsafe(self._collect(), loop).result())
        return asyncio.run_coroutine_threadsafe(self.async_exec(), loop).result()

    async def async_exec(self, decoupled: bool = False) -> Any:
        """BLS call from an `async def execute` (or any coroutine on the server's loop)."""
        if _caller is not None:
            responses = await _caller.async_exec(self, decoupled)
            return _aiter(responses) if decoupled else responses[0]
        if decoupled:
            return self._stream()
        try:
            version, request = self._resolved()
            response = await version.infer(request)
        except InferError as e:
            return _error_response(e)
        return InferenceResponse([Tensor._of(t.name, t.data, t.datatype) for t in response.outputs])

    async def _stream(self) -> AsyncIterator[InferenceResponse]:
        try:
            version, request = self._resolved()
            async for response in version.infer_stream(request):
                yield InferenceResponse([Tensor._of(t.name, t.data, t.datatype) for t in response.outputs])
        except InferError as e:
            yield _error_response(e)

    async def _collect(self) -> list[InferenceResponse]:
        return [response async for response in self._stream()]

    def _resolved(self) -> tuple[Any, _Request]:
        if _host is None:
            raise InferError(ErrorKind.UNAVAILABLE, "BLS needs the server running: no repository is bound")
        number = self._model_version
        version = _host.resolve(self._model_name, "" if number < 0 else str(number))
        tensors = [_WireTensor(t.name(), t._v2, t._array.shape, t._array) for t in self._inputs]
        outputs = [_RequestedOutput(name) for name in self._requested] or None
        parameters = json.loads(self._parameters) if self._parameters else {}
        request = _Request(self._model_name, version.version_str, self._request_id or None, tensors, outputs,
                           parameters)  # fmt: skip
        if self._trace._trace is not None:
            request.trace = self._trace._trace.child()
        request.sequence_id, request.sequence_flags = self._correlation_id, self._flags  # a stateful model's
        return version, request


async def _aiter(responses: list[InferenceResponse]) -> AsyncIterator[InferenceResponse]:
    for response in responses:
        yield response


def _error_response(error: InferError) -> InferenceResponse:
    return InferenceResponse(
        error=TritonError(error.message, _CODE_OF_KIND.get(error.kind, TritonError.INTERNAL))
    )


def received_request(
    model_name: str,
    model_version: int,
    inputs: dict[str, np.ndarray],
    dtypes: dict[str, str],
    served: Any,
    sender: InferenceResponseSender | None = None,
) -> InferenceRequest:
    """The InferenceRequest a model's execute receives: its own tensors, id, parameters and the outputs
    it asked for (all of the model's when it named none). `served` is the server's InferRequest."""
    request = InferenceRequest(model_name, model_version=model_version)
    request._inputs = [Tensor._of(name, array, dtypes[name]) for name, array in inputs.items()]
    if served is not None:
        request._request_id = served.id or ""
        if served.trace is not None:
            request._trace = InferenceTrace(served.trace)
        request._correlation_id, request._flags = served.sequence_id, served.sequence_flags
        if served.parameters:  # its custom ones: Triton gives a model no reserved parameter
            request._parameters = json.dumps(custom_parameters(served.parameters))
        if served.outputs is not None:
            request._requested = [o.name for o in served.outputs]
    request._sender = sender
    return request


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


# ------------------------------------------------------------------------------------ model loading


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Loads (or reloads) a model of the server's repository, as the repository API's load does: it
    needs --model-control-mode explicit. `config` (JSON) replaces the model's config; `files`
    ("1/model.py" -> its bytes, Triton's "file:" parameters without the prefix) its folder."""
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', "
            "files should be a dictionary of file paths and file contents"
        )
    _control("load", {"name": model_name, "config": config, "files": files or {}})


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unloads a model of the server's repository (--model-control-mode explicit)."""
    _control("unload", {"name": model_name, "unload_dependents": unload_dependents})


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the model (`model_version` of it; "": any version) is ready, as the v2 ready endpoint
    answers; False for a model the server does not know."""
    return bool(_control("ready", {"name": model_name, "version": model_version}))


CONTROL_FAILED = {"load": "Failed to load model: ", "unload": "Failed to unload model: ",
                   "ready": "Failed to check model readiness: "}  # fmt: skip


def _control(operation: str, arguments: dict) -> Any:
    if _caller is not None:
        return _caller.control(operation, arguments)
    loop = None if _host is None else _host.loop
    if _host is None or loop is None:
        raise TritonModelException(CONTROL_FAILED[operation] + "the server is not running")
    if _runs_on(loop):
        raise TritonModelException(
            CONTROL_FAILED[operation] + f"{operation} would block the event loop: call it from a thread"
        )
    try:
        return asyncio.run_coroutine_threadsafe(control(_host, operation, arguments), loop).result()
    except InferError as e:
        raise TritonModelException(CONTROL_FAILED[operation] + e.message) from None


async def control(host: "Host", operation: str, arguments: dict) -> Any:
    """A model loading call run on the server's loop (in a model's process too, through its Caller):
    its result, or raises InferError with the repository's error."""
    name = arguments["name"]
    if operation == "load":
        files = {path.removeprefix("file:"): bytes(data) for path, data in arguments["files"].items()}
        await host.load_model(name, arguments["config"] or None, files or None)
        return None
    if operation == "unload":
        await host.unload_model(name, unload_dependents=bool(arguments["unload_dependents"]))
        return None
    version = str(arguments["version"])
    if version and not (version.isdigit() and int(version) > 0):
        raise InferError(
            ErrorKind.INVALID_ARGUMENT,
            f"failed to get model version from specified version string '{version}', version should be "
            "an integral value > 0",
        )
    try:
        return host.model(name).is_ready(version)
    except InferError:
        return False  # an unknown model, or version: not ready


def _runs_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs `loop` (a blocking wait for it here would never end)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
