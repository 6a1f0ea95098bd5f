"""Triton's response cache (its `local` cache): one LRU of model outputs, bounded in bytes and shared by
every model whose config says `response_cache { enable: true }`, when the server runs with
`--cache-config local,size=BYTES` (or Triton's older `--response-cache-byte-size BYTES`).

- The key is a 128-bit BLAKE2b hash of the model name and version, each input (name, datatype, shape
  and bytes, in name order) and the request's custom parameters (those the model is given; `priority`,
  `timeout` and the other reserved ones change no answer). Triton's key is a 64-bit hash of the model
  and inputs alone; its models never see custom parameters that could change an answer.
- An entry holds every output of the model's config, copied out of the batch (read-only numpy arrays):
  a hit is answered from it without the scheduler, the batcher or the model, and the selection of
  outputs, classification and shared memory apply to it as to a computed answer. Only answers holding
  every output, on the host, are kept; inputs not on the host (a CUDA shared-memory region staged on a
  GPU) are not looked up, as in Triton.
- An entry larger than the whole cache is not kept; otherwise the least recently used entries make room.
- The model version counts hits and misses with their times (statistics `cache_hit` / `cache_miss`,
  metrics `nv_cache_*_per_model`); its cache is never used for decoupled or sequence models, whose load
  fails with Triton's text when their config asks for it.

Engine side: used by the model version (server/model.py) on the event loop, so it needs no lock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

from tensorgate.codec.bytes_tensor import encode_bytes

ENTRY_OVERHEAD = 256  # bytes counted for an entry beside its arrays: its key, dict slots, array headers
MIN_SIZE = 1024  # Triton's local cache fails to start below about this; so does ours, with a message


class CacheConfigError(ValueError):
    """A `--cache-config` this server cannot use; the message says why."""


def parse_cache_config(entries: list[str], byte_size: int | None = None) -> int:
    """The cache's size in bytes from `--cache-config` values (`local,size=BYTES`, repeatable, Triton's
    form) and `--response-cache-byte-size` (Triton's older flag); 0 when neither asks for a cache."""
    size = byte_size or 0
    for entry in entries:
        name, _, setting = entry.partition(",")
        if name != "local":
            raise CacheConfigError(f"--cache-config {entry!r}: only the 'local' cache is implemented")
        key, _, value = setting.partition("=")
        if key != "size" or not value.isdigit():
            raise CacheConfigError(f"--cache-config {entry!r}: expected local,size=BYTES")
        size = int(value)
    if 0 < size < MIN_SIZE:
        raise CacheConfigError(f"the response cache needs at least {MIN_SIZE} bytes, got {size}")
    return size


def cache_for(config: dict, cache: ResponseCache | None) -> ResponseCache | None:
    """The cache a model version uses: the server's when its config enables `response_cache`, else none.
    Decoupled and sequence models may not enable it (ValueError, with Triton's text)."""
    section = config.get("response_cache") or {}
    if not (isinstance(section, dict) and section.get("enable")):
        return None
    name = config["name"]
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        raise ValueError(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )
    if config.get("sequence_batching") is not None:
        raise ValueError(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    return cache


class ResponseCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # bytes
        self.used = 0  # bytes the entries take, as counted by `_size`
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def key(
        self, model: str, version: str, arrays: dict[str, Any], parameters: dict[str, Any]
    ) -> bytes | None:
        """The request's key, or None when an input is not a host array (it is then not cached)."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{model}\0{version}\0".encode())
        for name in sorted(arrays):
            array = arrays[name]
            if not isinstance(array, np.ndarray):
                return None
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            if array.dtype == object:
                digest.update(encode_bytes(array))
            else:
                digest.update(np.ascontiguousarray(array).view(np.uint8))
        if parameters:
            digest.update(repr(sorted(parameters.items())).encode())
        return digest.digest()

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The outputs kept for `key` (read-only arrays), now the most recently used; None on a miss."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, outputs: dict[str, np.ndarray]) -> None:
        """Keeps a copy of `outputs` under `key`, evicting the least recently used entries for room."""
        size = ENTRY_OVERHEAD + sum(_size(array) for array in outputs.values())
        if size > self.capacity or key in self._entries:
            return
        while self.used + size > self.capacity:
            _, (_, freed) = self._entries.popitem(last=False)
            self.used -= freed
            self.evictions += 1
        kept = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            kept[name] = copy
        self._entries[key] = (kept, size)
        self.used += size


def _size(array: np.ndarray) -> int:
    if array.dtype == object:  # BYTES: the elements' own bytes, beside the array of references
        return array.nbytes + sum(len(e) if isinstance(e, bytes | str) else 64 for e in array.reshape(-1))
    return array.nbytes
