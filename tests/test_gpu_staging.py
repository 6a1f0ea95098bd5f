"""DeviceStaging (batcher/device.py) on a real CUDA device: its stream synchronisation under forced races,
worker-thread setup, outputs of every kind and datatype, memory that stays flat, two GPUs, and a run under
torch's CUDA sanitizer.

Every test here is `gpu` (skipped cleanly without a device; under TENSORGATE_REQUIRE_GPU=1 a skip fails)
except the two-GPU ones, marked `multi_gpu` instead. Nothing touches CUDA or imports CuPy at import time.

A race is forced by queueing a long busy kernel on one stream (`torch.cuda._sleep`, or a `clock64()` spin
for CuPy) so that work ordered behind it has not run when the next step is queued: each race test names the
synchronisation line in batcher/device.py whose removal makes it fail, and first checks that the delayed
work was indeed still pending (else it would have checked nothing).
"""

import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_helpers import (
    as_worker,
    delay,
    gpu_test,
    multi_gpu_test,
    pending,
    record,
    to_numpy,
)
from test_staging import config, needs, rows

from tensorgate.batcher.device import MIN_BUFFER_BYTES, DeviceStaging, torch_for_cupy
from tensorgate.batcher.staging import make_staging
from tensorgate.codec.datatypes import BY_CONFIG, bf16_bits

ROOT = Path(__file__).resolve().parents[1]
SHORT = 2_000_000  # ~1 ms: per iteration of a loop
MODULES = [pytest.param(m, marks=needs(m)) for m in ("torch", "cupy")]


def staging_for(module: str, **kwargs: str) -> DeviceStaging:
    return DeviceStaging(config(module=module, **kwargs), "cuda:0", module)


# ------------------------------------------------------------------------------------- forced races


@pytest.mark.parametrize("module", MODULES)
def test_compute_waits_for_the_copy_of_a_delayed_lane(module: str) -> None:
    """Guards `consumer.wait_stream(stream)` in _TorchOps.to_device (`consumer.wait_event(buffer.event)` in
    _CupyOps.to_device): without it the compute below reads the batch before the delayed copy filled it
    (device memory still holding the warm-up's -7s, or nothing yet)."""
    staging = staging_for(module)
    with as_worker(staging):
        staging.gather("x", [np.full((4, 3), -7, np.float32)])  # warm-up: makes the lane
        [lane] = staging._lanes
        delay(module, lane.stream)  # the copy stream is busy ~50 ms
        batch = staging.gather("x", [rows(4, 1)])
        copy_pending = pending(lane.buffers["x"].event)
        doubled = batch * 2  # at once, on this thread's compute stream
        result = to_numpy(doubled)
    assert copy_pending, "the copy had run before the compute was queued: this checked nothing"
    np.testing.assert_array_equal(result, rows(4, 1) * 2)


@pytest.mark.parametrize("module", MODULES)
def test_a_pinned_buffer_is_refilled_only_after_its_copy_ran(module: str) -> None:
    """Guards `_wait(buffer.event)` in DeviceStaging._buffer: without it B's rows overwrite the pinned
    buffer while A's copy out of it still waits behind the delay, and A's batch holds B's rows."""
    staging = staging_for(module)
    with as_worker(staging):
        staging.gather("x", [rows(4, -100)])  # warm-up: the lane and its buffer for "x"
        [lane] = staging._lanes
        buffer = lane.buffers["x"]
        delay(module, lane.stream)  # before A's copy
        a = staging.gather("x", [rows(4, 1)])
        a_pending = pending(buffer.event)
        b = staging.gather("x", [rows(4, 1000)])  # same lane, same buffer
        reused = list(staging._lanes) == [lane] and lane.buffers["x"] is buffer
        a_host, b_host = to_numpy(a), to_numpy(b)
    assert a_pending, "A's copy had run before B was gathered: this checked nothing"
    assert reused, "B did not go through A's lane and buffer: this checked nothing"
    np.testing.assert_array_equal(a_host, rows(4, 1))
    np.testing.assert_array_equal(b_host, rows(4, 1000))


@pytest.mark.parametrize("module", MODULES)
def test_to_host_waits_for_the_compute_of_its_outputs(module: str) -> None:
    """Guards `stream.wait_stream(torch.cuda.current_stream(self.device))` in _TorchOps.to_host
    (`stream.wait_event(cupy.cuda.get_current_stream().record())` in _CupyOps.to_host): without it the
    lane copies the output out before the kernel computing it ran. (The batcher calls `finished()` before
    to_host, which hides this; a direct caller does not.)"""
    staging = staging_for(module)
    with as_worker(staging):
        batch = staging.gather("x", [rows(4, 1)])
        delay(module)  # this thread's compute stream is busy ~50 ms
        out = batch * 3  # computed after it
        computed = record(module)
        compute_pending = pending(computed)
        host = staging.to_host({"z": out})["z"]
    assert compute_pending, "the output was computed before to_host: this checked nothing"
    np.testing.assert_array_equal(host, rows(4, 1) * 3)


@pytest.mark.parametrize("module", MODULES)
def test_freed_batches_are_not_reused_before_the_compute_reading_them_ran(module: str) -> None:
    """500 batches, each read by a kernel queued behind a delay, then dropped at once. Guards
    `tensor.record_stream(consumer)` in _TorchOps.to_device (the tensor is allocated on the copy stream:
    without it the allocator hands its memory to the next batch's copy while the compute stream has yet to
    read it) and, for CuPy, `stream.wait_event(consumer.record())` in _CupyOps.to_device (the array comes
    from the compute stream's pool: without it the next copy writes into it before that read)."""
    staging = staging_for(module)
    with as_worker(staging):
        results = []
        for i in range(500):
            batch = staging.gather("x", [rows(2, 10 * i)])
            delay(module, cycles=SHORT)
            results.append(batch * 2)
            del batch
        done = [to_numpy(r) for r in results]
    wrong = [i for i, r in enumerate(done) if not np.array_equal(r, rows(2, 10 * i) * 2)]
    assert not wrong, f"batches {wrong[:10]} (of {len(wrong)}) were overwritten before they were read"


@gpu_test("cupy")
def test_dlpack_outputs_wait_for_the_stream_that_computed_them() -> None:
    """An output computed by the other array module on its own stream, behind a delay, comes back right.

    torch staging: guards that `self.torch.from_dlpack` (_TorchOps._as_tensor) runs inside
    `with torch.cuda.stream(stream)` in _TorchOps.to_host: torch then hands the lane stream to CuPy's
    `__dlpack__`, which makes it wait for CuPy's current stream; the lane's `wait_stream` on torch's
    current stream does not cover CuPy's. CuPy staging: guards that `cupy.from_dlpack` (_CupyOps._array)
    runs before the lane's `wait_event` on CuPy's current stream in _CupyOps.to_host: torch's `__dlpack__`
    makes that stream wait for torch's, and the lane waits for it."""
    import cupy
    import torch

    torch_staging = staging_for("torch")
    with as_worker(torch_staging), cupy.cuda.Stream(non_blocking=True):
        source = cupy.asarray(rows(4, 1))
        delay("cupy")
        out = source * 2
        cupy_busy = pending(record("cupy"))
        from_cupy = torch_staging.to_host({"z": out})["z"]

    cupy_staging = staging_for("cupy")
    with as_worker(cupy_staging), torch.cuda.stream(torch.cuda.Stream()):
        source = torch.from_numpy(rows(4, 1)).to("cuda:0")
        delay("torch")
        out = source * 5
        torch_busy = pending(record("torch"))
        from_torch = cupy_staging.to_host({"z": out})["z"]

    assert cupy_busy and torch_busy, "an output was computed before to_host: this checked nothing"
    np.testing.assert_array_equal(from_cupy, rows(4, 1) * 2)
    np.testing.assert_array_equal(from_torch, rows(4, 1) * 5)


# ------------------------------------------------------------------------------ worker threads, finish


def probe_threads(staging: DeviceStaging, probe: Callable[[], Any]) -> list[Any]:
    """`probe()` in each of two worker threads set up as the batcher's (ThreadPoolExecutor's initializer
    `staging.enter_thread`), both alive at once."""
    both = threading.Barrier(2, timeout=30)

    def run() -> Any:
        both.wait()  # the second task cannot run in the first thread
        return threading.get_ident(), probe()

    with ThreadPoolExecutor(2, initializer=staging.enter_thread) as pool:
        results = [f.result() for f in [pool.submit(run) for _ in range(2)]]
    assert results[0][0] != results[1][0]
    return [found for _, found in results]


@gpu_test("torch")
def test_torch_worker_threads_get_the_device_and_a_stream_of_their_own() -> None:
    import torch

    staging = staging_for("torch")

    def probe() -> tuple[int, int, int]:
        current = torch.cuda.current_stream()
        return current.cuda_stream, torch.cuda.default_stream().cuda_stream, torch.cuda.current_device()

    (first, default, device_1), (second, _, device_2) = probe_threads(staging, probe)
    assert first != default and second != default, "a worker computes on the default stream"
    assert first != second, "two instances share a compute stream"
    assert device_1 == device_2 == torch.device(staging.device).index
    main = torch.cuda.current_stream()
    assert main.cuda_stream == torch.cuda.default_stream().cuda_stream  # nothing leaked to this thread


@gpu_test("cupy")
def test_cupy_worker_threads_get_the_device_and_a_stream_of_their_own() -> None:
    import cupy

    staging = staging_for("cupy")

    def probe() -> tuple[int, int]:
        own = cupy.cuda.get_current_stream().ptr
        host = staging.to_host({"z": cupy.arange(4, dtype=cupy.float32)})["z"]
        np.testing.assert_array_equal(host, np.arange(4, dtype=np.float32))
        assert cupy.cuda.get_current_stream().ptr == own, "to_host left another stream current"
        return own, cupy.cuda.runtime.getDevice()

    (first, device_1), (second, device_2) = probe_threads(staging, probe)
    # 0: the null stream; 1 and 2: the legacy and per-thread default streams' handles
    defaults = {0, 1, 2, cupy.cuda.Stream.null.ptr}
    assert first not in defaults and second not in defaults, "a worker computes on a default stream"
    assert first != second, "two instances share a compute stream"
    assert device_1 == device_2 == 0


@pytest.mark.parametrize("module", MODULES)
def test_finished_returns_once_the_threads_kernels_ran(module: str) -> None:
    """Guards `self.torch.cuda.current_stream(self.device).synchronize()` in _TorchOps.finished
    (`cupy.cuda.get_current_stream().synchronize()` in _CupyOps.finished): syncing any other stream (the
    default one) returns at once, the worker's stream being non-blocking; the batcher's compute_infer
    would then time the launch, not the kernel."""
    staging = staging_for(module)
    with as_worker(staging):
        delay(module)  # queued on this thread's compute stream
        queued = record(module)
        was_pending = pending(queued)
        staging.finished()
        still_pending = pending(queued)
    assert was_pending, "the kernel had run before finished(): this checked nothing"
    assert not still_pending, "finished() returned before the thread's kernels ran"


# ------------------------------------------------------------------------------------------ outputs


@gpu_test("torch")
def test_torch_staging_outputs_with_grad_in_bf16_and_on_the_host() -> None:
    import torch

    fp32, bf16 = staging_for("torch"), staging_for("torch", out_dtype="TYPE_BF16")
    with as_worker(fp32):
        batch = fp32.gather("x", [rows(2, 1)])
        weight = torch.full((3,), 2.0, device="cuda:0", requires_grad=True)
        with_grad = batch * weight
        assert with_grad.requires_grad
        np.testing.assert_array_equal(fp32.to_host({"z": with_grad})["z"], rows(2, 1) * 2)
        on_host = torch.arange(6.0).reshape(2, 3).requires_grad_()  # .detach() before .numpy()
        np.testing.assert_array_equal(fp32.to_host({"z": on_host})["z"], rows(2))

        values = torch.tensor([[1.0, -2.5, 0.15625], [3.0, 1e30, -0.0]], device="cuda:0")
        as_bf16 = values.to(torch.bfloat16) * 3
        host = bf16.to_host({"z": as_bf16})["z"]
        assert host.dtype == np.uint16
        np.testing.assert_array_equal(host, as_bf16.view(torch.uint16).cpu().numpy())
        cast = bf16.to_host({"z": values})["z"]  # FP32 where the config says BF16: cast by torch
        np.testing.assert_array_equal(cast, values.to(torch.bfloat16).view(torch.uint16).cpu().numpy())


@gpu_test("cupy")
def test_cupy_staging_takes_torch_outputs_with_grad_in_bf16_and_on_the_host() -> None:
    """torch tensors handed to a CuPy staging: `tensor.detach()` in torch_for_cupy (DLPack refuses a tensor
    that requires grad, numpy too), bfloat16 as its bits both on the device and on the host."""
    import torch

    fp32, bf16 = staging_for("cupy"), staging_for("cupy", out_dtype="TYPE_BF16")
    with as_worker(fp32):
        weight = torch.full((3,), 2.0, device="cuda:0", requires_grad=True)
        with_grad = torch.from_numpy(rows(2, 1)).to("cuda:0") * weight
        np.testing.assert_array_equal(fp32.to_host({"z": with_grad})["z"], rows(2, 1) * 2)
        on_host = torch.arange(6.0).reshape(2, 3).requires_grad_()
        np.testing.assert_array_equal(fp32.to_host({"z": on_host})["z"], rows(2))

        values = torch.tensor([[1.0, -2.5, 0.15625], [3.0, 1e30, -0.0]], dtype=torch.bfloat16)
        expected = values.view(torch.uint16).numpy()
        for tensor in (values.to("cuda:0"), values):  # on the device, and on the host
            host = bf16.to_host({"z": tensor})["z"]
            assert host.dtype == np.uint16
            np.testing.assert_array_equal(host, expected)


@gpu_test("torch")
def test_torch_for_cupy_gives_cuda_bf16_as_int16_bits_without_a_copy() -> None:
    import torch

    values = torch.tensor([1.0, -2.5, 0.15625, 65280.0], dtype=torch.bfloat16, device="cuda:0")
    bits = torch_for_cupy(torch, values)
    assert bits.dtype is torch.int16 and bits.device == values.device
    assert bits.data_ptr() == values.data_ptr()
    np.testing.assert_array_equal(bits.cpu().numpy().view(np.uint16), values.view(torch.uint16).cpu().numpy())
    assert not torch_for_cupy(torch, values.float().requires_grad_()).requires_grad


# ------------------------------------------------------------------------------------------ datatypes

DATATYPES = ["TYPE_BOOL", "TYPE_UINT8", "TYPE_INT64", "TYPE_FP16", "TYPE_BF16", "TYPE_UINT32"]


def random_values(config_type: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values of a config datatype as the codec hands them over (BF16: bfloat16 bit patterns)."""
    rng = np.random.default_rng(seed)
    if config_type == "TYPE_BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if config_type == "TYPE_UINT8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if config_type == "TYPE_INT64":
        return rng.integers(-(2**62), 2**62, shape, dtype=np.int64)  # beyond float64's exact range
    if config_type == "TYPE_UINT32":
        return rng.integers(2**31, 2**32, shape, dtype=np.uint32)  # beyond int32's range
    if config_type == "TYPE_FP16":
        return rng.standard_normal(shape).astype(np.float16)
    assert config_type == "TYPE_BF16"
    return bf16_bits(rng.standard_normal(shape).astype(np.float32))


def part_cases(config_type: str) -> dict[str, list[np.ndarray]]:
    """Batches of parts (rows of width 3) as requests give them: read-only views of a body, strided
    arrays, zero rows."""
    dtype = BY_CONFIG[config_type].numpy
    read_only = np.frombuffer(random_values(config_type, (5, 3), 1).tobytes(), dtype=dtype).reshape(5, 3)
    assert not read_only.flags.writeable
    strided_columns = random_values(config_type, (4, 6), 2)[:, ::2]
    strided_rows = random_values(config_type, (8, 3), 3)[::2]
    assert not strided_columns.flags.c_contiguous and not strided_rows.flags.c_contiguous
    zero = random_values(config_type, (0, 3), 4)
    return {
        "read-only": [read_only],
        "strided columns": [strided_columns],
        "strided rows": [strided_rows],
        "zero rows": [zero],
        "mixed": [read_only, zero, strided_rows, strided_columns, zero],
    }


@pytest.mark.parametrize("config_type", DATATYPES)
@pytest.mark.parametrize("module", MODULES)
def test_every_datatype_round_trips(module: str, config_type: str) -> None:
    """gather then to_host gives back the numpy concatenation of the parts, bit for bit; on the device the
    batch has the config's type (CuPy has no bfloat16: BF16 stays uint16 bits there)."""
    staging = staging_for(module, dtype=config_type)
    datatype = BY_CONFIG[config_type]
    if module == "torch":
        import torch

        device_dtype = getattr(torch, datatype.torch)
    else:
        device_dtype = datatype.numpy
    with as_worker(staging):
        for case, parts in part_cases(config_type).items():
            expected = np.concatenate(parts)
            batch = staging.gather("x", parts)
            assert batch.dtype == device_dtype, (case, batch.dtype)
            assert tuple(batch.shape) == expected.shape, case
            assert str(batch.device) in ("cuda:0", "<CUDA Device 0>"), (case, batch.device)
            host = staging.to_host({"z": batch})["z"]
            assert isinstance(host, np.ndarray) and host.dtype == datatype.numpy, (case, host.dtype)
            np.testing.assert_array_equal(host, expected, err_msg=case)


# ------------------------------------------------------------------------------------------- memory

THREADS, BATCHES, WARM_UP = 4, 2000, 200


@gpu_test("torch")
def test_memory_stays_flat_over_many_batches_from_many_threads() -> None:
    """2,000 batches of 1..64 rows from 4 instance threads: after 200 batches of warm-up, neither the
    pinned input buffers, nor the output pool, nor torch's reserved device memory grows, and no device
    memory stays allocated; close() then lets go of every host buffer."""
    import torch

    staging = staging_for("torch")
    most = 64 * 3 * 4  # bytes of the largest batch
    # What 4 threads can hold at once is made first (a lane each, with its buffer and a block of device
    # memory on its copy stream, and an output buffer each), so that the warm-up need not happen to reach
    # the most concurrency for the measurements to be fair: after it, anything new is growth.
    with contextlib.ExitStack() as stack:
        lanes = [stack.enter_context(staging._lane()) for _ in range(THREADS)]
        for lane in lanes:
            staging._buffer(lane, "x", most)
            with torch.cuda.stream(lane.stream):
                torch.empty(most, dtype=torch.uint8, device="cuda:0")
    leases = [staging.output_pool.lease(most) for _ in range(THREADS)]
    del leases

    warm, go = threading.Barrier(THREADS + 1, timeout=60), threading.Barrier(THREADS + 1, timeout=60)
    failures: list[str] = []

    def one(rng: np.random.Generator, tag: int) -> None:
        n = int(rng.integers(1, 65))
        cut = int(rng.integers(0, n + 1))
        parts = [rows(cut, tag), rows(n - cut, -tag)] if 0 < cut < n else [rows(n, tag)]
        host = staging.to_host({"z": staging.gather("x", parts) * 2 + 1})["z"]
        if not np.array_equal(host, np.concatenate(parts) * 2 + 1):
            failures.append(f"batch {tag}")

    def worker(seed: int) -> None:
        try:
            staging.enter_thread()
            rng = np.random.default_rng(seed)
            for i in range(BATCHES // THREADS):
                if i == WARM_UP // THREADS:
                    warm.wait()
                    go.wait()
                one(rng, seed * 10_000 + i)
        except BaseException as e:
            failures.append(f"thread {seed}: {e!r}")
            warm.abort()
            go.abort()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for t in threads:
        t.start()
    before = None
    try:
        warm.wait()  # every thread is between batches, holding nothing
        before = (
            staging.pinned_bytes,
            staging.output_pool.nbytes,
            torch.cuda.memory_reserved(0),
            torch.cuda.memory_allocated(0),
        )
        go.wait()
    except threading.BrokenBarrierError:
        pass  # a thread failed: it says why in `failures`
    finally:
        for t in threads:
            t.join()
    assert not failures, failures
    assert before is not None
    pinned, pool, reserved, allocated = before
    assert pinned == THREADS * MIN_BUFFER_BYTES  # one lane a thread, each with one buffer
    assert staging.pinned_bytes <= pinned
    assert staging.output_pool.nbytes <= pool
    assert torch.cuda.memory_reserved(0) <= reserved
    assert torch.cuda.memory_allocated(0) <= allocated  # every batch and output was freed
    staging.close()
    assert staging.output_pool.nbytes == 0
    assert staging.pinned_bytes == 0


# -------------------------------------------------------------------------------------------- two GPUs


@multi_gpu_test
def test_an_output_on_another_gpu_comes_back_after_that_gpus_stream() -> None:
    """Guards `tensor = tensor.to(self.device)` in _TorchOps.to_host running inside the lane's stream
    context: torch copies between devices after the source device's current stream (where the delay
    is) and makes the lane wait for it; a copy not ordered so reads the output before it is computed."""
    import torch

    staging = staging_for("torch")
    with as_worker(staging):
        with torch.cuda.device(1):
            source = torch.from_numpy(rows(4, 1)).to("cuda:1")
            delay("torch")  # cuda:1's current stream
            out = source * 5
            busy = pending(record("torch"))
        host = staging.to_host({"z": out})["z"]
    assert busy, "the output was computed before to_host: this checked nothing"
    np.testing.assert_array_equal(host, rows(4, 1) * 5)


@multi_gpu_test
def test_a_staging_on_gpu_1_runs_its_worker_threads_there() -> None:
    import torch

    staging = make_staging(config(module="torch", kind="KIND_GPU", gpus="gpus: [ 1 ]"))
    assert isinstance(staging, DeviceStaging) and staging.device == "cuda:1"

    def work() -> tuple:
        made = torch.empty(2, device="cuda")  # the current device
        batch = staging.gather("x", [rows(2, 1)])
        host = staging.to_host({"z": batch * 2})["z"]
        current = torch.cuda.current_stream(1).cuda_stream
        return torch.cuda.current_device(), made.device, batch.device, host, current

    with ThreadPoolExecutor(1, initializer=staging.enter_thread) as pool:
        device, made, batch, host, current = pool.submit(work).result()
    assert device == 1 and made == batch == torch.device("cuda:1")
    assert current != torch.cuda.default_stream(1).cuda_stream
    np.testing.assert_array_equal(host, rows(2, 1) * 2)


# ------------------------------------------------------------------------------------------- sanitizer


@gpu_test("torch")
@pytest.mark.timeout(300)
def test_sanitizer_finds_no_race_in_the_gpu_tests() -> None:
    """The GPU tests here and the pytorch backend's, again under TORCH_CUDA_SANITIZER=1 (CSAN): it checks
    every torch kernel of the test thread against the stream synchronisation torch saw, and fails the
    kernel that reads or writes memory another stream may still be using."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-m",
        "gpu",
        "tests/test_gpu_staging.py",
        "tests/test_pytorch_backend.py",
        "-k",
        "not sanitizer",
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "TORCH_CUDA_SANITIZER": "1"},
        capture_output=True,
        text=True,
        timeout=280,
    )
    output = done.stdout + done.stderr
    assert "CSAN detected a possible data race" not in output, output[-20_000:]
    assert done.returncode == 0, output[-20_000:]
    assert re.search(r"\b\d+ passed\b", output), output[-20_000:]
