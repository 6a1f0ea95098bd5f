"""The one datatype table: KServe v2 name <-> model config TYPE_* <-> numpy <-> torch <-> TF Serving <-> grps
<-> ONNX Runtime.

Nothing else in the project spells a dtype mapping. BF16 has no numpy dtype: its elements travel as
uint16 bit patterns (a torch backend views them as torch.bfloat16). BYTES travel as numpy object arrays
of `bytes`.

grps has fewer dtypes: the grps column names the one that carries each type (exactly, or widened: BOOL
as DT_UINT8 0/1, UINT16 as DT_INT32, UINT32 and UINT64 as DT_INT64, BF16 as DT_FLOAT32). BY_GRPS maps
each grps dtype back to the type it names exactly.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DataType:
    v2: str  # KServe v2 / Triton wire name
    config: str  # model_config.proto DataType name
    numpy: np.dtype  # host representation (little-endian)
    torch: str  # torch dtype attribute name
    tf: str  # TensorFlow DataType name (TF Serving)
    size: int  # bytes per element; 0 for variable-size BYTES
    grps: str  # the grps (NetEase-Media/grps) DataType that carries it
    onnx: str  # ONNX Runtime's type string of a tensor of it (NodeArg.type)
    tf_number: int  # the TensorFlow DataType's number (tensorflow/core/framework/types.proto)


def _t(
    v2: str, config: str, numpy: str, torch: str, tf: str, size: int, grps: str, onnx: str, tf_number: int
) -> DataType:
    return DataType(v2, config, np.dtype(numpy), torch, tf, size, grps, f"tensor({onnx})", tf_number)


TABLE: tuple[DataType, ...] = (
    _t("BOOL", "TYPE_BOOL", "bool", "bool", "DT_BOOL", 1, "DT_UINT8", "bool", 10),
    _t("UINT8", "TYPE_UINT8", "<u1", "uint8", "DT_UINT8", 1, "DT_UINT8", "uint8", 4),
    _t("UINT16", "TYPE_UINT16", "<u2", "uint16", "DT_UINT16", 2, "DT_INT32", "uint16", 17),
    _t("UINT32", "TYPE_UINT32", "<u4", "uint32", "DT_UINT32", 4, "DT_INT64", "uint32", 22),
    _t("UINT64", "TYPE_UINT64", "<u8", "uint64", "DT_UINT64", 8, "DT_INT64", "uint64", 23),
    _t("INT8", "TYPE_INT8", "<i1", "int8", "DT_INT8", 1, "DT_INT8", "int8", 6),
    _t("INT16", "TYPE_INT16", "<i2", "int16", "DT_INT16", 2, "DT_INT16", "int16", 5),
    _t("INT32", "TYPE_INT32", "<i4", "int32", "DT_INT32", 4, "DT_INT32", "int32", 3),
    _t("INT64", "TYPE_INT64", "<i8", "int64", "DT_INT64", 8, "DT_INT64", "int64", 9),
    _t("FP16", "TYPE_FP16", "<f2", "float16", "DT_HALF", 2, "DT_FLOAT16", "float16", 19),
    _t("FP32", "TYPE_FP32", "<f4", "float32", "DT_FLOAT", 4, "DT_FLOAT32", "float", 1),
    _t("FP64", "TYPE_FP64", "<f8", "float64", "DT_DOUBLE", 8, "DT_FLOAT64", "double", 2),
    _t("BF16", "TYPE_BF16", "<u2", "bfloat16", "DT_BFLOAT16", 2, "DT_FLOAT32", "bfloat16", 14),
    _t("BYTES", "TYPE_STRING", "O", "uint8", "DT_STRING", 0, "DT_STRING", "string", 7),
)

BY_V2: dict[str, DataType] = {t.v2: t for t in TABLE}
BY_CONFIG: dict[str, DataType] = {t.config: t for t in TABLE}
# grps dtype -> the type it stands for exactly (the others only travel widened in it)
BY_GRPS: dict[str, DataType] = {
    t.grps: t for t in TABLE if t.v2 not in ("BOOL", "UINT16", "UINT32", "UINT64", "BF16")
}
# numpy -> v2 for arrays a model returns; BF16 is never inferred from uint16.
BY_NUMPY: dict[np.dtype, DataType] = {t.numpy: t for t in TABLE if t.v2 != "BF16"}
BY_ONNX: dict[str, DataType] = {t.onnx: t for t in TABLE}
BY_TF_NUMBER: dict[int, DataType] = {t.tf_number: t for t in TABLE}
BY_NUMPY[np.dtype("S")] = BY_V2["BYTES"]
BY_NUMPY[np.dtype("U")] = BY_V2["BYTES"]


def bf16_bits(floats: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    bits = floats.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(floats), np.uint16(0x7FC0), rounded)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
