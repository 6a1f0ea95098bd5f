"""Config fields are never silently ignored (docs/models/config-fields.md, server/config_fields.py): a
refused field fails its model's load with the reason in the repository index, a warned one loads and logs
its warning once; instance groups place their instances as listed; a folder without a config loads when
its backend completes one, and fails its load with --disable-auto-complete-config."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ROOT, ServerProcess, stop_all, write_model

from tensorgate.server.config_fields import FIELDS, REFUSED, WARNED, markdown_table

IDENTITY = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"]}
"""


def config(name: str, extra: str = "") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{extra}
"""


REFUSED_MODELS = {
    "batch_output": (
        'batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]',
        "batch_output is not supported: batch outputs are not implemented",
    ),
    "model_operations": (
        'model_operations { op_library_filename: "libcustom.so" }',
        "model_operations is not supported: custom operation libraries are not loaded",
    ),
    "strategy_parameter": (
        "dynamic_batching { }\n"
        'parameters { key: "TRITON_BATCH_STRATEGY_PATH" value: { string_value: "/s" } }',
        "parameters.TRITON_BATCH_STRATEGY_PATH is not supported: custom batching strategies",
    ),
    "strategy_file": (
        "dynamic_batching { }",
        "batchstrategy.so is not supported: custom batching strategies",
    ),
}
WARNED_EXTRA = """
runtime: "model.py"
optimization { input_pinned_memory { enable: true } }
metric_tags { key: "team" value: "search" }
cc_model_filenames { key: "8.0" value: "model_a100.py" }
made_up_field: 3
"""
WARNINGS = [
    "model 'warned': runtime is set but not used",
    "model 'warned': optimization is set but not used",
    "model 'warned': metric_tags is set but not used",
    "model 'warned': cc_model_filenames is set but not used",
    "model 'warned': unknown config field 'made_up_field' is ignored",
]

# initialize writes its args' kind and device into a file of PLACED (one per instance)
PLACED_PY = """
import json, os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        here = os.environ["PLACED"]
        mine = [args["model_instance_kind"], args["model_instance_device_id"]]
        with open(os.path.join(here, str(os.getpid())), "w") as f:
            json.dump(mine, f)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                .as_numpy())]) for r in requests]
"""
PLACED_GROUPS = """
instance_group [
  { name: "host" kind: KIND_CPU count: 2 },
  { name: "cards" kind: KIND_GPU count: 1 gpus: [ 1, 3 ] }
]
"""

AUTO_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy() * 10)]) for r in requests]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("config-fields") / "models"
    for name, (extra, _) in REFUSED_MODELS.items():
        write_model(repo, name, config(name, extra), {1: IDENTITY})
    (repo / "strategy_file" / "1" / "batchstrategy.so").write_bytes(b"\x7fELF")
    write_model(repo, "warned", config("warned", WARNED_EXTRA), {1: IDENTITY})
    write_model(repo, "placed", config("placed", PLACED_GROUPS), {1: PLACED_PY})
    for name in ("onnx_auto", "python_auto"):
        (repo / name / "1").mkdir(parents=True)
    shutil.copy(ROOT / "examples/model_repository/onnx_mlp/1/model.onnx", repo / "onnx_auto/1/model.onnx")
    (repo / "python_auto" / "1" / "model.py").write_text(AUTO_PY)
    return repo


@pytest.fixture(scope="module")
def placed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("placed")


@pytest.fixture(scope="module")
def server(repo: Path, placed_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("log") / "server.log"
    env = {**os.environ, "PLACED": str(placed_dir)}
    server = ServerProcess(repo, log, env=env).start()
    yield server
    stop_all([server])


def index(server: ServerProcess) -> dict[str, dict]:
    entries = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    return {e["name"]: e for e in entries}


def ready(server: ServerProcess, model: str) -> bool:
    return httpx.get(f"{server.base_url}/v2/models/{model}/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("model", sorted(REFUSED_MODELS))
def test_a_refused_field_fails_the_load_with_its_reason(server: ServerProcess, model: str) -> None:
    entry = index(server)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert REFUSED_MODELS[model][1] in entry["reason"], entry["reason"]
    assert not ready(server, model)


def test_warned_fields_load_and_are_logged_once(server: ServerProcess) -> None:
    assert ready(server, "warned")
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [2.5]}]}
    answer = httpx.post(f"{server.base_url}/v2/models/warned/infer", json=body, timeout=10)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2.5]
    log = server.log_text()
    for warning in WARNINGS:
        assert log.count(warning) == 1, warning


def test_each_instance_group_places_its_instances(server: ServerProcess, placed_dir: Path) -> None:
    assert ready(server, "placed")
    placed = sorted(tuple(json.loads(p.read_text())) for p in placed_dir.iterdir())
    # 2 on the host; the GPU group's one instance on each GPU it lists (Triton's count per device)
    assert placed == [("CPU", "0"), ("CPU", "0"), ("GPU", "1"), ("GPU", "3")]


def test_a_folder_with_only_an_onnx_file_loads_and_serves(server: ServerProcess) -> None:
    assert ready(server, "onnx_auto")
    cfg = httpx.get(f"{server.base_url}/v2/models/onnx_auto/config", timeout=10).json()
    assert cfg["platform"] == "onnxruntime_onnx" and [t["name"] for t in cfg["input"]] == ["INPUT0"]
    shape = ([1] if cfg["max_batch_size"] else []) + cfg["input"][0]["dims"]
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": [0.5] * 64}]}
    answer = httpx.post(f"{server.base_url}/v2/models/onnx_auto/infer", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["outputs"][0]["data"]) == 10


def test_a_folder_with_only_a_model_py_completing_its_config_loads_and_serves(server: ServerProcess) -> None:
    assert ready(server, "python_auto")
    cfg = httpx.get(f"{server.base_url}/v2/models/python_auto/config", timeout=10).json()
    assert cfg["backend"] == "python" and cfg["max_batch_size"] == 8
    body = {"inputs": [{"name": "IN", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}
    answer = httpx.post(f"{server.base_url}/v2/models/python_auto/infer", json=body, timeout=10)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [10, 20]


@pytest.mark.parametrize("flags", [("--disable-auto-complete-config",), ("--strict-model-config", "true")])
def test_a_folder_without_config_fails_without_auto_complete(repo: Path, tmp_path: Path, flags) -> None:
    server = ServerProcess(repo, tmp_path / "strict.log", extra_args=flags).start()
    try:
        entries = index(server)
        for model in ("onnx_auto", "python_auto"):
            assert entries[model]["state"] == "UNAVAILABLE"
            assert "failed to open text file for read" in entries[model]["reason"]
            assert not ready(server, model)
        assert ready(server, "warned")  # a model with its config loads as before
    finally:
        stop_all([server])


def test_the_docs_page_lists_every_field() -> None:
    page = (ROOT / "docs/models/config-fields.md").read_text()
    assert markdown_table() in page
    assert {f.status for f in FIELDS} == {"implemented", WARNED, REFUSED}
