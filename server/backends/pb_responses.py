"""Triton's responses for python models (part of `pb_utils`, server/backends/pb_utils.py): the
InferenceResponse a model answers with (or a BLS call answers it with), and the sender a decoupled model
answers through.
"""

import json
from collections.abc import Callable

from tensorgate.server.backends.pb_errors import TritonError, TritonModelException
from tensorgate.server.backends.pb_tensors import Tensor

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


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


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None
