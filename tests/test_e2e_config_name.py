"""--model-config-name (docs/models/repository.md): each model loads configs/<name>.pbtxt where it has one,
else its config.pbtxt, as Triton picks a custom config; without the flag, config.pbtxt."""

from __future__ import annotations

from pathlib import Path

import httpx
from e2e_helpers import ServerProcess, stop_all, write_model

CONFIG = """
name: "%s"
backend: "python"
max_batch_size: %d
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
IDENTITY = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"]}
"""


def max_batch_sizes(repo: Path, log: Path, *flags: str) -> dict[str, int]:
    server = ServerProcess(repo, log, extra_args=flags).start()
    try:
        return {
            name: httpx.get(f"{server.base_url}/v2/models/{name}/config", timeout=10).json()["max_batch_size"]
            for name in ("custom", "plain")
        }
    finally:
        stop_all([server])


def test_the_custom_config_where_a_model_has_one(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "custom", CONFIG % ("custom", 4), {1: IDENTITY})
    (repo / "custom" / "configs").mkdir()
    (repo / "custom" / "configs" / "h100.pbtxt").write_text(CONFIG % ("custom", 8))
    write_model(repo, "plain", CONFIG % ("plain", 2), {1: IDENTITY})
    named = max_batch_sizes(repo, tmp_path / "named.log", "--model-config-name", "h100")
    assert named == {"custom": 8, "plain": 2}  # plain has no configs/h100.pbtxt: its config.pbtxt
    assert max_batch_sizes(repo, tmp_path / "default.log") == {"custom": 4, "plain": 2}
