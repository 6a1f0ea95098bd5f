"""Triton's sequence extension on the request side: the parameters `sequence_id`, `sequence_start` and
`sequence_end` read into an InferRequest's `sequence_id` and `sequence_flags`.

`sequence_id` is a uint64 or a string; 0 and "" mean "not part of a sequence". The flags are Triton's
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) and _END (2). As Triton's HTTP and gRPC front ends do, the
three parameters are taken out of the request's other parameters (a model's `request.parameters()` does
not hold them), and a value of the wrong type is refused with each protocol's own text. Whether the model
takes sequences at all is the engine's business (batcher/sequence.py): a model without
`sequence_batching` ignores them, as Triton's does, and its python models still read them.
"""

from collections.abc import Callable
from typing import Any

from tensorgate.codec.errors import invalid

START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
KEYS = ("sequence_id", "sequence_start", "sequence_end")
UINT64 = (1 << 64) - 1


def from_json(parameters: dict[str, Any]) -> tuple[int | str, int]:
    """The sequence id and flags of a REST request's parameters (taken out of them), as Triton's HTTP
    front end reads them: an unsigned integer or a string id, boolean flags."""
    if parameters.keys().isdisjoint(KEYS):
        return 0, 0
    sequence_id = parameters.pop("sequence_id", 0)
    if type(sequence_id) is int:
        if not 0 <= sequence_id <= UINT64:
            raise invalid(f"Unable to parse 'sequence_id': {sequence_id} is not a uint64")
    elif type(sequence_id) is not str:
        raise invalid(f"Unable to parse 'sequence_id': expected a uint64 or a string, got {sequence_id!r}")
    return sequence_id, _flags(
        parameters, lambda key, value: f"Unable to parse '{key}': expected a boolean, got {value!r}"
    )


def from_grpc(parameters: dict[str, Any]) -> tuple[int | str, int]:
    """The sequence id and flags of a ModelInferRequest's parameters (taken out of them), as Triton's gRPC
    front end reads them: an int64_param (its bits as a uint64) or a string_param id, bool_param flags."""
    if parameters.keys().isdisjoint(KEYS):
        return 0, 0
    sequence_id = parameters.pop("sequence_id", 0)
    if type(sequence_id) is int:
        sequence_id &= UINT64  # an int64_param holds the uint64's bits, as Triton casts it
    elif type(sequence_id) is not str:
        raise invalid("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
    return sequence_id, _flags(
        parameters, lambda key, _: f"invalid value type for '{key}' parameter, expected bool_param."
    )


def _flags(parameters: dict[str, Any], not_bool: Callable[[str, Any], str]) -> int:
    """START and END from the boolean parameters (taken out); `not_bool(key, value)`: the error's text."""
    flags = 0
    for key, flag in (("sequence_start", START), ("sequence_end", END)):
        value = parameters.pop(key, False)
        if type(value) is not bool:
            raise invalid(not_bool(key, value))
        if value:
            flags |= flag
    return flags
