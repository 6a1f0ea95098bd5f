"""grps payloads -> a model's inputs, and model selection. Sans-IO.

Requests (Payload -> InferRequest), by the member of data_oneof the client used:
- gtensors: each tensor is the input of its name; an unnamed tensor is the input at its position.
- ndarray: the model's only floating-point input (FP32, or FP16 / FP64 / BF16).
- str_data / bin_data: the model's only BYTES input, as one element.
- gmap: each value is the input of its key, as one element.
One element is shaped as the input wants it, with every dimension 1 ([1], or [1, 1] with batching).
Values are converted to the input's datatype when none changes: integers to any integer type that holds
them (BOOL from 0 and 1) or to floating point, floating point to any floating-point width whose range
holds them (rounded to its precision). grps has no BOOL, unsigned types past UINT8 nor BF16: their
inputs take the grps dtype that carries them.

"""

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from tensorgate.codec.datatypes import BY_V2, DataType, bf16_bits
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.grps import FLOATS, GMAP, GTENSORS, NDARRAY, Payload
from tensorgate.codec.tensor import InferRequest, Tensor, narrowed


class InputSpec(Protocol):
    """What the mapping needs to know of a model input (server.model.TensorSpec is one)."""

    name: str
    dtype: DataType
    shape: tuple[int, ...]  # as a client sees it: -1 for the batch dimension and variable dims


# ------------------------------------------------------------------------------------- model selection


def split_model(spec: str, known: Callable[[str], bool]) -> tuple[str, str]:
    """`name` or `name-version` -> (name, version; "" for the newest ready). A name that itself holds
    a '-' is found whole first."""
    if known(spec):
        return spec, ""
    name, _, version = spec.rpartition("-")
    if name and version and known(name):
        return name, version
    raise InferError(ErrorKind.NOT_FOUND, f"unknown model '{spec}' (select a model as name or name-version)")


# ------------------------------------------------------------------------------------------- requests


def to_infer_request(
    payload: Payload, model_name: str, model_version: str, inputs: Mapping[str, InputSpec]
) -> InferRequest:
    """`inputs`: the model's inputs by name, in their order."""
    tensors = payload.tensors
    if payload.kind in (GTENSORS, GMAP):
        fitted = []
        for index, tensor in enumerate(tensors):
            if not tensor.name:  # unnamed gtensors fill the inputs in order
                if index >= len(inputs):
                    raise invalid(
                        f"model '{model_name}' has {len(inputs)} input(s): gtensor {index} needs a name"
                    )
                spec: InputSpec | None = list(inputs.values())[index]
            else:
                spec = inputs.get(tensor.name)
            if spec is None:  # left for the model to refuse: it names the inputs it has
                fitted.append(
                    tensor
                    if tensor.shape
                    else Tensor(tensor.name, tensor.datatype, (1,), tensor.data.reshape(1))
                )
            else:
                fitted.append(_fit(tensor, spec, model_name, scalar=payload.kind == GMAP))
    elif payload.kind == NDARRAY:
        spec = _only_input(inputs, FLOATS, "floating-point", NDARRAY, model_name)
        fitted = [_fit(tensors[0], spec, model_name, scalar=False)]
    else:
        spec = _only_input(inputs, ("BYTES",), "BYTES", payload.kind, model_name)
        fitted = [_fit(tensors[0], spec, model_name, scalar=True)]
    return InferRequest(model_name, model_version, inputs=fitted)


def _only_input(
    inputs: Mapping[str, InputSpec], types: tuple, label: str, kind: str, model: str
) -> InputSpec:
    found = [spec for spec in inputs.values() if spec.dtype.v2 in types]
    if len(found) != 1:
        described = ", ".join(f"{s.name} ({s.dtype.v2})" for s in inputs.values()) or "none"
        raise invalid(
            f"{kind} fills a model's only {label} input; model '{model}' has "
            f"{len(found)} of them (inputs: {described}): send gtensors or gmap instead"
        )
    return found[0]


def _fit(tensor: Tensor, spec: InputSpec, model: str, scalar: bool) -> Tensor:
    """The tensor as the input `spec`: its name, its datatype, and (for one element) its shape."""
    what = f"model '{model}', input '{spec.name}'"
    data = tensor.data
    source, target = BY_V2[tensor.datatype], spec.dtype
    if source is not target:
        data = _convert(data, source, target, what)
    shape = tuple(1 for _ in spec.shape) if scalar else tensor.shape
    return Tensor(spec.name, target.v2, shape, data.reshape(shape))


def _convert(data: np.ndarray, source: DataType, target: DataType, what: str) -> np.ndarray:
    if "BYTES" in (source.v2, target.v2):
        raise invalid(f"{what} is {target.v2}: {source.grps} values cannot fill it")
    if target.v2 in FLOATS:
        wide = data.astype(np.float64)
        if target.v2 == "FP64":
            return wide
        narrow = narrowed(wide, np.dtype(np.float16 if target.v2 == "FP16" else np.float32))
        if narrow is None:
            raise invalid(f"{what} is {target.v2}: the values are outside its range")
        return bf16_bits(narrow) if target.v2 == "BF16" else narrow
    if source.numpy.kind == "f":
        raise invalid(f"{what} is {target.v2}: floating-point values ({source.grps}) cannot fill it")
    low, high = (0, 1) if target.v2 == "BOOL" else (np.iinfo(target.numpy).min, np.iinfo(target.numpy).max)
    if data.size and (int(data.min()) < low or int(data.max()) > high):
        raise invalid(f"{what} is {target.v2}: the values are outside its range")
    return data.astype(target.numpy)
