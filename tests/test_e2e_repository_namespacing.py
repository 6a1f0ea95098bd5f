"""Several --model-repository flags, and --model-namespacing (Triton's): a name in two repositories is
served from neither without it; with it, both load, a request naming it is refused as ambiguous, and each
repository's ensemble calls its own model of that name."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e_helpers import assert_error, int32_config, write_model

AMBIGUOUS = (
    "There are 2 identifiers of model 'composing_model' in global map, model namespace must be provided "
    "to resolve ambiguity."
)
NOT_UNIQUE = "not unique across all model repositories"


def adding(amount: int) -> str:
    return f"""
class Model:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] + {amount}}}
"""


def ensemble(name: str, step: str) -> str:
    return f"""
name: "{name}"
platform: "ensemble"
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }} ] }}
"""


def infer(client: httpx.Client, model: str) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [0]}]}
    return client.post(f"/v2/models/{model}/infer", json=body)


def added_by(client: httpx.Client, model: str) -> int:
    response = infer(client, model)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"][0]


def index(client: httpx.Client) -> list[tuple[str, str, str]]:
    response = client.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    return sorted((e["name"], e.get("state", ""), e.get("reason", "")) for e in response.json())


def wait_for(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def two_repos(tmp_path: Path) -> tuple[Path, Path]:
    """addsub_repo and subadd_repo, as Triton's L0_model_namespacing test_duplication: each has an
    ensemble calling its own `composing_model`."""
    first, second = tmp_path / "addsub_repo", tmp_path / "subadd_repo"
    write_model(first, "composing_model", int32_config("composing_model"), {1: adding(100)})
    write_model(first, "ensemble_a", ensemble("ensemble_a", "composing_model"), {1: None})
    write_model(first, "only_a", int32_config("only_a"), {1: adding(1)})
    write_model(second, "composing_model", int32_config("composing_model"), {1: adding(200)})
    write_model(second, "ensemble_b", ensemble("ensemble_b", "composing_model"), {1: None})
    return first, second


def test_models_of_every_repository_are_served_and_a_duplicate_name_by_none(
    start_server, two_repos: tuple[Path, Path]
) -> None:
    first, second = two_repos
    server = start_server(first, extra_args=("--model-repository", str(second)))
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "only_a") == 1
        assert_error(infer(c, "composing_model"), 404, "Request for unknown model: 'composing_model'")
        assert ("composing_model", "UNAVAILABLE", "model appears in two or more repositories") in index(c)
        # the ensembles' steps call a model that is not served (not ready: the server is not either)
        assert ("ensemble_a", "UNAVAILABLE") in [e[:2] for e in index(c)]
        assert c.get("/v2/health/ready").status_code == 400
    assert f"failed to poll model 'composing_model': {NOT_UNIQUE}" in server.log_text()


def test_explicit_load_of_a_duplicate_name_fails(start_server, two_repos: tuple[Path, Path]) -> None:
    first, second = two_repos
    explicit = ("--model-repository", str(second), "--model-control-mode", "explicit")
    server = start_server(first, extra_args=explicit)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        response = c.post("/v2/repository/models/composing_model/load")
        assert_error(response, 500, "failed to load 'composing_model', failed to poll", NOT_UNIQUE)
        assert c.post("/v2/repository/models/only_a/load").status_code == 200
        assert added_by(c, "only_a") == 1


def test_namespacing_serves_both_and_each_ensemble_calls_its_own(
    start_server, two_repos: tuple[Path, Path]
) -> None:
    first, second = two_repos
    server = start_server(
        first, extra_args=("--model-repository", str(second), "--model-namespacing", "true")
    )
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "ensemble_a") == 100
        assert added_by(c, "ensemble_b") == 200
        assert added_by(c, "only_a") == 1
        assert_error(infer(c, "composing_model"), 400, AMBIGUOUS)
        assert_error(c.get("/v2/models/composing_model"), 400, AMBIGUOUS)
        listed = [e for e in index(c) if e[0] == "composing_model"]
        assert listed == [("composing_model", "READY", "")] * 2
        assert c.get("/v2/health/ready").status_code == 200


def test_namespacing_in_explicit_mode_loads_every_model_of_the_name(
    start_server, two_repos: tuple[Path, Path]
) -> None:
    first, second = two_repos
    flags = (
        "--model-repository",
        str(second),
        "--model-namespacing",
        "true",
        "--model-control-mode",
        "explicit",
    )
    server = start_server(first, extra_args=flags)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert c.post("/v2/repository/models/ensemble_a/load").status_code == 200
        assert added_by(c, "ensemble_a") == 100
        assert added_by(c, "composing_model") == 100  # the only one loaded yet
        assert c.post("/v2/repository/models/ensemble_b/load").status_code == 200
        assert added_by(c, "ensemble_b") == 200
        assert_error(infer(c, "composing_model"), 400, AMBIGUOUS)
        assert c.post("/v2/repository/models/composing_model/unload").status_code == 200
        assert_error(infer(c, "composing_model"), 400, AMBIGUOUS)  # both unloaded, both still known
        assert c.post("/v2/repository/models/composing_model/load").status_code == 200
        assert added_by(c, "ensemble_a") == 100


def test_namespacing_in_poll_mode_resolves_steps_again_as_models_come_and_go(
    start_server, two_repos: tuple[Path, Path], tmp_path: Path
) -> None:
    """Triton's test_dynamic_resolution: with its own composing_model gone, ensemble_a calls the only one
    left (the other repository's); with it back, its own again."""
    first, second = two_repos
    poll = ("--model-control-mode", "poll", "--repository-poll-secs", "0.1")
    flags = ("--model-repository", str(second), "--model-namespacing", "true", *poll)
    server = start_server(first, extra_args=flags)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "ensemble_a") == 100
        aside = tmp_path / "aside"
        shutil.move(first / "composing_model", aside)
        wait_for(lambda: infer(c, "composing_model").status_code == 200, "the only composing_model left")
        assert added_by(c, "composing_model") == 200
        assert added_by(c, "ensemble_a") == 200
        shutil.move(aside, first / "composing_model")
        wait_for(lambda: infer(c, "composing_model").status_code == 400, "both composing_models again")
        assert_error(infer(c, "composing_model"), 400, AMBIGUOUS)
        assert added_by(c, "ensemble_a") == 100
        assert added_by(c, "ensemble_b") == 200
