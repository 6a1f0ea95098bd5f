"""Triton's repository flags (docs/models/repository.md):
- --model-config-name: each model loads configs/<name>.pbtxt where it has one, else its config.pbtxt, as
  Triton picks a custom config; without the flag, config.pbtxt;
- --model-load-thread-count: how many models load at once, at most."""

from __future__ import annotations

import os
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


# initialize writes enter-<name>, waits (at most 1.5 s) for the other model to enter too, then exit-<name>;
# how many loaded at once = the enters at its exit less the exits at its entry
GATHERING = """
import os, time

class Model:
    def initialize(self, config):
        here, name = os.environ["LOAD_MARKS"], config["name"]
        count = lambda kind: len([f for f in os.listdir(here) if f.startswith(kind)])
        exits_before = count("exit-")
        open(os.path.join(here, "enter-" + name), "w").close()
        deadline = time.monotonic() + 1.5
        while count("enter-") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        open(os.path.join(here, "seen-" + name), "w").write(str(count("enter-") - exits_before))
        open(os.path.join(here, "exit-" + name), "w").close()

    def execute(self, inputs):
        return {"y": inputs["x"]}
"""


def loaded_at_once(tmp_path: Path, threads: int) -> list[int]:
    repo, marks = tmp_path / f"models-{threads}", tmp_path / f"marks-{threads}"
    marks.mkdir()
    for name in ("first", "second"):
        write_model(repo, name, CONFIG % (name, 4), {1: GATHERING})
    env = {**os.environ, "LOAD_MARKS": str(marks)}
    flags = ("--model-load-thread-count", str(threads))
    server = ServerProcess(repo, tmp_path / f"{threads}.log", extra_args=flags, env=env).start()
    stop_all([server])
    return sorted(int((marks / f"seen-{name}").read_text()) for name in ("first", "second"))


def test_model_load_thread_count_bounds_the_loads_at_once(tmp_path: Path) -> None:
    assert loaded_at_once(tmp_path, 1) == [1, 1]  # one at a time: neither saw the other loading
    assert loaded_at_once(tmp_path, 2) == [2, 2]


NO_BACKEND = """
name: "completed"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def loads_without_backend(tmp_path: Path, *flags: str) -> tuple[bool, str]:
    """Whether a config naming no backend loads (completed from its model.py), and the index's reason."""
    repo = tmp_path / f"models{len(flags)}{flags[-1] if flags else ''}"
    write_model(repo, "completed", NO_BACKEND, {1: IDENTITY})
    server = ServerProcess(repo, tmp_path / f"{repo.name}.log", extra_args=flags).start()
    try:
        ready = httpx.get(f"{server.base_url}/v2/models/completed/ready", timeout=10).status_code == 200
        (entry,) = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
        return ready, entry.get("reason", "")
    finally:
        stop_all([server])


def test_disable_auto_complete_config_uses_configs_as_written(tmp_path: Path) -> None:
    assert loads_without_backend(tmp_path) == (True, "")  # completed: model.py tells the python backend
    for flags in (("--disable-auto-complete-config",), ("--strict-model-config", "true")):
        ready, reason = loads_without_backend(tmp_path, *flags)
        assert not ready and "must specify 'backend' or 'platform'" in reason, reason
    assert loads_without_backend(tmp_path, "--strict-model-config", "false") == (True, "")
