"""`triton_python_backend_utils`, ours: what a model.py written for Triton's python backend imports as
`pb_utils` (no file of Triton's is needed; the python backend puts this module in `sys.modules` under
that name before it runs a model.py).

The names and behaviour follow Triton's python_backend README: Tensor, InferenceRequest (received by
`execute`, or built by the model to call another model: BLS), InferenceResponse, TritonError,
TritonModelException, the response sender of decoupled models, the model loading calls (load_model,
unload_model, is_model_ready: the server's repository API), Logger, the config helpers and the flag
constants. What Triton spreads over shared memory and a stub process runs here in the server's process:
tensors are numpy arrays, always on the CPU (`is_cpu()` is True; `to_dlpack`/`from_dlpack` exchange
them with torch or CuPy), and a BLS call goes through the called model's own scheduler and batcher
without serializing anything: the server the calls go to is the host the python backend loaded the
model for (`attach_host`, at load; one per process, as Triton's stub serves one server). In a model's
own process (`EXECUTION_MODE process`), BLS calls go to the server through the `Caller` the process
attaches (server/backends/stub.py).
"""

import asyncio
import json
import logging
import struct
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tensorgate.codec.datatypes import BY_CONFIG, BY_NUMPY, BY_V2
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferRequest as _Request
from tensorgate.codec.tensor import RequestedOutput as _RequestedOutput
from tensorgate.codec.tensor import Tensor as _WireTensor
from tensorgate.codec.tensor import custom_parameters
from tensorgate.server.backends.custom_metrics import Metric, MetricFamily  # noqa: F401 (Triton's API)

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Host

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2

# TRITONSERVER_DataType numbers, as Tensor.triton_dtype() answers them
_TRITON_TYPE_NUMBERS = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8,
    "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip
_V2_OF_NUMBER = {number: v2 for v2, number in _TRITON_TYPE_NUMBERS.items()}

log = logging.getLogger("tensorgate.model")

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


class TritonError:
    """An error a model answers for one request (`InferenceResponse(error=...)`), with Triton's codes."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


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


class TritonModelException(Exception):
    """Raised to a model by a failed call of ours (a BLS call's transport, a wrong argument)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


# ------------------------------------------------------------------------------------------- tensors


class Tensor:
    """A named tensor: a numpy array (BYTES: an object array of bytes)."""

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.kind == "U" or array.dtype.kind == "V":
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by the python backend: "
                "use np.object_ (of bytes) instead"
            )
        if triton_dtype is not None:
            v2 = _V2_OF_NUMBER.get(triton_dtype)
            if v2 is None:
                raise TritonModelException(f"unknown triton_dtype {triton_dtype}")
        else:
            found = BY_NUMPY.get(array.dtype) or BY_NUMPY.get(np.dtype(array.dtype.kind))
            if found is None:
                raise TritonModelException(f"numpy dtype {array.dtype} has no Triton datatype")
            v2 = found.v2
        self._name = name
        self._array = array
        self._v2 = v2

    @staticmethod
    def _of(name: str, array: np.ndarray, v2: str) -> "Tensor":
        tensor = Tensor.__new__(Tensor)
        tensor._name, tensor._array, tensor._v2 = name, array, v2
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return _TRITON_TYPE_NUMBERS[self._v2]

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the array (torch.from_dlpack / cupy.from_dlpack take it)."""
        if self._array.dtype == object:
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors have no DLPack form")
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> "Tensor":
        """A tensor from a DLPack capsule or an object with `__dlpack__` (a torch tensor, a CuPy array);
        device memory is copied to the host."""
        if hasattr(capsule, "__dlpack__"):
            if hasattr(capsule, "detach"):  # torch: no autograd, on the host
                return Tensor(name, capsule.detach().cpu().numpy())
            if hasattr(capsule, "get") and not isinstance(capsule, np.ndarray):  # CuPy
                return Tensor(name, capsule.get())
            return Tensor(name, np.from_dlpack(capsule))
        try:
            import torch.utils.dlpack
        except ImportError:
            raise TritonModelException("from_dlpack of a raw capsule needs torch installed") from None
        return Tensor(name, torch.utils.dlpack.from_dlpack(capsule).cpu().numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._v2}, shape={list(self._array.shape)})"


# ----------------------------------------------------------------------------------------- responses


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list')
        self._outputs = output_tensors
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """How a decoupled model answers a request: any number of responses, from any thread, then FINAL."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, int], None]) -> None:
        self._deliver = deliver
        self._closed = False
        self._cancelled = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("the response sender is closed: FINAL was sent already")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() takes an InferenceResponse")
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        self._deliver(response, flags)

    def is_cancelled(self) -> bool:
        return self._cancelled


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


# ------------------------------------------------------------------------------------------ helpers


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((entry for entry in model_config.get("input", ()) if entry["name"] == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((entry for entry in model_config.get("output", ()) if entry["name"] == name), None)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """TYPE_FP32 -> np.float32 (TYPE_STRING -> np.object_)."""
    dtype = BY_CONFIG[triton_type_string].numpy
    return np.object_ if dtype.kind == "O" else dtype.type


def triton_to_numpy_type(data_type: int) -> Any:
    return triton_string_to_numpy(BY_V2[_V2_OF_NUMBER[data_type]].config)


def numpy_to_triton_type(data_type: Any) -> int | None:
    found = BY_NUMPY.get(np.dtype(data_type))
    return None if found is None else _TRITON_TYPE_NUMBERS[found.v2]


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """BYTES elements as Triton lays them out: each a 4-byte little-endian length and its bytes."""
    if input_tensor.size == 0:
        return None
    chunks = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        chunks.append(struct.pack("<I", len(data)) + data)
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items, offset = [], 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


class LogLevel:
    INFO, WARNING, ERROR, VERBOSE = range(4)


_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
           LogLevel.VERBOSE: logging.DEBUG}  # fmt: skip


class Logger:
    """Triton's model logger: messages go to the server's log (logger `tensorgate.model`)."""

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        log.log(_LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug("%s", message)


class ModelConfig:
    """What `auto_complete_config(auto_complete_model_config)` receives: the config to complete."""

    def __init__(self, config: dict) -> None:
        self._config = config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._config.get("max_batch_size", 0)
        if current and current != max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but auto-complete wants {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy: dict) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy)

    def add_input(self, input: dict) -> None:  # noqa: A002 (Triton's argument name)
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)

    def _add(self, kind: str, entry: dict) -> None:
        if not isinstance(entry, dict) or "name" not in entry:
            raise ValueError(f"add_{kind} takes a dict with at least 'name'")
        tensors = self._config.setdefault(kind, [])
        for existing in tensors:
            if existing["name"] != entry["name"]:
                continue
            for key, value in entry.items():  # the config given wins; a disagreement is an error
                if key in existing and existing[key] != value:
                    raise ValueError(
                        f"{kind} '{entry['name']}': the configuration has {key} {existing[key]!r}, "
                        f"auto-complete wants {value!r}"
                    )
                existing.setdefault(key, value)
            return
        tensors.append(dict(entry))


def _runs_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs `loop` (a blocking wait for it here would never end)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
