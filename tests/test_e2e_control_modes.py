"""Model control modes (none, explicit, poll) and strict readiness, end to end."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ROOT, assert_error, int32_config, write_model

REFUSED = "explicit model load / unload is not allowed"
POLL = ("--model-control-mode", "poll", "--repository-poll-secs", "0.1")


def versioned_model(version: int) -> str:
    return f"""
class Model:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] + {100 * version}}}
"""


BROKEN_MODEL = "raise RuntimeError('this version is broken')\n"


def infer(client: httpx.Client, model: str, values: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}
    return client.post(f"/v2/models/{model}/infer", json=body)


def index(client: httpx.Client) -> list[dict]:
    response = client.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    return response.json()


def states(client: httpx.Client, model: str) -> list[tuple[str, str]]:
    return [(e.get("version", ""), e.get("state", "")) for e in index(client) if e["name"] == model]


def wait_for(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Polls `check` until it holds: poll mode applies changes on its own schedule."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def served_by(client: httpx.Client, model: str) -> int | None:
    """What the model adds to 0 (100 * the version that answered), or None when it does not answer."""
    response = infer(client, model, [0])
    return response.json()["outputs"][0]["data"][0] if response.status_code == 200 else None


def build_outside(tmp_path: Path, name: str, versions: dict[int, str], *, policy: str = "") -> Path:
    """A complete model folder built beside the repository, to be moved in at once (poll mode may look
    at any moment; a rename is atomic)."""
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    return write_model(staging, name, int32_config(name, policy=policy), versions)


def replace_text(path: Path, text: str) -> None:
    """Rewrites a file at once (poll mode skips hidden files such as the temporary one)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def ready_status(client: httpx.Client) -> int:
    return client.get("/v2/health/ready").status_code


# ------------------------------------------------------------------------------------------ none


def test_none_mode_loads_everything_and_refuses_load_unload(start_server, repo: Path) -> None:
    write_model(repo, "one", int32_config("one"), {1: versioned_model(1)})
    write_model(repo, "two", int32_config("two"), {1: versioned_model(1)})
    server = start_server(repo)  # none is the default
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert [(e["name"], e["state"]) for e in index(c)] == [("one", "READY"), ("two", "READY")]
        for action in ("load", "unload"):
            response = c.post(f"/v2/repository/models/one/{action}")
            assert_error(response, 503, REFUSED, "none")
        assert served_by(c, "one") == 100, "a refused unload unloaded the model"
        # Changes on disk are not picked up.
        write_model(repo, "three", int32_config("three"), {1: versioned_model(1)})
        assert [e["name"] for e in index(c)] == ["one", "three", "two"]
        assert states(c, "three") == [("", "")]
        assert_error(infer(c, "three", [0]), 404, "three")


# ------------------------------------------------------------------------------------------ explicit


def test_explicit_mode_loads_only_the_named_models(start_server, repo: Path) -> None:
    for name in ("one", "two", "three"):
        write_model(repo, name, int32_config(name), {1: versioned_model(1)})
    args = ("--model-control-mode", "EXPLICIT", "--load-model", "one", "--load-model", "three")
    server = start_server(repo, extra_args=(*args, "--load-model", "missing"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert states(c, "one") == [("1", "READY")]
        assert states(c, "two") == [("", "")]
        assert states(c, "three") == [("1", "READY")]
        assert_error(infer(c, "two", [0]), 404, "two")
        assert ready_status(c) == 200, "models never loaded do not count for readiness"
        response = c.post("/v2/repository/models/two/load")
        assert (response.status_code, response.content) == (200, b"")
        assert served_by(c, "two") == 100
    assert "failed to load 'missing'" in server.log_text()


def test_explicit_mode_star_loads_everything(start_server, repo: Path) -> None:
    for name in ("one", "two"):
        write_model(repo, name, int32_config(name), {1: versioned_model(1)})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit", "--load-model", "*"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert [(e["name"], e["state"]) for e in index(c)] == [("one", "READY"), ("two", "READY")]


def test_explicit_mode_with_nothing_loaded_is_ready(start_server, repo: Path) -> None:
    write_model(repo, "one", int32_config("one"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert index(c) == [{"name": "one"}]
        assert ready_status(c) == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model-control-mode", "explicit", "--load-model", "*", "--load-model", "one"), "ONLY"),
        (("--model-control-mode", "poll", "--repository-poll-secs", "0"), "repository-poll-secs"),
        (("--model-control-mode", "sometimes"), "model-control-mode"),
        (("--strict-readiness", "maybe"), "strict-readiness"),
    ],
)
def test_bad_control_flags_exit_2(repo: Path, args: tuple[str, ...], message: str) -> None:
    command = [sys.executable, "-m", "tensorgate.server", "serve", "--model-repository", str(repo)]
    command += ["--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"]
    done = subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done
    assert message in done.stderr


# ------------------------------------------------------------------------------------------ poll


def test_poll_mode_applies_repository_changes(start_server, repo: Path, tmp_path: Path) -> None:
    write_model(repo, "base", int32_config("base"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=POLL)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert states(c, "base") == [("1", "READY")]
        for action in ("load", "unload"):
            response = c.post(f"/v2/repository/models/base/{action}")
            assert_error(response, 503, "explicit model load / unload is not allowed if polling is enabled")

        # An added model is loaded.
        build_outside(tmp_path, "added", {1: versioned_model(1)}).rename(repo / "added")
        wait_for(lambda: states(c, "added") == [("1", "READY")], "the added model to be loaded")
        assert served_by(c, "added") == 100

        # A new version folder is picked up (latest policy: it replaces version 1).
        version_2 = build_outside(tmp_path, "v2", {2: versioned_model(2)}) / "2"
        version_2.rename(repo / "base" / "2")
        wait_for(lambda: states(c, "base") == [("2", "READY")], "version 2 of base to be served")
        assert served_by(c, "base") == 200

        # A changed config is applied: now every version is served.
        replace_text(
            repo / "base" / "config.pbtxt", int32_config("base", policy="version_policy: { all {} }")
        )
        wait_for(lambda: states(c, "base") == [("1", "READY"), ("2", "READY")], "both versions of base")

        # A removed model is unloaded and gone.
        shutil.rmtree(repo / "added")
        wait_for(lambda: states(c, "added") == [], "the removed model to be gone")
        assert_error(infer(c, "added", [0]), 404, "added")
        assert served_by(c, "base") == 200
        assert ready_status(c) == 200


def test_poll_mode_keeps_serving_when_a_change_breaks_the_model(
    start_server, repo: Path, tmp_path: Path
) -> None:
    write_model(repo, "model", int32_config("model"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=POLL)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert served_by(c, "model") == 100
        (build_outside(tmp_path, "broken", {3: BROKEN_MODEL}) / "3").rename(repo / "model" / "3")
        wait_for(lambda: "reloading model 'model' failed" in server.log_text(), "the failed reload")
        assert states(c, "model") == [("1", "READY")], "the loaded version should serve on"
        assert served_by(c, "model") == 100
        assert ready_status(c) == 200
        # Fixing the folder is the next change, and it is applied.
        replace_text(repo / "model" / "3" / "model.py", versioned_model(3))
        wait_for(lambda: served_by(c, "model") == 300, "the fixed version 3 to serve")
        assert states(c, "model") == [("3", "READY")]
    assert server.log_text().count("reloading model 'model' failed") == 1, "an unchanged failure was retried"


def test_poll_mode_loads_a_model_that_was_broken_at_start(start_server, repo: Path) -> None:
    write_model(repo, "late", int32_config("late"), {1: BROKEN_MODEL})
    server = start_server(repo, extra_args=POLL)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        ((version, state),) = states(c, "late")
        assert (version, state) == ("1", "UNAVAILABLE")
        assert ready_status(c) == 400
        replace_text(repo / "late" / "1" / "model.py", versioned_model(1))
        wait_for(lambda: states(c, "late") == [("1", "READY")], "the repaired model to load")
        assert ready_status(c) == 200


# ------------------------------------------------------------------------------------------ readiness


@pytest.mark.parametrize(
    ("flag", "ready"),
    [
        ((), 400),
        (("--strict-readiness",), 400),
        (("--strict-readiness", "true"), 400),
        (("--strict-readiness", "false"), 200),
        (("--strict-readiness=false",), 200),
    ],
)
def test_strict_readiness(start_server, repo: Path, flag: tuple[str, ...], ready: int) -> None:
    write_model(repo, "good", int32_config("good"), {1: versioned_model(1)})
    write_model(repo, "broken", int32_config("broken"), {1: BROKEN_MODEL})
    server = start_server(repo, extra_args=flag)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        response = c.get("/v2/health/ready")
        assert (response.status_code, response.json()) == (ready, {"ready": ready == 200})
        assert c.get("/v2/health/live").json() == {"live": True}
        assert served_by(c, "good") == 100


def test_strict_readiness_counts_every_version(start_server, repo: Path) -> None:
    """Triton's strict readiness: a model with one broken version is not ready, though others serve."""
    versions = {1: versioned_model(1), 2: BROKEN_MODEL}
    write_model(repo, "half", int32_config("half", policy="version_policy: { all {} }"), versions)
    server = start_server(repo)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert served_by(c, "half") == 100
        assert ready_status(c) == 400


def test_poll_mode_keeps_every_model_when_the_repository_cannot_be_listed(
    start_server, repo: Path, tmp_path: Path
) -> None:
    """A repository that briefly cannot be listed (renamed during a deploy, a network file system
    hiccup) changes nothing: its models are not unloaded."""
    write_model(repo, "steady", int32_config("steady"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=POLL)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert served_by(c, "steady") == 100
        aside = tmp_path / "aside"
        repo.rename(aside)
        try:
            failed = "polling the model repository failed"
            wait_for(lambda: server.log_text().count(failed) >= 3, "three failed polls")
            assert served_by(c, "steady") == 100
        finally:
            aside.rename(repo)
        # A model added now is loaded by a poll of the restored repository: one has run after it.
        write_model(repo, "newcomer", int32_config("newcomer"), {1: versioned_model(1)})
        wait_for(lambda: "model 'newcomer' ready" in server.log_text(), "a poll of the restored repository")
        assert states(c, "steady") == [("1", "READY")]
        assert "removed from the repository" not in server.log_text()
