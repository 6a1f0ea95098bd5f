"""server/response_cache.py alone: the key, the LRU bounded in bytes, the flag forms, which models use it;
and server/classification.py's ordering and shapes."""

import numpy as np
import pytest

from tensorgate.codec.errors import InferError
from tensorgate.codec.tensor import Tensor
from tensorgate.server.classification import classify
from tensorgate.server.response_cache import (
    ENTRY_OVERHEAD,
    CacheConfigError,
    ResponseCache,
    cache_for,
    parse_cache_config,
)

X = np.arange(4, dtype=np.int32).reshape(1, 4)


def key(
    cache: ResponseCache, arrays: dict, parameters: dict | None = None, model: str = "m", version: str = "1"
):
    return cache.key(model, version, arrays, parameters or {})


def test_the_key_is_the_model_version_inputs_and_parameters() -> None:
    cache = ResponseCache(1 << 20)
    base = key(cache, {"X": X})
    assert base == key(cache, {"X": X.copy()})  # the same bytes, another array
    others = [
        key(cache, {"X": X}, model="other"),
        key(cache, {"X": X}, version="2"),
        key(cache, {"X": X + 1}),
        key(cache, {"X": X.reshape(2, 2)}),
        key(cache, {"X": X.astype(np.int64)}),
        key(cache, {"Y": X}),
        key(cache, {"X": X}, {"scale": 2}),
        key(cache, {"X": X}, {"scale": "2"}),
    ]
    assert len({base, *others}) == len(others) + 1
    strings = np.array([[b"a", b"bc"]], dtype=object)
    assert key(cache, {"S": strings}) != key(cache, {"S": np.array([[b"ab", b"c"]], dtype=object)})
    assert key(cache, {"X": X[:, ::2]}) == key(cache, {"X": np.ascontiguousarray(X[:, ::2])})
    assert key(cache, {"X": [1, 2]}) is None  # not a host array: not cached


def entry(n: int) -> dict:
    return {"Y": np.full(16, n, np.int32)}  # 64 bytes


def test_a_bounded_lru_keeps_what_was_used_last() -> None:
    size = ENTRY_OVERHEAD + 64
    cache = ResponseCache(2 * size)
    cache.put(b"a", entry(1))
    cache.put(b"b", entry(2))
    assert cache.get(b"a")["Y"][0] == 1  # a is now the most recently used
    cache.put(b"c", entry(3))  # room for two: b goes
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    assert (len(cache), cache.used, cache.evictions) == (2, 2 * size, 1)
    cache.put(b"huge", {"Y": np.zeros(10_000, np.int32)})  # larger than the whole cache: not kept
    assert cache.get(b"huge") is None and len(cache) == 2


def test_entries_are_read_only_copies() -> None:
    cache = ResponseCache(1 << 20)
    produced = np.arange(8, dtype=np.float32)
    cache.put(b"k", {"Y": produced[2:6]})
    produced[:] = -1  # the batch buffer reused
    kept = cache.get(b"k")["Y"]
    assert kept.tolist() == [2, 3, 4, 5] and not kept.flags.writeable


@pytest.mark.parametrize(
    ("entries", "byte_size", "size"),
    [
        ([], None, 0),
        (["local,size=1048576"], None, 1048576),
        ([], 4096, 4096),
        (["local,size=2048"], 4096, 2048),
    ],
)
def test_tritons_flag_forms(entries: list[str], byte_size: int | None, size: int) -> None:
    assert parse_cache_config(entries, byte_size) == size


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["redis,host=localhost"], "only the 'local' cache is implemented"),
        (["local,size=big"], "expected local,size=BYTES"),
        (["local"], "expected local,size=BYTES"),
        (["local,size=10"], "at least 1024 bytes"),
    ],
)
def test_a_cache_config_this_server_cannot_use_is_refused(entries: list[str], message: str) -> None:
    with pytest.raises(CacheConfigError, match=message):
        parse_cache_config(entries)


def test_only_models_that_enable_it_use_the_cache_and_never_decoupled_or_sequence_ones() -> None:
    cache = ResponseCache(1 << 20)
    enabled = {"name": "m", "response_cache": {"enable": True}}
    assert cache_for(enabled, cache) is cache
    assert cache_for(enabled, None) is None  # the server runs without one
    assert cache_for({"name": "m"}, cache) is None
    with pytest.raises(
        ValueError, match="Response Cache does not currently support model m with 'decoupled'"
    ):
        cache_for({**enabled, "model_transaction_policy": {"decoupled": True}}, cache)
    with pytest.raises(ValueError, match="with sequence batching scheduler"):
        cache_for({**enabled, "sequence_batching": {}}, cache)


# ------------------------------------------------------------------------------- classification


def test_classes_are_highest_first_ties_in_index_order_with_labels_where_there_are() -> None:
    scores = Tensor("o", "FP32", (2, 4), np.array([[1.1, 3.3, 0.5, 2.4], [5, 7, 5, 1]], np.float32))
    got = classify(scores, 3, ["zero", "one", "", "three", "four"], batched=True)
    assert (got.datatype, got.shape) == ("BYTES", (2, 3))
    assert got.data.tolist() == [
        [b"3.300000:1:one", b"2.400000:3:three", b"1.100000:0:zero"],
        [b"7.000000:1:one", b"5.000000:0:zero", b"5.000000:2"],  # an empty label is no label
    ]
    ints = classify(Tensor("o", "UINT32", (4,), np.array([1, 5, 10, 4], np.uint32)), 9, None, batched=False)
    assert ints.shape == (4,) and ints.data.tolist() == [b"10:2", b"5:1", b"4:3", b"1:0"]


def test_a_tensor_without_an_order_cannot_be_classified() -> None:
    with pytest.raises(InferError, match="unsupported type 'BYTES'"):
        classify(Tensor("o", "BYTES", (1,), np.array([b"x"], dtype=object)), 1, None, batched=False)
    with pytest.raises(InferError, match="unsupported type 'BOOL'"):
        classify(Tensor("o", "BOOL", (2,), np.array([True, False])), 1, None, batched=False)
