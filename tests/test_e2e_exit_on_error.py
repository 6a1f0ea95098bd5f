"""--exit-on-error (Triton's flag): true exits when anything fails at startup; false (our default) serves
the models that loaded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from e2e_helpers import IDENTITY_MODEL, ROOT, ServerProcess, int32_config, write_model

BROKEN = "raise RuntimeError('this model is broken')\n"


@pytest.fixture
def half_broken(repo: Path) -> Path:
    write_model(repo, "good", int32_config("good"), {1: IDENTITY_MODEL})
    write_model(repo, "broken", int32_config("broken"), {1: BROKEN})
    return repo


def exits(repository: Path, log: Path, *flags: str) -> tuple[int, str]:
    """Runs a server that should not start: its exit status and log."""
    command = ServerProcess(repository, log, extra_args=flags).command
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_exit_on_error_true_exits_when_a_model_fails_to_load(half_broken: Path, tmp_path: Path) -> None:
    code, log = exits(half_broken, tmp_path / "server.log", "--exit-on-error", "true")
    assert code == 1
    assert "failed to load 'broken' version 1" in log and "this model is broken" in log
    assert "error: creating server: Internal - failed to load all models" in log
    assert "HTTP listening" not in log


@pytest.mark.parametrize("flags", [(), ("--exit-on-error", "false")], ids=["default", "false"])
def test_exit_on_error_false_serves_the_models_that_loaded(
    start_server, half_broken: Path, flags: tuple[str, ...]
) -> None:
    server = start_server(half_broken, extra_args=flags)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [3, 4]}]}
        response = c.post("/v2/models/good/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [3, 4]
        assert c.get("/v2/models/broken/ready").status_code == 400
    assert "this model is broken" in server.log_text()


def test_exit_on_error_true_starts_when_everything_loads(start_server, repo: Path) -> None:
    write_model(repo, "good", int32_config("good"), {1: IDENTITY_MODEL})
    server = start_server(repo, extra_args=("--exit-on-error", "true"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert c.get("/v2/health/ready").status_code == 200


def test_exit_on_error_true_exits_on_a_startup_model_that_is_not_there(repo: Path, tmp_path: Path) -> None:
    write_model(repo, "good", int32_config("good"), {1: IDENTITY_MODEL})
    explicit = ("--model-control-mode", "explicit", "--load-model", "absent", "--exit-on-error", "true")
    code, log = exits(repo, tmp_path / "server.log", *explicit)
    assert code == 1
    assert "failed to load 'absent': no model folder 'absent' in the model repository" in log
