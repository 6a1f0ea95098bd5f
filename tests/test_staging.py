"""Device staging: which staging a config gets, and that every path hands the model the right batch and
brings its outputs back as host arrays. CPU paths run everywhere; `gpu` tests run the same on CUDA."""

import asyncio
import gc
import logging
import threading

import numpy as np
import pytest

import tensorgate.batcher.staging
from tensorgate.batcher.device import OutputPool, _Buffer, torch_for_cupy
from tensorgate.batcher.execution import Executor
from tensorgate.batcher.scheduler import Job
from tensorgate.batcher.staging import (
    DeviceStaging,
    HostStaging,
    TorchHostStaging,
    array_module,
    instance_count,
    make_staging,
    placement,
)
from tensorgate.codec.datatypes import bf16_bits
from tensorgate.codec.errors import InferError
from tensorgate.server.model_config import normalize_config
from tensorgate.server.pbtxt import parse_pbtxt


def config(
    *,
    backend: str = "python",
    kind: str = "",
    gpus: str = "",
    module: str = "",
    dtype: str = "TYPE_FP32",
    out_dtype: str = "",
    groups: str = "",
) -> dict:
    group = f"instance_group [ {{ kind: {kind} {gpus} }} ]" if kind else ""
    group = f"instance_group [ {groups} ]" if groups else group
    params = f'parameters {{ key: "array_module" value: {{ string_value: "{module}" }} }}' if module else ""
    text = f"""
name: "m"
backend: "{backend}"
max_batch_size: 64
input [ {{ name: "x" data_type: {dtype} dims: [ 3 ] }}, {{ name: "y" data_type: {dtype} dims: [ 2 ] }} ]
output [ {{ name: "z" data_type: {out_dtype or dtype} dims: [ 3 ] }} ]
{group}
{params}
"""
    return normalize_config(parse_pbtxt(text), "m")


def rows(n: int, start: float = 0, width: int = 3) -> np.ndarray:
    return np.arange(start, start + n * width, dtype=np.float32).reshape(n, width)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def cupy_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------- choice


def test_numpy_is_the_default_and_stays_on_the_host_whatever_the_group_asks(caplog) -> None:
    for cfg in (config(), config(kind="KIND_GPU"), config(kind="KIND_AUTO")):
        with caplog.at_level(logging.WARNING, "tensorgate.staging"):
            staging = make_staging(cfg)
        assert isinstance(staging, HostStaging)
        assert (staging.device, staging.array_module) == ("cpu", "numpy")
    [warning] = [r.getMessage() for r in caplog.records]  # KIND_GPU with numpy: not silent
    assert "asks for KIND_GPU but the model's array_module is numpy" in warning


def test_array_module_parameter() -> None:
    assert array_module(config()) == "numpy"
    assert array_module(config(module="torch")) == "torch"
    assert array_module(config(module="cupy")) == "cupy"
    assert array_module(config(backend="pytorch")) == "torch"  # whatever the parameter says
    with pytest.raises(ValueError, match="array_module must be one of numpy, torch, cupy, got 'jax'"):
        array_module(config(module="jax"))


def test_torch_on_cpu_gets_cpu_tensors(torch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "tensorgate.staging"):
        staging = make_staging(config(module="torch", kind="KIND_CPU"))
    assert isinstance(staging, TorchHostStaging)
    assert (staging.device, staging.array_module) == ("cpu", "torch")
    assert not caplog.records


@pytest.mark.skipif(cuda_available(), reason="checks the fallback without CUDA")
def test_kind_gpu_without_cuda_falls_back_to_cpu_with_a_warning(torch, caplog) -> None:
    with caplog.at_level(logging.WARNING, "tensorgate.staging"):
        staging = make_staging(config(backend="pytorch", kind="KIND_GPU", gpus="gpus: [ 0 ]"))
    assert isinstance(staging, TorchHostStaging)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    why = (
        f"torch {torch.__version__} is a CPU-only build (install its CUDA build to use a GPU)"
        if torch.version.cuda is None
        else "no CUDA device is present"
    )
    assert record.getMessage() == (
        f"model 'm': instance_group 'm_0' asks for KIND_GPU but {why}; running on the CPU"
    )


@pytest.mark.skipif(cuda_available(), reason="checks the fallback without CUDA")
def test_kind_auto_without_cuda_is_cpu_without_a_warning(torch, caplog) -> None:
    with caplog.at_level(logging.WARNING, "tensorgate.staging"):
        assert placement(config(kind="KIND_AUTO", module="torch"), "torch") == ("cpu", "")
        assert make_staging(config(kind="KIND_AUTO", module="torch")).device == "cpu"
    assert not caplog.records


@pytest.mark.skipif(cupy_available(), reason="checks the fallback without CuPy or CUDA")
def test_cupy_without_a_gpu_gets_numpy_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "tensorgate.staging"):
        staging = make_staging(config(module="cupy", kind="KIND_GPU"))
    assert isinstance(staging, HostStaging)
    messages = [r.getMessage() for r in caplog.records]
    assert any("asks for KIND_GPU but" in m for m in messages), messages
    assert messages[-1] == "model 'm': array_module 'cupy' needs a CUDA device; the model gets numpy arrays"


def test_instance_count_on_a_gpu_is_the_placing_groups_and_on_the_host_every_groups() -> None:
    two = config(groups='{ name: "c" count: 3 kind: KIND_CPU }, { name: "g" count: 2 kind: KIND_GPU }')
    assert instance_count(two, "cuda:0") == 2  # the KIND_CPU group's three do not run on the GPU
    assert instance_count(two, "cpu") == 5  # no GPU: every group's instances run on the host
    assert instance_count(config(groups="{ count: 4 kind: KIND_AUTO }"), "cuda:0") == 4
    assert instance_count(config(), "cpu") == 1  # no instance_group: Triton's default, one instance


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device count a CUDA machine with two GPUs reports: placement's choices without one."""
    monkeypatch.setattr(tensorgate.batcher.staging, "cuda_devices", lambda module: (2, ""))


def test_placement_honours_gpus_of_kind_auto_and_says_what_it_does_not_run(two_gpus) -> None:
    assert placement(config(module="torch", kind="KIND_AUTO", gpus="gpus: [ 1 ]"), "torch") == ("cuda:1", "")
    assert placement(config(module="cupy", kind="KIND_GPU"), "cupy") == ("cuda:0", "")
    device, warning = placement(config(module="torch", kind="KIND_GPU", gpus="gpus: [ 1, 0 ]"), "torch")
    assert device == "cuda:1"
    assert warning == (
        "instance_group 'm_0' lists GPUs [1, 0]; its instances all run on GPU 1; "
        "a model runs on one device here"
    )
    mixed = config(module="torch", groups='{ name: "c" kind: KIND_CPU }, { name: "g" kind: KIND_GPU }')
    assert placement(mixed, "torch") == (
        "cuda:0",
        "instance_group 'c' not run beside instance_group 'g' on cuda:0; a model runs on one device here",
    )
    with pytest.raises(ValueError, match=r"instance_group 'm_0' asks for GPU 2 but 2 CUDA device\(s\)"):
        placement(config(module="torch", kind="KIND_AUTO", gpus="gpus: [ 2 ]"), "torch")
    assert placement(config(module="torch", kind="KIND_CPU"), "torch") == ("cpu", "")


def test_torch_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    with pytest.raises(ImportError, match=r"torch is not installed \(pip install 'tensorgate\[torch\]'\)"):
        make_staging(config(module="torch"))
    assert isinstance(make_staging(config()), HostStaging)  # numpy models never need it


# ----------------------------------------------------------------------------------------- host numpy


def test_host_staging_hands_a_single_part_over_as_is_and_concatenates_several() -> None:
    staging = HostStaging()
    part = rows(2)
    assert staging.gather("x", [part]) is part
    batch = staging.gather("x", [rows(1), rows(2, 100), rows(3, 200)])
    np.testing.assert_array_equal(batch, np.concatenate([rows(1), rows(2, 100), rows(3, 200)]))
    outputs = {"z": batch}
    assert staging.to_host(outputs)["z"] is batch


# ------------------------------------------------------------------------------------------ CPU torch


def test_torch_host_gather_shares_memory_with_a_writable_part(torch) -> None:
    staging = TorchHostStaging(config(module="torch"))
    part = rows(4)
    tensor = staging.gather("x", [part])
    assert isinstance(tensor, torch.Tensor)
    assert tensor.dtype is torch.float32 and tuple(tensor.shape) == (4, 3)
    assert tensor.data_ptr() == part.ctypes.data  # no copy


def test_torch_host_gather_concatenates_in_order(torch) -> None:
    staging = TorchHostStaging(config(module="torch"))
    parts = [rows(1), rows(5, 100), rows(2, 200)]
    tensor = staging.gather("x", parts)
    np.testing.assert_array_equal(tensor.numpy(), np.concatenate(parts))


def test_torch_host_gather_copies_a_read_only_part(torch) -> None:
    staging = TorchHostStaging(config(module="torch"))
    body = rows(2).tobytes()
    part = np.frombuffer(body, dtype=np.float32).reshape(2, 3)  # a view of an immutable request body
    tensor = staging.gather("x", [part])
    tensor.add_(1)  # a model writing into its input in place
    np.testing.assert_array_equal(np.frombuffer(body, dtype=np.float32), np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(tensor.numpy(), rows(2) + 1)


def test_torch_host_bf16_inputs_and_outputs_travel_as_uint16_bits(torch) -> None:
    staging = TorchHostStaging(config(module="torch", dtype="TYPE_BF16"))
    values = torch.tensor([[1.0, -2.5, 0.15625]], dtype=torch.bfloat16)
    bits = values.view(torch.uint16).numpy()  # what the codec hands over for BF16
    tensor = staging.gather("x", [bits])
    assert tensor.dtype is torch.bfloat16
    assert tensor.tolist() == [[1.0, -2.5, 0.15625]]
    host = staging.to_host({"z": tensor * 2})["z"]
    assert host.dtype == np.uint16
    np.testing.assert_array_equal(host, (values * 2).view(torch.uint16).numpy())


def test_torch_host_to_host_gives_numpy_views_in_the_configured_dtype(torch) -> None:
    staging = TorchHostStaging(config(module="torch"))
    out = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    host = staging.to_host({"z": out, "extra": np.ones(2)})
    assert isinstance(host["z"], np.ndarray) and host["z"].dtype == np.float32
    assert np.shares_memory(host["z"], out.numpy())  # no copy
    np.testing.assert_array_equal(host["extra"], np.ones(2))  # not a tensor: as given
    cast = staging.to_host({"z": out.double().requires_grad_()})["z"]  # a model returning FP64 with grad
    assert cast.dtype == np.float32
    np.testing.assert_array_equal(cast, out.numpy())


def test_bytes_inputs_stay_numpy_objects(torch) -> None:
    cfg = config(module="torch", dtype="TYPE_STRING", out_dtype="TYPE_FP32")
    parts = [np.array([b"a", b"bc"], dtype=object), np.array([b"d"], dtype=object)]
    for staging in (TorchHostStaging(cfg), DeviceStaging(cfg, "cpu")):
        batch = staging.gather("x", parts)
        assert isinstance(batch, np.ndarray) and batch.tolist() == [b"a", b"bc", b"d"]


# -------------------------------------------------------------------- device staging, buffer logic on CPU


def test_device_staging_gathers_batches_of_any_size_through_one_reused_buffer(torch) -> None:
    staging = DeviceStaging(config(module="torch"), "cpu")
    first = staging.gather("x", [rows(2), rows(3, 100)])
    assert staging.pinned_bytes == 1 << 16  # the smallest buffer holds it
    earlier = first.clone()
    big = [rows(3000), rows(2000, 1e5)]  # 60 000 bytes: still fits
    second = staging.gather("x", big)
    np.testing.assert_array_equal(second.numpy(), np.concatenate(big))
    assert staging.pinned_bytes == 1 << 16
    bigger = [rows(3000), rows(3000, 1e5)]  # 72 000 bytes: the buffer doubles
    third = staging.gather("x", bigger)
    np.testing.assert_array_equal(third.numpy(), np.concatenate(bigger))
    assert staging.pinned_bytes == 1 << 17
    small = staging.gather("x", [rows(1, 7)])  # a smaller batch reuses the grown buffer
    assert staging.pinned_bytes == 1 << 17
    np.testing.assert_array_equal(small.numpy(), rows(1, 7))
    # what the model received for earlier batches is not overwritten by later ones
    np.testing.assert_array_equal(first.numpy(), earlier.numpy())
    np.testing.assert_array_equal(third.numpy(), np.concatenate(bigger))


def test_device_staging_keeps_one_buffer_per_input(torch) -> None:
    staging = DeviceStaging(config(module="torch"), "cpu")
    x = staging.gather("x", [rows(2)])
    y = staging.gather("y", [rows(2, 50, width=2)])
    assert staging.pinned_bytes == 2 << 16
    np.testing.assert_array_equal(x.numpy(), rows(2))
    np.testing.assert_array_equal(y.numpy(), rows(2, 50, width=2))


def test_device_staging_bf16_and_outputs(torch) -> None:
    staging = DeviceStaging(config(module="torch", dtype="TYPE_BF16"), "cpu")
    values = torch.tensor([[0.5, 1.5, -3.0], [2.0, 4.0, 8.0]], dtype=torch.bfloat16)
    tensor = staging.gather("x", [values.view(torch.uint16).numpy()])
    assert tensor.dtype is torch.bfloat16 and torch.equal(tensor, values)
    host = staging.to_host({"z": tensor.float() + 1, "passthrough": [1, 2]})
    assert host["z"].dtype == np.uint16
    np.testing.assert_array_equal(host["z"], (values + 1).view(torch.uint16).numpy())
    assert host["passthrough"] == [1, 2]


def test_device_staging_from_many_threads_at_once(torch) -> None:
    staging = DeviceStaging(config(module="torch"), "cpu")
    failures: list[str] = []
    barrier = threading.Barrier(4)

    def worker(seed: int) -> None:
        barrier.wait()
        for i in range(50):
            parts = [rows(1 + (seed + i) % 7, seed * 1000 + i), rows(2, -seed - i)]
            tensor = staging.gather("x", parts)
            host = staging.to_host({"z": tensor * 2})["z"]
            if not np.array_equal(host, np.concatenate(parts) * 2):
                failures.append(f"thread {seed} batch {i}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert staging.pinned_bytes <= 4 << 16  # at most one lane per batch staged at once


def test_device_staging_takes_lanes_first_in_first_out(torch) -> None:
    """Consecutive batches use different copy streams once two lanes exist: the lane given back first is
    taken first (last-in-first-out would queue each copy behind the previous batch's on one stream)."""
    staging = DeviceStaging(config(module="torch"), "cpu")
    with staging._lane() as first, staging._lane() as second:
        pass  # two batches staged at once: two lanes; `second` was given back first
    taken = []
    for _ in range(4):
        with staging._lane() as lane:
            taken.append(lane)
    assert taken == [second, first, second, first]


def test_device_staging_close_releases_its_buffers(torch) -> None:
    staging = DeviceStaging(config(module="torch"), "cpu")
    staging.gather("x", [rows(2)])
    staging.gather("y", [rows(2, width=2)])
    assert staging.pinned_bytes == 2 << 16
    Executor(lambda batch: batch, label="m", staging=staging).close()  # unloading closes the staging
    assert staging.pinned_bytes == 0


def numpy_pool() -> OutputPool:
    return OutputPool(lambda size: _Buffer(*(2 * (np.zeros(size, dtype=np.uint8),))))


def test_output_pool_lends_a_buffer_again_only_once_every_view_of_it_is_gone() -> None:
    pool = numpy_pool()
    out, buffer = pool.lease(24)
    batch = out.view(np.float32).reshape(2, 3)  # a batch's output, as to_host shapes it
    batch[:] = rows(2)
    first_row = batch[:1]  # what one request's answer keeps after the batch is split
    del out, batch
    gc.collect()
    other, other_buffer = pool.lease(24)
    assert other_buffer is not buffer  # still viewed: not lent again
    np.testing.assert_array_equal(first_row, rows(1))
    del first_row, other
    again, again_buffer = pool.lease(100)
    assert again_buffer in (buffer, other_buffer)  # the same size class, given back: reused
    assert pool.nbytes == 2 << 16
    assert pool.lease(0)[1] is None  # nothing to hold for an empty output


def test_output_pool_memory_is_flat_under_threads_and_released_on_close() -> None:
    pool = numpy_pool()
    held_after_warm_up = []
    barrier = threading.Barrier(4)

    def worker(seed: int) -> None:
        barrier.wait()
        for i in range(500):
            nbytes = 4 * (1 + (seed * 31 + i * 7) % 20000)  # up to 80 000 bytes: two size classes
            out, _ = pool.lease(nbytes)
            view = out.view(np.float32)
            view[:] = i
            assert view[-1] == i  # nobody else wrote into this lease meanwhile
            if i == 100:
                held_after_warm_up.append(pool.nbytes)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.nbytes <= 4 * (1 << 17) + 4 * (1 << 16)  # at most one buffer per thread per size class
    assert pool.nbytes == max(held_after_warm_up)
    pool.close()
    assert pool.nbytes == 0
    pool = numpy_pool()
    late, _ = pool.lease(8)
    pool.close()
    assert pool.nbytes == 1 << 16  # still lent: an answer being sent keeps it
    del late
    assert pool.nbytes == 0  # dropped when it comes back


def test_torch_outputs_for_cupy_are_detached_and_host_ones_numpy(torch) -> None:
    """A torch output handed to a CuPy model's staging: DLPack refuses tensors that require grad, and
    neither numpy nor CuPy has bfloat16. On the host they become numpy (bf16 as its uint16 bits)."""
    graded = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_() * 2
    host = torch_for_cupy(torch, graded)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, rows(2) * 2)
    bf16 = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    bits = torch_for_cupy(torch, bf16)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, bf16.view(torch.uint16).numpy())


def test_floats_round_to_bf16_bits_as_torch_rounds_them(torch) -> None:
    """What a CuPy model's float output for a BF16 output becomes (numpy's code, run by CuPy there):
    torch's bfloat16 bits, ties to even, NaN kept, infinities and overflow to infinity included."""
    values = np.array(
        [0, -0.0, 1, -2.5, 0.15625, 1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, -np.inf, np.inf, 1e-40, np.nan],
        dtype=np.float32,
    )
    values = np.concatenate([values, np.random.default_rng(0).normal(0, 1e3, 2000).astype(np.float32)])
    bits = bf16_bits(values)
    assert bits.dtype == np.uint16
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.uint16).numpy()
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(bits[finite], expected[finite])
    assert torch.from_numpy(bits[~finite].copy()).view(torch.bfloat16).isnan().all()


def test_a_device_staged_model_runs_in_as_many_worker_threads_as_instances(torch) -> None:
    """Its staging waits on the device, so it never runs on the event loop; instance_group count batches
    run at once (two here: each batch waits at a barrier for the other)."""
    staging = DeviceStaging(config(module="torch"), "cpu")
    arrived = threading.Barrier(2, timeout=10)
    threads = set()

    def execute(batch: dict) -> dict:
        threads.add(threading.current_thread().name)
        arrived.wait()
        return {"z": batch["x"] * 2}

    executor = Executor(execute, label="model 'm' version 1", instances=2, staging=staging)
    assert executor.in_thread and not executor.inline

    async def two_batches() -> list:
        loop_thread = threading.current_thread().name
        first, second = [Job({"x": rows(1)})], [Job({"x": rows(2, 9)})]
        results = await asyncio.gather(executor.run(first), executor.run(second))
        assert loop_thread not in threads
        return results

    try:
        (first, *_), (second, *_) = asyncio.run(two_batches())
    finally:
        executor.close()
    assert len(threads) == 2 and all(name.startswith("execute") for name in threads)
    np.testing.assert_array_equal(first["z"], rows(1) * 2)
    np.testing.assert_array_equal(second["z"], rows(2, 9) * 2)


# ------------------------------------------------------------------------------------------------ GPU


def needs(module: str) -> list:
    """Marks for a test that runs on a real GPU: `gpu`, and a clean skip where `module` has no device."""
    ok = cuda_available() and (module == "torch" or cupy_available())
    return [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs {module} with a CUDA device")]


@pytest.mark.parametrize("module", [pytest.param(m, marks=needs(m)) for m in ("torch", "cupy")])
def test_gpu_make_staging_puts_kind_gpu_on_cuda(module: str) -> None:
    staging = make_staging(config(module=module, kind="KIND_GPU", gpus="gpus: [ 0 ]"))
    assert isinstance(staging, DeviceStaging)
    assert (staging.device, staging.array_module) == ("cuda:0", module)
    assert make_staging(config(module=module, kind="KIND_AUTO")).device == "cuda:0"
    assert make_staging(config(module=module, kind="KIND_CPU")).device == "cpu"
    with pytest.raises(ValueError, match="asks for GPU 999 but"):
        make_staging(config(module=module, kind="KIND_GPU", gpus="gpus: [ 999 ]"))
    with pytest.raises(ValueError, match="asks for GPU 999 but"):  # KIND_AUTO reads its gpus too
        make_staging(config(module=module, kind="KIND_AUTO", gpus="gpus: [ 999 ]"))


@pytest.mark.parametrize("module", [pytest.param(m, marks=needs(m)) for m in ("torch", "cupy")])
def test_gpu_gather_compute_to_host(module: str) -> None:
    staging = DeviceStaging(config(module=module), "cuda:0", module)
    for n in (1, 5, 64, 6000):  # 6000 rows outgrow the first pinned buffer
        parts = [rows(n), rows(3, -1)]
        batch = staging.gather("x", parts)
        assert type(batch).__module__.split(".")[0] == module
        assert str(batch.device) in ("cuda:0", "<CUDA Device 0>")
        host = staging.to_host({"z": batch * 3})["z"]
        assert isinstance(host, np.ndarray) and host.dtype == np.float32
        np.testing.assert_array_equal(host, np.concatenate(parts) * 3)
        single = staging.gather("y", [rows(n, 5, width=2)])  # one part: still copied to the device
        np.testing.assert_array_equal(staging.to_host({"z": single})["z"], rows(n, 5, width=2))


@pytest.mark.parametrize("module", [pytest.param("torch", marks=needs("torch"))])
def test_gpu_inputs_come_from_pinned_memory(module: str) -> None:
    staging = DeviceStaging(config(module=module), "cuda:0")
    staging.gather("x", [rows(2)])
    [lane] = staging._lanes
    assert lane.buffers["x"].handle.is_pinned()


@pytest.mark.parametrize("module", [pytest.param("cupy", marks=needs("cupy"))])
def test_gpu_torch_and_cupy_exchange_through_dlpack(module: str) -> None:
    import cupy
    import torch

    torch_staging = DeviceStaging(config(module="torch"), "cuda:0")
    host = torch_staging.to_host({"z": cupy.arange(6, dtype=cupy.float32).reshape(2, 3)})["z"]
    np.testing.assert_array_equal(host, rows(2))
    tensor = torch.arange(6, device="cuda:0", dtype=torch.float32).reshape(2, 3)
    cupy_staging = DeviceStaging(config(module="cupy"), "cuda:0", "cupy")
    np.testing.assert_array_equal(cupy_staging.to_host({"z": tensor})["z"], rows(2))


@pytest.mark.parametrize("module", [pytest.param("torch", marks=needs("torch"))])
def test_gpu_batches_from_instance_threads(module: str) -> None:
    import torch

    staging = DeviceStaging(config(module=module), "cuda:0")
    weight = torch.randn(3, 3, device="cuda:0", generator=torch.Generator("cuda:0").manual_seed(0))
    expected_weight = weight.cpu().numpy()
    failures: list[str] = []

    def worker(seed: int) -> None:  # one thread per instance, as the batcher runs them
        for i in range(100):
            parts = [rows(1 + (seed * 7 + i) % 64, seed * 1000 + i)]
            with torch.inference_mode():
                out = staging.gather("x", parts) @ weight
            host = staging.to_host({"z": out})["z"]
            expected = np.concatenate(parts) @ expected_weight
            if not np.allclose(host, expected, rtol=1e-3, atol=1e-1):
                failures.append(f"thread {seed} batch {i}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_parts_of_another_dtype_are_cast_or_refused_naming_the_input(torch) -> None:
    """INT32 in the config: INT64 parts are cast (the values, not their bytes reinterpreted), parts of
    mixed kinds become one batch, and floats for an integer input are our error, not torch's."""
    for staging in (TorchHostStaging(config(module="torch", dtype="TYPE_INT32")),
                    DeviceStaging(config(module="torch", dtype="TYPE_INT32"), "cpu")):  # fmt: skip
        wide = np.arange(6, dtype=np.int64).reshape(2, 3)
        batch = staging.gather("x", [wide])
        assert batch.dtype is torch.int32 and batch.tolist() == wide.tolist()
        mixed = staging.gather("x", [wide, np.full((1, 3), 7, dtype=np.int32)])
        assert mixed.dtype is torch.int32 and mixed.tolist() == [*wide.tolist(), [7, 7, 7]]
        with pytest.raises(InferError, match="input 'x' holds float32 data where the model expects INT32"):
            staging.gather("x", [np.ones((2, 3), dtype=np.float32)])
