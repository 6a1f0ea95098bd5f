"""Models on a GPU, served end to end: a real server process on a repository built here, real httpx clients.

- `linear`: a TorchScript Linear (pytorch backend, KIND_GPU, 2 instances, dynamic batching), checked
  against the same file run here on the same device, and shown to batch;
- `py_torch`, `py_cupy`: python models with array_module torch / cupy on KIND_GPU, which check in execute
  that they get CUDA tensors / CuPy arrays on cuda:0 and run on a stream of their own;
- `sleepy`: a python model whose execute queues a ~0.3 s kernel: its infer time counts the kernel, and the
  server answers health checks meanwhile.

Every test is `gpu`: skipped cleanly without CUDA torch (or CuPy, for py_cupy); one server, started for
the first test that runs, serves them all.
"""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    ServerProcess,
    binary_body,
    make_client,
    split_binary_response,
    stop_all,
    wait_for_file,
    write_model,
)
from gpu_helpers import gpu_test
from test_staging import cupy_available, needs

from tensorgate.codec.datatypes import BY_NUMPY, BY_V2

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")  # torch 2.10+

CLIENTS = 16
# Cycles of the sleepy model's kernel (torch.cuda._sleep): ~0.3 s at an H100's ~2 GHz, longer when slower.
KERNEL_CYCLES = 600_000_000
KERNEL_AT_LEAST_NS = 150_000_000  # what each such kernel surely lasts (at most ~4 GHz)


# --------------------------------------------------------------------------------------------- models

GPU_GROUP = "instance_group [ {{ kind: KIND_GPU count: {count} gpus: [ 0 ] }} ]"

LINEAR_CONFIG = f"""
name: "linear"
backend: "pytorch"
max_batch_size: 64
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [
  {{ name: "y" data_type: TYPE_FP32 dims: [ 8 ] }},
  {{ name: "device" data_type: TYPE_INT64 dims: [ 1 ] }}
]
{GPU_GROUP.format(count=2)}
dynamic_batching {{ max_queue_delay_microseconds: 5000 }}
"""


def python_config(name: str, module: str, *, count: int = 2, batching: bool = True) -> str:
    policy = "dynamic_batching { max_queue_delay_microseconds: 5000 }" if batching else ""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{GPU_GROUP.format(count=count)}
{policy}
parameters {{ key: "array_module" value: {{ string_value: "{module}" }} }}
"""


# Each checks what it is handed (an AssertionError answers 500 with its message) and answers 2x + 1.
PY_TORCH_MODEL = """
import torch


class Model:
    def execute(self, inputs):
        x = inputs["x"]
        assert isinstance(x, torch.Tensor), f"got {type(x)}"
        assert x.device == torch.device("cuda:0"), f"got a tensor on {x.device}"
        assert x.dtype is torch.float32, f"got {x.dtype}"
        current = torch.cuda.current_stream()
        assert current.cuda_stream != torch.cuda.default_stream().cuda_stream, "on the default stream"
        return {"y": x * 2 + 1}
"""

PY_CUPY_MODEL = """
import cupy


class Model:
    def execute(self, inputs):
        x = inputs["x"]
        assert isinstance(x, cupy.ndarray), f"got {type(x)}"
        assert x.device.id == 0, f"got an array on device {x.device.id}"
        assert x.dtype == cupy.float32, f"got {x.dtype}"
        assert cupy.cuda.get_current_stream().ptr not in (0, 1, 2), "on a default stream"
        return {"y": x * 2 + 1}
"""

SLEEPY_MODEL = f"""
from pathlib import Path

import torch

HERE = Path(__file__).parent


class Model:
    def initialize(self, config):
        self.calls = 0

    def execute(self, inputs):
        torch.cuda._sleep({KERNEL_CYCLES})  # queued on this thread's stream; returns at once
        y = inputs["x"] + 1  # after it
        self.calls += 1
        (HERE / f"launched-{{self.calls}}").write_text("")
        return {{"y": y}}
"""


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on a repository of the models above (py_cupy only where CuPy has a device: its test is
    skipped elsewhere)."""
    from gpu_models.torch_modules import save_linear

    repository = tmp_path_factory.mktemp("gpu_models") / "models"
    repository.mkdir()
    (repository / "linear" / "1").mkdir(parents=True)
    (repository / "linear" / "config.pbtxt").write_text(LINEAR_CONFIG)
    save_linear(str(repository / "linear" / "1" / "model.pt"), 16, 8, seed=20260522)
    write_model(repository, "py_torch", python_config("py_torch", "torch"), {1: PY_TORCH_MODEL})
    if cupy_available():  # else it would not load, and the server would not be ready (strict readiness)
        write_model(repository, "py_cupy", python_config("py_cupy", "cupy"), {1: PY_CUPY_MODEL})
    sleepy = python_config("sleepy", "torch", count=1, batching=False)
    write_model(repository, "sleepy", sleepy, {1: SLEEPY_MODEL})
    server = ServerProcess(repository, repository.parent / "server.log").start(timeout=120)
    yield server
    stop_all([server])


# -------------------------------------------------------------------------------------------- helpers


def infer(client: httpx.Client, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict:
    """A binary-tensor-data request; the outputs asked for in binary, returned as numpy arrays."""
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": BY_NUMPY[array.dtype].v2,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": array.nbytes},
            }
            for name, array in inputs.items()
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    body, headers = binary_body(header, *(array.tobytes() for array in inputs.values()))
    response = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    doc, raw = split_binary_response(response)
    return {
        o["name"]: np.frombuffer(raw[o["name"]], dtype=BY_V2[o["datatype"]].numpy).reshape(o["shape"])
        for o in doc["outputs"]
    }


def model_stats(server: ServerProcess, model: str) -> dict:
    with httpx.Client(base_url=server.base_url, timeout=15) as c:
        response = c.get(f"/v2/models/{model}/stats")
        assert response.status_code == 200, response.text
        (stats,) = response.json()["model_stats"]
    return stats


def counts(server: ServerProcess, model: str) -> tuple[int, int, int]:
    """(requests answered, rows inferred, batches executed) so far."""
    stats = model_stats(server, model)
    return (
        stats["inference_stats"]["success"]["count"],
        stats["inference_count"],
        stats["execution_count"],
    )


def assert_ready(server: ServerProcess, model: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=15) as c:
        response = c.get(f"/v2/models/{model}/ready")
    assert response.status_code == 200, f"{model} is not ready:\n{server.log_text()[-5000:]}"


def concurrently(server: ServerProcess, model: str, batches: list[np.ndarray], outputs: list[str]) -> list:
    """Every batch as one request, from CLIENTS threads at once (HTTP/1.1 and HTTP/2 alternately)."""

    def one(i: int) -> dict:
        with make_client(server.base_url, "http1" if i % 2 else "http2") as c:
            return infer(c, model, {"x": batches[i]}, outputs)

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, range(len(batches))))


def random_batches(width: int, seed: int, count: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1 + i * 5 % 8, width), dtype=np.float32) for i in range(count)]


# ---------------------------------------------------------------------------------------------- tests


@gpu_test("torch")
def test_pytorch_model_on_the_gpu_batches_concurrent_clients(gpu_server: ServerProcess) -> None:
    import torch

    assert_ready(gpu_server, "linear")
    module = torch.jit.load(str(gpu_server.repository / "linear" / "1" / "model.pt"), map_location="cuda:0")
    batches = random_batches(16, seed=1)
    before = counts(gpu_server, "linear")
    served = concurrently(gpu_server, "linear", batches, ["y", "device"])
    after = counts(gpu_server, "linear")
    for batch, got in zip(batches, served, strict=True):
        with torch.inference_mode():
            y, device = module(torch.from_numpy(batch).to("cuda:0"))
        # The same FP32 Linear on the same device; the server runs rows in larger batches, which cuBLAS
        # may sum in another order: within a few float32 ulps of |y| ~ 1 (16 products a row).
        np.testing.assert_allclose(got["y"], y.cpu().numpy(), rtol=1e-5, atol=1e-5)
        assert got["device"].tolist() == device.cpu().tolist() == [[0]] * len(batch)  # cuda:0, not the CPU
    requests, rows, executions = (a - b for a, b in zip(after, before, strict=True))
    assert requests == len(batches)
    assert rows == sum(len(b) for b in batches)
    assert executions < rows, "statistics show no batching"
    assert executions < requests, "no two requests shared a batch"


@pytest.mark.parametrize("module", [pytest.param(m, marks=needs(m)) for m in ("torch", "cupy")])
def test_python_model_gets_device_arrays_under_concurrent_clients(
    gpu_server: ServerProcess, module: str
) -> None:
    """The model asserts what it receives (a failure answers 500 with its message, shown here)."""
    model = f"py_{module}"
    assert_ready(gpu_server, model)
    batches = random_batches(4, seed=2)
    before = counts(gpu_server, model)
    served = concurrently(gpu_server, model, batches, ["y"])
    after = counts(gpu_server, model)
    for batch, got in zip(batches, served, strict=True):
        np.testing.assert_array_equal(got["y"], batch * 2 + 1)  # float32 on both sides: exact
    assert after[0] - before[0] == len(batches)
    assert after[1] - before[1] == sum(len(b) for b in batches)


@gpu_test("torch")
def test_a_long_kernel_is_infer_time_and_the_server_stays_responsive(gpu_server: ServerProcess) -> None:
    """execute returns at once; the batcher's `staging.finished()` then waits for the kernel in the worker
    thread: compute_infer counts it (not compute_output, where to_host would wait for it otherwise), and
    the event loop answers health checks meanwhile."""
    assert_ready(gpu_server, "sleepy")
    version = gpu_server.repository / "sleepy" / "1"
    row = np.arange(4, dtype=np.float32).reshape(1, 4)
    with make_client(gpu_server.base_url, "http1") as c:  # first: the worker thread's setup is no part of it
        np.testing.assert_array_equal(infer(c, "sleepy", {"x": row}, ["y"])["y"], row + 1)

    def request() -> dict:
        with make_client(gpu_server.base_url, "http1") as c:
            return infer(c, "sleepy", {"x": row * 3}, ["y"])

    with make_client(gpu_server.base_url, "http1", timeout=5) as probe, ThreadPoolExecutor(1) as pool:
        assert probe.get("/v2/health/ready").status_code == 200  # connected before anything is timed
        running = pool.submit(request)
        wait_for_file(version / "launched-2")  # the kernel is queued; the worker waits for it
        took = []
        for _ in range(5):
            start = perf_counter()
            response = probe.get("/v2/health/ready")
            took.append(perf_counter() - start)
            assert response.status_code == 200, response.text
        still_running = not running.done()
        answer = running.result(timeout=30)
    assert still_running, "the request ended before the probes: nothing was measured while it ran"
    assert max(took) < 0.050, f"/v2/health/ready took {[round(t * 1000, 1) for t in took]} ms"
    np.testing.assert_array_equal(answer["y"], row * 3 + 1)

    inference = model_stats(gpu_server, "sleepy")["inference_stats"]
    assert inference["success"]["count"] == 2
    infer_ns, output_ns = inference["compute_infer"]["ns"], inference["compute_output"]["ns"]
    assert infer_ns >= 2 * KERNEL_AT_LEAST_NS, inference
    assert infer_ns > output_ns, inference
