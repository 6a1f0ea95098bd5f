"""Ensembles (`platform: "ensemble"`): the example `classifier` (python -> ONNX -> python) over REST, gRPC
and TF Serving against a reference computed here; steps that run side by side; per-model statistics;
load-time errors naming the step and tensor; explicit mode loading the composing models with the
ensemble and `unload_dependents` unloading them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, assert_error, write_model
from grpc_helpers import call, tensor

import tensorgate.proto.inference as pb

RAW = np.arange(128, dtype=np.uint8).reshape(2, 64) * 2  # two rows of the classifier's input


def reference(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CLASS and PROBABILITIES as the three steps compute them, with onnxruntime run here."""
    features = (raw.astype(np.float32) / 127.5 - 1.0).astype(np.float32)
    session = onnxruntime.InferenceSession(str(EXAMPLES / "onnx_mlp" / "1" / "model.onnx"))
    (logits,) = session.run(None, {"INPUT0": features})
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return logits.argmax(axis=-1).reshape(-1, 1), shifted / shifted.sum(axis=-1, keepdims=True)


def statistics(server: ServerProcess, model: str) -> int:
    stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats").json()["model_stats"]
    return sum(s["inference_stats"]["success"]["count"] for s in stats)


def test_the_example_ensemble_over_rest(v2_server: ServerProcess) -> None:
    steps = ("classifier", "preprocess", "onnx_mlp", "postprocess")
    before = {model: statistics(v2_server, model) for model in steps}
    body = {"inputs": [{"name": "RAW", "datatype": "UINT8", "shape": [2, 64], "data": RAW.ravel().tolist()}]}
    response = httpx.post(f"{v2_server.base_url}/v2/models/classifier/infer", json=body, timeout=20)
    assert response.status_code == 200, response.text
    out = {o["name"]: o for o in response.json()["outputs"]}
    classes, probabilities = reference(RAW)
    assert out["CLASS"]["datatype"] == "INT64" and out["CLASS"]["shape"] == [2, 1]
    assert out["CLASS"]["data"] == classes.ravel().tolist()
    assert out["PROBABILITIES"]["shape"] == [2, 10]
    np.testing.assert_allclose(out["PROBABILITIES"]["data"], probabilities.ravel(), rtol=1e-5, atol=1e-7)
    # the ensemble and every step it ran count the request, each in its own statistics
    assert {model: statistics(v2_server, model) - before[model] for model in steps} == dict.fromkeys(steps, 1)


def test_the_example_ensemble_over_grpc(v2_server: ServerProcess) -> None:
    request = pb.ModelInferRequest(
        model_name="classifier",
        inputs=[tensor("RAW", "UINT8", [2, 64])],
        outputs=[pb.ModelInferRequestInferRequestedOutputTensor(name="CLASS")],
        raw_input_contents=[RAW.tobytes()],
    )
    response = call(v2_server, lambda stub: stub.model_infer(request, timeout=20))
    assert [o.name for o in response.outputs] == ["CLASS"]
    classes, _ = reference(RAW)
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == classes.ravel().tolist()


def test_the_example_ensemble_over_tfserving_predict(v2_server: ServerProcess) -> None:
    body = {"instances": [{"RAW": row.tolist()} for row in RAW]}
    response = httpx.post(f"{v2_server.base_url}/v1/models/classifier:predict", json=body, timeout=20)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    classes, probabilities = reference(RAW)
    assert [p["CLASS"] for p in predictions] == classes.tolist()
    np.testing.assert_allclose([p["PROBABILITIES"] for p in predictions], probabilities, rtol=1e-5, atol=1e-7)


def test_a_step_error_names_the_ensemble_and_the_step(v2_server: ServerProcess) -> None:
    body = {"inputs": [{"name": "RAW", "datatype": "UINT8", "shape": [65, 64], "data": [0] * 65 * 64}]}
    response = httpx.post(f"{v2_server.base_url}/v2/models/classifier/infer", json=body, timeout=20)
    assert_error(response, 400, "inference request batch-size must be <= 64 for 'classifier'")
    body = {"inputs": [{"name": "RAW", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
    response = httpx.post(f"{v2_server.base_url}/v2/models/classifier/infer", json=body, timeout=20)
    assert_error(
        response, 400, "inference input 'RAW' data-type is 'FP32', but model 'classifier' expects 'UINT8'"
    )


# ------------------------------------------------------------------------------------ graphs of steps

TWO_INT32 = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
"""
# Waits (up to 10 s) until its sibling step has started too: two such steps in one ensemble answer only
# when they run side by side, and fail when run one after the other.
RENDEZVOUS = """
import asyncio, pathlib

class Model:
    def initialize(self, config):
        self.mine = pathlib.Path(config["parameters"]["mine"]["string_value"])
        self.other = pathlib.Path(config["parameters"]["other"]["string_value"])

    async def execute(self, inputs):
        self.mine.touch()
        for _ in range(1000):
            if self.other.exists():
                return {{"OUT": inputs["IN"] + {add}}}
            await asyncio.sleep(0.01)
        raise RuntimeError("the sibling step never started")
"""
SUM = """
class Model:
    def execute(self, inputs):
        return {"OUT": inputs["A"] + inputs["B"]}
"""
DIAMOND = """
name: "diamond"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  {
    model_name: "join" model_version: -1
    input_map { key: "A" value: "left" } input_map { key: "B" value: "right" }
    output_map { key: "OUT" value: "Y" }
  },
  {
    model_name: "left" model_version: 1
    input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "left" }
  },
  {
    model_name: "right" model_version: -1
    input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "right" }
  }
] }
"""


def write_diamond(repo: Path, markers: Path) -> None:
    for name, other, add in (("left", "right", 10), ("right", "left", 100)):
        parameters = (
            f'parameters {{ key: "mine" value: {{ string_value: "{markers / name}" }} }}\n'
            f'parameters {{ key: "other" value: {{ string_value: "{markers / other}" }} }}\n'
        )
        write_model(repo, name, TWO_INT32.format(name=name) + parameters, {1: RENDEZVOUS.format(add=add)})
    two_inputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 2 ] }}' for n in "AB")
    join = TWO_INT32.format(name="join").replace(
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]', f"input [ {two_inputs} ]"
    )
    write_model(repo, "join", join, {1: SUM})
    write_model(repo, "diamond", DIAMOND, {1: None})


def test_steps_whose_inputs_exist_run_side_by_side(start_server, repo: Path, tmp_path: Path) -> None:
    write_diamond(repo, tmp_path)
    server = start_server(repo)
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
    response = httpx.post(f"{server.base_url}/v2/models/diamond/infer", json=body, timeout=20)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [(1 + 10) + (1 + 100), (2 + 10) + (2 + 100)]


# ------------------------------------------------------------------------------------ load-time checks

IDENTITY = """
name: "ident"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
IDENTITY_PY = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': inputs['INPUT0']}\n"


def ensemble(name: str, steps: str, *, batch: int = 8, in_type: str = "TYPE_FP32", out: str = "OUT") -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {batch}
input [ {{ name: "IN" data_type: {in_type} dims: [ 2 ] }} ]
output [ {{ name: "{out}" data_type: TYPE_FP32 dims: [ 2 ] }} ]
ensemble_scheduling {{ step [ {steps} ] }}
"""


def step(model: str = "ident", source: str = "IN", target: str = "OUT", model_input: str = "INPUT0") -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{model_input}" value: "{source}" }} '
        f'output_map {{ key: "OUTPUT0" value: "{target}" }} }}'
    )


BAD_ENSEMBLES = {
    "unknown_model": (
        ensemble("unknown_model", step(model="nope")),
        "step 0 (model 'nope'): the model is not ready",
    ),
    "unknown_input": (
        ensemble("unknown_input", step(model_input="BOGUS")),
        "step 0 (model 'ident'): input_map names input 'BOGUS', which the model does not have (it has: "
        "INPUT0)",
    ),
    "wrong_type": (
        ensemble("wrong_type", step(), in_type="TYPE_INT32"),
        "step 0 (model 'ident'): input 'INPUT0' is FP32 but tensor 'IN' (an ensemble input) is INT32",
    ),
    "not_produced": (
        ensemble("not_produced", step(target="elsewhere")),
        "no step produces the ensemble output 'OUT'",
    ),
    "dangling": (
        ensemble("dangling", step(source="ghost")),
        "step 0 (model 'ident'): input 'INPUT0' reads tensor 'ghost', which is neither an ensemble input",
    ),
    "cycle": (
        ensemble(
            "cycle",
            step(source="b", target="a") + ", " + step(source="a", target="b") + ", " + step(source="b"),
        ),
        "can never run: their inputs form a cycle",
    ),
    "too_big": (
        ensemble("too_big", step(), batch=16),
        "the ensemble's max_batch_size 16 is over the model's (8)",
    ),
    "twice": (
        ensemble("twice", step() + ", " + step()),
        "step 1 (model 'ident'): tensor 'OUT' is already produced by step 0 (model 'ident')",
    ),
}


def test_an_ensemble_that_does_not_hold_together_fails_its_load(start_server, repo: Path) -> None:
    write_model(repo, "ident", IDENTITY, {1: IDENTITY_PY})
    for name, (config, _) in BAD_ENSEMBLES.items():
        write_model(repo, name, config, {1: None})
    server = start_server(repo)
    index = {e["name"]: e for e in httpx.post(f"{server.base_url}/v2/repository/index").json()}
    assert index["ident"]["state"] == "READY"
    for name, (_, message) in BAD_ENSEMBLES.items():
        assert index[name]["state"] == "UNAVAILABLE", name
        assert f"ensemble '{name}'" in index[name]["reason"] and message in index[name]["reason"], (
            name,
            index[name]["reason"],
        )


# ------------------------------------------------------------------------------------- explicit mode


def state(server: ServerProcess) -> dict[str, str]:
    return {
        e["name"]: e.get("state", "") for e in httpx.post(f"{server.base_url}/v2/repository/index").json()
    }


def test_explicit_mode_loads_composing_models_and_unload_dependents_unloads_them(
    start_server, repo: Path
) -> None:
    write_model(repo, "ident", IDENTITY, {1: IDENTITY_PY})
    write_model(repo, "chain", ensemble("chain", step(target="mid") + ", " + step(source="mid")), {1: None})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit"))
    assert state(server) == {"chain": "", "ident": ""}
    base = server.base_url
    assert httpx.post(f"{base}/v2/repository/models/chain/load", timeout=20).status_code == 200
    assert state(server) == {"chain": "READY", "ident": "READY"}
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]}
    assert httpx.post(f"{base}/v2/models/chain/infer", json=body).json()["outputs"][0]["data"] == [1.5, 2.5]
    # without unload_dependents the composing model stays; with it, it goes too
    assert httpx.post(f"{base}/v2/repository/models/chain/unload").status_code == 200
    assert state(server) == {"chain": "UNAVAILABLE", "ident": "READY"}
    assert httpx.post(f"{base}/v2/repository/models/chain/load", timeout=20).status_code == 200
    unload = {"parameters": {"unload_dependents": True}}
    assert httpx.post(f"{base}/v2/repository/models/chain/unload", json=unload).status_code == 200
    assert state(server) == {"chain": "UNAVAILABLE", "ident": "UNAVAILABLE"}
    # a request to the ensemble now says so
    assert_error(
        httpx.post(f"{base}/v2/models/chain/infer", json=body), 503, "'chain' has no available versions"
    )


def test_concurrent_ensemble_requests_batch_at_each_step(start_server, repo: Path) -> None:
    """The steps' dynamic batchers see the ensemble's requests: fewer executions than requests."""
    write_model(
        repo,
        "ident",
        IDENTITY + "dynamic_batching { max_queue_delay_microseconds: 100000 }",
        {1: IDENTITY_PY},
    )
    write_model(repo, "chain", ensemble("chain", step()), {1: None})
    server = start_server(repo)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=20) as client:
            bodies = [
                {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [float(i), 0.5]}]}
                for i in range(8)
            ]
            return await asyncio.gather(*(client.post("/v2/models/chain/infer", json=b) for b in bodies))

    responses = asyncio.run(burst())
    assert [r.json()["outputs"][0]["data"] for r in responses] == [[float(i), 0.5] for i in range(8)]
    stats = httpx.get(f"{server.base_url}/v2/models/ident/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 8 and stats["execution_count"] < 8


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_ensembles_load_after_their_steps_in_every_mode(start_server, repo: Path, mode: str) -> None:
    write_model(repo, "chain", ensemble("chain", step()), {1: None})  # listed before "ident"
    write_model(repo, "ident", IDENTITY, {1: IDENTITY_PY})
    server = start_server(repo, extra_args=("--model-control-mode", mode))
    assert state(server) == {"chain": "READY", "ident": "READY"}


PRODUCER = """
import sys
import numpy as np

class Model:
    def execute(self, inputs):
        out = np.ascontiguousarray(inputs["INPUT0"] * 2)
        sys.tensorgate_probe = out  # what the next step must receive, not a copy of it
        return {"OUTPUT0": out}
"""
CONSUMER = """
import sys
import numpy as np

class Model:
    def execute(self, inputs):
        shared = np.shares_memory(inputs["INPUT0"], sys.tensorgate_probe)
        return {"OUTPUT0": inputs["INPUT0"] + (1.0 if shared else 1000.0)}
"""


def test_tensors_pass_between_steps_without_copies(start_server, repo: Path) -> None:
    for name, code in (("producer", PRODUCER), ("consumer", CONSUMER)):
        write_model(repo, name, IDENTITY.replace('"ident"', f'"{name}"'), {1: code})
    steps = step("producer", target="doubled") + ", " + step("consumer", source="doubled")
    write_model(repo, "pair", ensemble("pair", steps), {1: None})
    server = start_server(repo)
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    response = httpx.post(f"{server.base_url}/v2/models/pair/infer", json=body, timeout=20)
    assert response.json()["outputs"][0]["data"] == [3.0, 5.0]  # +1: the consumer saw the producer's array
