"""The response cache end to end (`--cache-config local,size=BYTES` and `response_cache { enable: true }`):
a repeated request is answered from the cache without the model or its batcher, over REST and gRPC
alike; keys follow the inputs and custom parameters; the cache is an LRU bounded in bytes; statistics
and Triton's nv_cache_* metrics count hits and misses; models that do not enable it, servers without
one, and decoupled models never use it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import ServerProcess, stop_all, write_model
from grpc_helpers import rest
from shm_helpers import rpc

import tensorgate.proto.inference as pb

# OUTPUT0 = INPUT0 * scale (a custom parameter); each execute appends its batch to executed.log.
COUNTING = """
from pathlib import Path

HERE = Path(__file__).parent

class Model:
    def execute(self, inputs, parameters):
        x = inputs["INPUT0"]
        with open(HERE / "executed.log", "a") as log:
            log.write(" ".join(str(v) for v in x[:, 0].tolist()) + "\\n")
        return {"OUTPUT0": x * parameters.get("scale", 1)}
"""
CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 64 ] } ]
dynamic_batching { }
%s
"""
ENABLED = "response_cache { enable: true }"
DECOUPLED = """
name: "decoupled_cached"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
response_cache { enable: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
DECOUPLED_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return None
"""
ENTRY_BYTES = 256 + 256  # an entry of one [1, 64] INT32 output, as server/response_cache.py counts it
CACHE_BYTES = 3 * ENTRY_BYTES + 100  # room for three


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cache") / "models"
    repo.mkdir()
    for name, extra in (("cached", ENABLED), ("lru", ENABLED), ("uncached", "")):
        write_model(repo, name, CONFIG % (name, extra), {1: COUNTING})
    write_model(repo, "decoupled_cached", DECOUPLED, {1: DECOUPLED_PY})
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    args = ("--cache-config", f"local,size={CACHE_BYTES}", "--strict-readiness", "false")
    process = ServerProcess(repo, repo.parent / "server.log", extra_args=args).start()
    yield process
    stop_all([process])


def executed(repo: Path, model: str) -> list[int]:
    log = repo / model / "1" / "executed.log"
    return [int(v) for line in log.read_text().splitlines() for v in line.split()] if log.exists() else []


def row(tag: int, scale: int = 1) -> list[int]:
    return [scale * v for v in [tag, *range(1, 64)]]


def infer(server: ServerProcess, model: str, tag: int, **parameters) -> list[int]:
    doc: dict = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 64], "data": row(tag)}]}
    if parameters:
        doc["parameters"] = parameters
    response = rest(server, "POST", f"/v2/models/{model}/infer", json=doc)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def grpc_infer(server: ServerProcess, model: str, tag: int) -> list[int]:
    request = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="INT32", shape=[1, 64])],
        raw_input_contents=[np.array(row(tag), "<i4").tobytes()],
    )
    return np.frombuffer(rpc(server, "model_infer", request).raw_output_contents[0], "<i4").tolist()


def stats(server: ServerProcess, model: str) -> dict:
    (entry,) = rest(server, "GET", f"/v2/models/{model}/stats").json()["model_stats"]
    return entry


def metric(server: ServerProcess, name: str, model: str) -> int | None:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    found = re.search(rf'^{name}{{model="{model}",version="1"}} (\d+)$', text, re.M)
    return int(found.group(1)) if found else None


def test_a_repeated_request_is_answered_from_the_cache_without_the_model(
    server: ServerProcess, repo: Path
) -> None:
    before = stats(server, "cached")
    assert infer(server, "cached", 100) == row(100)  # a miss: the model runs
    assert infer(server, "cached", 100) == row(100)  # a hit
    assert grpc_infer(server, "cached", 100) == row(100)  # the same request over gRPC: a hit
    assert executed(repo, "cached").count(100) == 1
    after = stats(server, "cached")
    count = {
        k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"]
        for k in ("success", "cache_hit", "cache_miss")
    }
    assert count == {"success": 3, "cache_hit": 2, "cache_miss": 1}
    assert after["inference_stats"]["cache_hit"]["ns"] > before["inference_stats"]["cache_hit"]["ns"]
    # as Triton counts them: a hit executes nothing and infers nothing
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 1


def test_the_key_follows_inputs_and_custom_parameters(server: ServerProcess, repo: Path) -> None:
    assert infer(server, "cached", 200) == row(200)
    assert infer(server, "cached", 200, scale=2) == row(200, 2)  # another parameter: a miss
    assert infer(server, "cached", 200, scale=2, priority=1) == row(200, 2)  # reserved ones: a hit
    assert infer(server, "cached", 201) == row(201)
    assert executed(repo, "cached").count(200) == 2 and executed(repo, "cached").count(201) == 1


def test_outputs_are_selected_and_classified_from_a_cached_answer(server: ServerProcess, repo: Path) -> None:
    before = stats(server, "cached")["inference_stats"]
    infer(server, "cached", 300)  # a miss: the model runs, its answer cached
    doc = {
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 64], "data": row(300)}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    (output,) = rest(server, "POST", "/v2/models/cached/infer", json=doc).json()["outputs"]
    assert output["data"] == ["300:0", "63:63"]
    # the second answer was the cached one: a hit, and the model ran once
    after = stats(server, "cached")["inference_stats"]
    hits, misses = (after[k]["count"] - before[k]["count"] for k in ("cache_hit", "cache_miss"))
    assert (hits, misses) == (1, 1)
    assert executed(repo, "cached").count(300) == 1


def test_the_cache_is_an_lru_bounded_in_bytes(server: ServerProcess, repo: Path) -> None:
    """Room for three entries (of every model): A, B, C; A again (a hit); D evicts B, the least recently
    used; B again is a miss, A still a hit."""
    for tag in (1, 2, 3, 1, 4, 2, 1):
        infer(server, "lru", tag)
    assert executed(repo, "lru") == [1, 2, 3, 4, 2]


def test_models_that_do_not_enable_it_always_run(server: ServerProcess, repo: Path) -> None:
    for _ in range(2):
        infer(server, "uncached", 7)
    assert executed(repo, "uncached").count(7) == 2
    assert stats(server, "uncached")["inference_stats"]["cache_hit"]["count"] == 0
    assert metric(server, "nv_cache_num_hits_per_model", "uncached") is None


def test_tritons_cache_metrics(server: ServerProcess) -> None:
    infer(server, "cached", 400)
    infer(server, "cached", 400)
    entry = stats(server, "cached")["inference_stats"]
    assert metric(server, "nv_cache_num_hits_per_model", "cached") == entry["cache_hit"]["count"]
    assert metric(server, "nv_cache_num_misses_per_model", "cached") == entry["cache_miss"]["count"]
    assert metric(server, "nv_cache_hit_duration_per_model", "cached") == entry["cache_hit"]["ns"] // 1000
    assert metric(server, "nv_cache_miss_duration_per_model", "cached") == entry["cache_miss"]["ns"] // 1000


def test_a_decoupled_model_may_not_enable_it(server: ServerProcess) -> None:
    (entry,) = [
        e for e in rest(server, "POST", "/v2/repository/index").json() if e["name"] == "decoupled_cached"
    ]
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "Response Cache does not currently support model decoupled_cached with 'decoupled'" in entry["reason"]
    )


def test_without_cache_config_no_model_is_cached(start_server, repo: Path) -> None:
    server = start_server(repo, extra_args=("--strict-readiness", "false"))
    before = executed(repo, "cached").count(500)
    for _ in range(2):
        infer(server, "cached", 500)
    assert executed(repo, "cached").count(500) == before + 2


def test_a_cache_config_the_server_cannot_use_stops_it(repo: Path, tmp_path: Path) -> None:
    process = ServerProcess(repo, tmp_path / "server.log", extra_args=("--cache-config", "redis,host=x"))
    with pytest.raises(RuntimeError, match="only the 'local' cache is implemented"):
        process.start()
