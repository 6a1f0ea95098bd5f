"""The internal currency: Tensor, InferRequest, InferResponse. Protocol details stop at codec/."""

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Tensor:
    """A named tensor. `data` is a numpy array shaped `shape` (BYTES: an object array of bytes).

    Numeric data may be a zero-copy (read-only) view over the request body.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: follow the request's default
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" = the policy's default version
    id: str | None = None
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None  # None: every output
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_output: bool = False  # the binary_data_output request parameter


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
