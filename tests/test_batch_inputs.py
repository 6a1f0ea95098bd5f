"""Ragged batching's batch inputs (batcher/execution.py `batch_input`, `collect`), with the values
model_config.proto's BatchInput.Kind documents."""

import numpy as np
import pytest

from tensorgate.batcher.execution import batch_input, collect
from tensorgate.batcher.scheduler import Job


def entry(kind: str, data_type: str = "TYPE_INT32") -> dict:
    return {"kind": kind, "target_name": ["T"], "data_type": data_type, "source_input": ["X"]}


# the proto's example: a batch-2 request of shape [3, 1] and a batch-1 request of shape [2, 2]
SOURCES = [np.zeros((2, 3, 1), np.float32), np.zeros((1, 2, 2), np.float32)]


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("BATCH_ELEMENT_COUNT", [6, 4]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [6, 10]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 6, 10]),
        ("BATCH_ITEM_SHAPE", [[3, 1], [3, 1], [2, 2]]),
        ("BATCH_ITEM_SHAPE_FLATTEN", [3, 1, 3, 1, 2, 2]),
    ],
)
def test_batch_input_values(kind: str, expected: list) -> None:
    value = batch_input(entry(kind), SOURCES)
    assert value.dtype == np.int32
    assert value.tolist() == expected


def test_max_element_count_is_a_shape_and_fp32_is_float() -> None:
    assert batch_input(entry("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"), SOURCES).shape == (6,)
    assert batch_input(entry("BATCH_ELEMENT_COUNT", "TYPE_FP32"), SOURCES).dtype == np.float32


def test_collect_flattens_ragged_inputs_and_adds_targets() -> None:
    jobs = [
        Job({"X": np.arange(3).reshape(1, 3), "Y": np.ones((1, 2))}),
        Job({"X": np.arange(4).reshape(1, 4), "Y": np.zeros((1, 2))}),
    ]
    parts = dict(collect(jobs, frozenset({"X"}), (entry("BATCH_ACCUMULATED_ELEMENT_COUNT"),)))
    assert [p.shape for p in parts["X"]] == [(3,), (4,)]
    assert [p.shape for p in parts["Y"]] == [(1, 2), (1, 2)]
    assert [p.tolist() for p in parts["T"]] == [[3, 7]]
