"""Array helpers the stagings share: the config's datatypes, parts cast to them, torch <-> numpy."""

from typing import Any

import numpy as np

from tensorgate.codec.datatypes import BY_CONFIG, DataType
from tensorgate.codec.errors import ErrorKind, InferError


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("torch is not installed (pip install 'tensorgate[torch]')") from None
    return torch


def config_types(config: dict, key: str) -> dict[str, DataType]:
    """Name -> datatype of the config's inputs or outputs, BYTES left out (they stay numpy objects)."""
    types = {e["name"]: BY_CONFIG[e["data_type"]] for e in config.get(key, [])}
    return {name: t for name, t in types.items() if t.v2 != "BYTES"}


def concatenate(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def in_config_dtype(name: str, parts: list[np.ndarray], datatype: DataType | None) -> list[np.ndarray]:
    """The parts as the config types the input (BF16: its uint16 bit patterns): a part of another kind
    of the same family (INT64 for INT32, FP64 for FP32) is cast; another family is an error naming the
    input, not a shape error from deep in torch."""
    if datatype is None or all(p.dtype == datatype.numpy for p in parts):
        return parts
    cast = []
    for part in parts:
        if part.dtype != datatype.numpy and not np.can_cast(part.dtype, datatype.numpy, casting="same_kind"):
            raise InferError(
                ErrorKind.INVALID_ARGUMENT,
                f"input '{name}' holds {part.dtype} data where the model expects {datatype.v2}",
            )
        cast.append(part.astype(datatype.numpy, copy=False))
    return cast


def cast_tensor(tensor: Any, want: Any) -> Any:
    """A torch tensor in dtype `want` (None: as it is)."""
    return tensor if want is None or tensor.dtype is want else tensor.to(want)


def tensor_to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    """A host tensor as a numpy view of its memory; bfloat16 as uint16 bit patterns (numpy has none)."""
    if tensor.dtype is torch.bfloat16:
        tensor = tensor.view(torch.uint16)
    return tensor.numpy()
