"""Model warmup (model_config.proto's `model_warmup`): samples run through the model at load, before the
version is ready, so its first real requests do not pay for lazy initialisation (CUDA contexts, kernel
compiles, allocator growth). As Triton runs them (core src/backend_model_instance.cc):

    model_warmup [ {
      name: "sample"  batch_size: 4  count: 2
      inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    } ]

- Each sample is `batch_size` requests of one row (dims as given, the batch dim added for a batching
  model), executed together as one batch (a model without batching executes them one by one), `count`
  times (0 counts as once). A sample of batch_size 0 is skipped.
- Input data: `zero_data` (zeros; empty strings for BYTES), `random_data` (random bytes of the datatype;
  empty strings for BYTES, as Triton), or `input_data_file`, a file in the model's `warmup/` folder: its
  first bytes for a numeric input (it must hold enough), Triton's serialized form for BYTES (each
  element a 4-byte length, then its bytes).
- A sample that does not fit the model (an input it lacks, another datatype, dims it refuses, a missing
  input, a batch over max_batch_size, a file it cannot read) or whose execution fails fails the load,
  with a message naming the sample: "failed to run warmup sample 'sample': ...".
- Ensembles take no warmup (Triton's text refuses it); their steps' models warm up themselves.
- A model that only streams its answers (decoupled, or `execute_stream` alone) runs each request of a
  sample through its stream, read to its end.

Engine side: run by the model version (server/model.py) through its executor, the batcher's own path to
the backend; warmup runs are not counted in the statistics.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorgate.batcher.execution import Executor
from tensorgate.batcher.scheduler import Job
from tensorgate.codec.bytes_tensor import decode_bytes
from tensorgate.codec.datatypes import BY_CONFIG, DataType
from tensorgate.codec.errors import InferError
from tensorgate.codec.tensor import InferRequest, Tensor

if TYPE_CHECKING:
    from tensorgate.server.model import TensorSpec

WARMUP_FOLDER = "warmup"
_SOURCES = ("zero_data", "random_data", "input_data_file")


class WarmupError(ValueError):
    """A warmup sample that does not fit its model, or that failed; the message names the sample."""


class Sample:
    """One `model_warmup` entry, checked against the model: its requests, ready to run."""

    def __init__(self, name: str, count: int, requests: list[InferRequest]) -> None:
        self.name = name
        self.count = count
        self.requests = requests


def samples(config: dict, model_dir: Path, specs: dict[str, TensorSpec]) -> list[Sample]:
    """The config's warmup samples with their data made; raises WarmupError naming a sample that does
    not fit the model (`specs`: its inputs)."""
    entries = config.get("model_warmup") or []
    if entries and config.get("platform") == "ensemble":
        raise WarmupError(f"model_warmup can not be specified for ensemble '{config['name']}'")
    max_batch_size = config.get("max_batch_size", 0)
    out = []
    rng = np.random.default_rng()
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        name = name if isinstance(name, str) and name else f"#{i}"
        failed = f"failed to run warmup sample '{name}'"
        if not isinstance(entry, dict):
            raise WarmupError(f"{failed}: model_warmup entries must be messages")
        batch_size, count = entry.get("batch_size", 0), entry.get("count", 0)
        for field, value in (("batch_size", batch_size), ("count", count)):
            if type(value) is not int or value < 0:
                raise WarmupError(f"{failed}: {field} must be an unsigned integer, got {value!r}")
        if batch_size == 0:
            continue  # as Triton: a sample of no requests is skipped
        if max_batch_size and batch_size > max_batch_size:
            raise WarmupError(f"{failed}: batch_size {batch_size} is over max_batch_size {max_batch_size}")
        inputs = entry.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise WarmupError(f"{failed}: inputs must map input names to their data")
        missing = [n for n, s in specs.items() if not s.optional and n not in inputs]
        if missing:
            raise WarmupError(f"{failed}: no data for input(s) {', '.join(repr(n) for n in missing)}")
        tensors = [_tensor(failed, n, v, specs.get(n), model_dir, rng) for n, v in inputs.items()]
        requests = [
            InferRequest(config["name"], inputs=tensors, id=f"warmup:{name}") for _ in range(batch_size)
        ]
        out.append(Sample(name, max(count, 1), requests))
    return out


def _tensor(
    failed: str, name: str, entry: Any, spec: TensorSpec | None, model_dir: Path, rng: np.random.Generator
) -> Tensor:
    """One request's input: one row of the sample's data (the batch dim added for a batching model)."""
    if spec is None:
        raise WarmupError(f"{failed}: the model has no input '{name}'")
    if not isinstance(entry, dict):
        raise WarmupError(f"{failed}: input '{name}' must be a message")
    dtype = BY_CONFIG.get(entry.get("data_type", ""))
    if dtype is not spec.dtype:
        given = entry.get("data_type")
        raise WarmupError(f"{failed}: input '{name}' is {given} where the model expects {spec.dtype.config}")
    dims = entry.get("dims", [])
    if not isinstance(dims, list) or not all(type(d) is int and d >= 0 for d in dims):
        raise WarmupError(
            f"{failed}: warmup setting expects all variable-size dimensions are specified for input '{name}'"
        )
    shape = ((1,) if spec.batched else ()) + tuple(dims)
    if not spec.matches(shape):
        raise WarmupError(
            f"{failed}: input '{name}' has dims {dims} where the model expects {list(spec.dims)}"
        )
    given = [source for source in _SOURCES if entry.get(source)]
    if len(given) != 1:
        raise WarmupError(f"{failed}: warmup setting expects input '{name}' to have input_data_type set")
    data = _data(failed, name, given[0], entry[given[0]], dtype, shape, model_dir, rng)
    return Tensor(name, dtype.v2, shape, data)


def _data(
    failed: str,
    name: str,
    source: str,
    value: Any,
    dtype: DataType,
    shape: tuple[int, ...],
    model_dir: Path,
    rng: np.random.Generator,
) -> np.ndarray:
    count = math.prod(shape)
    if source == "input_data_file":
        raw = _read(failed, name, value, model_dir)
        if dtype.v2 == "BYTES":
            try:
                return decode_bytes(memoryview(raw), count, f"input '{name}' from {value}").reshape(shape)
            except InferError as e:
                raise WarmupError(f"{failed}: {e.message}") from None
        needed = count * dtype.size
        if len(raw) < needed:
            raise WarmupError(
                f"{failed}: warmup setting expects {needed} bytes, but the data provided from {value} only "
                f"has {len(raw)} bytes"
            )
        return np.frombuffer(raw[:needed], dtype=dtype.numpy).reshape(shape).copy()
    if dtype.v2 == "BYTES":  # zeros, and random data too: empty strings (Triton's serialized zeros)
        out = np.empty(shape, dtype=object)
        out.fill(b"")
        return out
    if source == "zero_data" or dtype.v2 == "BOOL":
        return np.zeros(shape, dtype=dtype.numpy) if source == "zero_data" else rng.integers(0, 2, shape) > 0
    return np.frombuffer(rng.bytes(count * dtype.size), dtype=dtype.numpy).reshape(shape).copy()


def _read(failed: str, name: str, filename: Any, model_dir: Path) -> bytes:
    """A file of the model's warmup folder (a config may not name a file elsewhere on the disk)."""
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / filename).resolve() if isinstance(filename, str) else folder
    if not path.is_relative_to(folder) or path == folder:
        raise WarmupError(
            f"{failed}: input '{name}': input_data_file must name a file in the model's warmup/"
        )
    try:
        return path.read_bytes()
    except OSError as e:
        raise WarmupError(
            f"{failed}: input '{name}': cannot read input_data_file '{filename}': {e}"
        ) from None


def run(
    sample: Sample,
    executor: Executor,
    batched: bool,
    loop: asyncio.AbstractEventLoop | None,
    stream: Callable[[Job], AsyncIterator[Any]] | None = None,
) -> None:
    """Blocking (the load's thread): the sample's requests executed `count` times as the batcher would
    execute them (`stream`: a model that only streams its answers, each request read to its end);
    raises WarmupError naming the sample when one fails."""
    jobs = [Job({t.name: t.data for t in r.inputs}, 1, request=r) for r in sample.requests]
    batches = [jobs] if batched and stream is None else [[job] for job in jobs]
    failed = f"failed to run warmup sample '{sample.name}'"
    for _ in range(sample.count):
        for batch in batches:
            try:
                if stream is not None:
                    _on_loop(_drain(stream(batch[0])), loop)
                    continue
                produced = _execute(executor, batch, loop)[0]
            except InferError as e:
                raise WarmupError(f"{failed}: {e.message}; ") from None
            except Exception as e:  # a streaming model's own exception
                raise WarmupError(f"{failed}: {type(e).__name__}: {e}; ") from None
            answers = produced if executor.per_request else ()
            errors = [a.message for a in answers if isinstance(a, InferError)]
            if errors:
                raise WarmupError(f"{failed}: {'; '.join(errors)}; ")


async def _drain(answers: AsyncIterator[Any]) -> None:
    async for _ in answers:
        pass


def _on_loop(work: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop | None) -> Any:
    """Runs a coroutine on the server's event loop (where the models it may call live), else on one of
    its own (a version loaded with no server running, as the tests' backends are)."""
    if loop is not None and loop.is_running():
        return asyncio.run_coroutine_threadsafe(work, loop).result()
    return asyncio.run(work)


def _execute(executor: Executor, jobs: list[Job], loop: asyncio.AbstractEventLoop | None) -> Any:
    """One batch through the executor, where it runs: its worker threads, the server's event loop (an
    `async def execute`), or this thread (a plain function, on no loop while the version is loading)."""
    if executor.is_async:
        return _on_loop(executor.run_async(jobs), loop)
    if executor.in_thread:
        return executor.threads.run(executor.run_batch, jobs)
    return executor.run_batch(jobs)
