"""The models and readers the trace tests share: a small repository (a plain model, a batched one, an
ensemble, a BLS model and two stateful ones), and Triton's JSON trace files read back as
trace_summary.py reads them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from e2e_helpers import write_model

DOUBLE = """
class Model:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""
INC = """
class Model:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] + 1}
"""
BATCHED = """
name: "batched"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
dynamic_batching { }
"""
PIPE = """
name: "pipe"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "double" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "doubled" } },
  { model_name: "inc" model_version: -1 input_map { key: "INPUT0" value: "doubled" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""
# BLS: `double` called with the request's trace (a child trace), then `inc` without it (not traced).
BLS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            doubled = pb_utils.InferenceRequest(
                model_name="double", inputs=[x], requested_output_names=["OUTPUT0"], trace=request.trace()
            ).exec()
            y = pb_utils.Tensor("INPUT0", doubled.output_tensors()[0].as_numpy())
            names = ["OUTPUT0"]
            done = pb_utils.InferenceRequest(model_name="inc", inputs=[y], requested_output_names=names)
            done = done.exec()
            out = pb_utils.Tensor("OUTPUT0", done.output_tensors()[0].as_numpy())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
# A stateful model, through the sequence batcher's strategy named in its config.
SEQUENCED = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
sequence_batching {{ {strategy} {{ }} }}
"""
COMPUTE = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
ORDER = ["REQUEST_START", "QUEUE_START", *COMPUTE, "REQUEST_END"]


def int32_model(name: str, batch: int = 0) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
"""


def write_trace_repository(repo: Path) -> Path:
    write_model(repo, "double", int32_model("double"), {1: DOUBLE})
    write_model(repo, "inc", int32_model("inc"), {1: INC})
    write_model(repo, "batched", BATCHED, {1: DOUBLE})
    write_model(repo, "pipe", PIPE, {1: None})
    write_model(repo, "bls", int32_model("bls"), {1: BLS})
    for strategy in ("direct", "oldest"):
        write_model(repo, strategy, SEQUENCED.format(name=strategy, strategy=strategy), {1: DOUBLE})
    return repo


def infer(client: httpx.Client, model: str, values: list[int], **fields: object) -> list[int]:
    shape = [1, len(values)] if model in ("batched", "direct", "oldest") else [len(values)]
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": values}], **fields}
    response = client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def written_entries(path: Path, timeout: float = 10) -> list[dict]:
    """A trace file's entries, once the server has written it. A trace is written once its answer is out,
    so a client may have the answer a moment before (with --workers: until the worker's front-end
    timestamps reach the engine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(path.read_bytes())
        except (FileNotFoundError, json.JSONDecodeError):  # not yet, or being written
            assert time.monotonic() < deadline, f"{path} was never written"
            time.sleep(0.01)


def traces(path: Path) -> dict[int, dict]:
    """A Triton JSON trace file by trace id: its model entry's fields, `timestamps` (name -> ns, in the
    order written) and `tensors` (the activity entries)."""
    found: dict[int, dict] = {}
    for entry in written_entries(path):
        one = found.setdefault(entry["id"], {"timestamps": {}, "tensors": []})
        if "model_name" in entry:
            one.update({k: v for k, v in entry.items() if k != "id"})
        elif "timestamps" in entry:
            for stamp in entry["timestamps"]:
                one["timestamps"][stamp["name"]] = stamp["ns"]
        else:
            one["tensors"].append(entry)
    return found


def assert_in_order(trace: dict) -> None:
    """Triton's seven timestamps, each no earlier than the one before (the front end's, tested in
    test_e2e_trace_frontend.py, aside)."""
    stamps = {name: ns for name, ns in trace["timestamps"].items() if name in ORDER}
    assert list(stamps) == ORDER, list(trace["timestamps"])
    times = [stamps[name] for name in ORDER]
    assert times == sorted(times), stamps
