"""The example TorchScript models (examples/model_repository/mlp, convnet) served end to end over v2 HTTP,
checked against the same TorchScript run here; and a server where torch cannot be imported."""

import functools
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    EXAMPLES,
    IDENTITY_MODEL,
    ServerProcess,
    assert_error,
    binary_body,
    int32_config,
    make_client,
    need_module,
    split_binary_response,
    write_model,
)

torch = need_module("torch", "the torch extra: pip install -e '.[torch]' (make test installs it)")
# `gpu` too: on a machine with CUDA the example models (KIND_AUTO) are served there, and `pytest -m gpu`
# runs these with the other GPU tests.
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")]
# The reference runs where the server runs the model. On CUDA another process may pick other cuDNN
# algorithms, and cuDNN's TF32 convolutions differ from FP32 by ~1e-3: the tolerance says so.
DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"
CLOSE = {"rtol": 1e-5, "atol": 1e-6} if DEVICE == "cpu" else {"rtol": 3e-3, "atol": 3e-4}

MODELS = {  # name: (input name, per-row input shape, output names)
    "mlp": ("INPUT0", (64,), ("OUTPUT0",)),
    "convnet": ("image", (3, 32, 32), ("logits", "probabilities")),
}


@functools.cache
def local_module(model: str) -> torch.jit.ScriptModule:
    return torch.jit.load(str(EXAMPLES / model / "1" / "model.pt"), map_location=DEVICE)


def local_outputs(model: str, batch: np.ndarray) -> dict[str, np.ndarray]:
    """What the committed TorchScript file computes for `batch`, run here on the server's device."""
    with torch.inference_mode():
        result = local_module(model)(torch.from_numpy(batch).to(DEVICE))
    results = result if isinstance(result, tuple) else (result,)
    return {name: t.cpu().numpy() for name, t in zip(MODELS[model][2], results, strict=True)}


def infer(client: httpx.Client, model: str, batch: np.ndarray) -> dict[str, np.ndarray]:
    """A binary-tensor-data request; every output asked for in binary."""
    name, _, outputs = MODELS[model]
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(batch.shape),
                "parameters": {"binary_data_size": batch.nbytes},
            }
        ],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }
    body, headers = binary_body(header, batch.tobytes())
    response = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    doc, raw = split_binary_response(response)
    assert [o["name"] for o in doc["outputs"]] == list(outputs)
    result = {}
    for output in doc["outputs"]:
        assert output["datatype"] == "FP32"
        result[output["name"]] = np.frombuffer(raw[output["name"]], dtype=np.float32).reshape(output["shape"])
    return result


def random_batch(model: str, rows: int, seed: int) -> np.ndarray:
    shape = (rows, *MODELS[model][1])
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


@pytest.mark.parametrize(
    ("model", "rows"), [("mlp", 1), ("mlp", 7), ("mlp", 64), ("convnet", 1), ("convnet", 32)]
)
def test_example_model_matches_torchscript_run_locally(client: httpx.Client, model: str, rows: int) -> None:
    batch = random_batch(model, rows, seed=rows)
    served = infer(client, model, batch)
    for name, expected in local_outputs(model, batch).items():
        assert served[name].shape == (rows, 10)
        np.testing.assert_allclose(served[name], expected, **CLOSE)
    if model == "convnet":
        np.testing.assert_allclose(served["probabilities"].sum(axis=1), 1.0, rtol=1e-5)


def test_mlp_over_json(client: httpx.Client) -> None:
    batch = random_batch("mlp", 3, seed=99)
    request = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3, 64], "data": batch.ravel().tolist()}]
    }
    response = client.post("/v2/models/mlp/infer", json=request)
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("OUTPUT0", "FP32", [3, 10])
    expected = local_outputs("mlp", batch)["OUTPUT0"]
    np.testing.assert_allclose(np.array(output["data"], dtype=np.float32).reshape(3, 10), expected, **CLOSE)


def test_example_models_metadata(client: httpx.Client) -> None:
    response = client.get("/v2/models/convnet")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "name": "convnet",
        "versions": ["1"],
        "platform": "pytorch_libtorch",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}],
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ],
    }


def test_concurrent_clients_each_get_their_own_rows(v2_server: ServerProcess) -> None:
    """Requests of different sizes at once (batched together by the server) each get their own answer."""
    sizes = [1 + (i * 5) % 9 for i in range(48)]
    batches = [random_batch("mlp", n, seed=1000 + i) for i, n in enumerate(sizes)]

    def one(i: int) -> None:
        with make_client(v2_server.base_url, "http1" if i % 2 else "http2") as c:
            served = infer(c, "mlp", batches[i])["OUTPUT0"]
        np.testing.assert_allclose(served, local_outputs("mlp", batches[i])["OUTPUT0"], **CLOSE)

    def counts() -> tuple[int, int]:
        with httpx.Client(base_url=v2_server.base_url) as c:
            (stats,) = c.get("/v2/models/mlp/stats").json()["model_stats"]
        return stats["inference_stats"]["success"]["count"], stats["execution_count"]

    requests_before, executions_before = counts()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(len(batches))))
    requests_after, executions_after = counts()
    assert requests_after - requests_before == len(batches)
    assert executions_after - executions_before < len(batches), "no two requests shared a batch"


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_model_returning_wrong_outputs_is_500_and_server_stays_up(start_server, repo: Path) -> None:
    directory = repo / "two_outputs"
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(
        'name: "two_outputs"\nbackend: "pytorch"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] },\n'
        '         { name: "b" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    torch.jit.save(torch.jit.script(Double()), str(directory / "1" / "model.pt"))  # one output, not two
    server = start_server(repo)
    with make_client(server.base_url, "http1") as c:
        request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        response = c.post("/v2/models/two_outputs/infer", json=request)
        assert_error(
            response, 500, "model 'two_outputs' returned 1 output(s) where its config lists 2 (a, b)"
        )
        assert c.get("/v2/health/live").status_code == 200


class TorchlessServer(ServerProcess):
    """A server in a Python where `import torch` fails, as where the torch extra is not installed."""

    @property
    def command(self) -> list[str]:
        code = (
            "import sys; sys.modules['torch'] = None; from tensorgate.server.cli import main; "
            "raise SystemExit(main())"
        )
        return [sys.executable, "-c", code, *super().command[3:]]


def test_server_without_torch_serves_the_other_models(tmp_path: Path, repo: Path) -> None:
    write_model(repo, "identity", int32_config("identity"), {1: IDENTITY_MODEL})
    shutil.copytree(EXAMPLES / "mlp", repo / "mlp")
    server = TorchlessServer(repo, tmp_path / "server.log").start()
    try:
        with make_client(server.base_url, "http1") as c:
            request = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [4, 5]}]}
            response = c.post("/v2/models/identity/infer", json=request)
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [4, 5]
            reason = (
                "the pytorch backend needs torch: torch is not installed (pip install 'tensorgate[torch]')"
            )
            request = {
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]
            }
            assert_error(c.post("/v2/models/mlp/infer", json=request), 503, reason)
            assert c.get("/v2/models/mlp/ready").status_code == 400
            assert c.get("/v2/health/ready").status_code == 400
        assert reason in server.log_text()
    finally:
        assert server.stop() == 0


def test_build_script_rebuilds_the_committed_models(tmp_path: Path) -> None:
    """examples/build_torch_models.py is deterministic: it writes again what the repository holds."""
    script = EXAMPLES.parent / "build_torch_models.py"
    done = subprocess.run(
        [sys.executable, str(script), "--repository", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for model in MODELS:
        built, committed = tmp_path / model, EXAMPLES / model
        assert (built / "config.pbtxt").read_text() == (committed / "config.pbtxt").read_text()
        new = torch.jit.load(str(built / "1" / "model.pt")).state_dict()
        old = torch.jit.load(str(committed / "1" / "model.pt"), map_location="cpu").state_dict()
        assert list(new) == list(old)
        assert all(torch.equal(new[k], old[k]) for k in old), model
