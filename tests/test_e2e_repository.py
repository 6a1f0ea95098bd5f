"""Model repositories end to end: broken models, config.json, version policies, misbehaving model code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    IDENTITY_MODEL,
    ServerProcess,
    assert_connection_reused,
    assert_error,
    int32_config,
    stop_all,
    write_model,
)


def versioned_model(version: int) -> str:
    """Adds 100 * its version number: a response tells which version ran."""
    return f"""
VERSION = {version}


class Model:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] + 100 * VERSION}}
"""


WRONG_OUTPUT_MODEL = """
class Model:
    def execute(self, inputs):
        return {"NOT_OUTPUT0": inputs["INPUT0"]}
"""
VERSIONS_123 = {n: versioned_model(n) for n in (1, 2, 3)}
POLICIES = {
    "latest_two": ("version_policy: { latest { num_versions: 2 } }", [2, 3]),
    "all_versions": ("version_policy: { all {} }", [1, 2, 3]),
    "specific_versions": ("version_policy: { specific { versions: [1, 3] } }", [1, 3]),
    "default_policy": ("", [3]),
}


def build_repository(repo: Path) -> Path:
    for name, (policy, _) in POLICIES.items():
        write_model(repo, name, int32_config(name, policy=policy), VERSIONS_123)
    # Version 3 fails to import: the default goes to the highest *ready* version, 2.
    write_model(
        repo,
        "highest_broken",
        int32_config("highest_broken", policy="version_policy: { all {} }"),
        {1: versioned_model(1), 2: versioned_model(2), 3: "raise RuntimeError('version three is broken')\n"},
    )
    write_model(
        repo,
        "bad_syntax",
        'name: "bad_syntax"\nbackend: "python"\nmax_batch_size: 8\ninput [ { name: "INPUT0" data_type: \n',
        {1: IDENTITY_MODEL},
    )
    write_model(repo, "import_error", int32_config("import_error"), {1: "import missing_dependency_xyz\n"})
    write_model(repo, "no_version_folder", int32_config("no_version_folder"), {})
    write_model(
        repo,
        "json_config",
        {
            "name": "json_config",
            "backend": "python",
            "max_batch_size": 4,
            "input": [{"name": "IN", "data_type": "TYPE_INT64", "dims": [2]}],
            "output": [{"name": "OUT", "data_type": "TYPE_INT64", "dims": [2]}],
            "parameters": {"factor": {"string_value": "3"}},
        },
        {
            1: """
class TritonPythonModel:
    def initialize(self, config):
        self.factor = int(config["parameters"]["factor"]["string_value"])

    def execute(self, inputs):
        return {"OUT": inputs["IN"] * self.factor}
"""
        },
    )
    write_model(
        repo,
        "execute_raises",
        int32_config("execute_raises"),
        {1: "class Model:\n    def execute(self, inputs):\n        raise ValueError('kaboom in execute')\n"},
    )
    write_model(
        repo,
        "wrong_output",
        int32_config("wrong_output"),
        {1: WRONG_OUTPUT_MODEL},
    )
    return repo


@pytest.fixture(scope="module")
def repo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("repository")
    repository = base / "models"
    repository.mkdir()
    server = ServerProcess(build_repository(repository), base / "server.log").start()
    yield server
    stop_all([server])


@pytest.fixture
def rclient(repo_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=repo_server.base_url, timeout=15) as c:
        yield c


def infer_int32(
    client: httpx.Client, model: str, values: list[int], version: int | None = None
) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "") + "/infer"
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}
    return client.post(path, json=body)


# ------------------------------------------------------------------------------------------ broken models


def test_server_live_but_not_ready_with_broken_models(rclient: httpx.Client) -> None:
    assert (rclient.get("/v2/health/live").status_code, rclient.get("/v2/health/live").json()) == (
        200,
        {"live": True},
    )
    ready = rclient.get("/v2/health/ready")
    assert (ready.status_code, ready.json()) == (400, {"ready": False})


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bad_syntax", "config.pbtxt"),
        ("no_version_folder", "version"),
        ("import_error", "missing_dependency_xyz"),
    ],
)
def test_unavailable_model_infer_is_503_with_reason(rclient: httpx.Client, model: str, reason: str) -> None:
    response = infer_int32(rclient, model, [1, 2])
    assert_error(response, 503, model, reason)
    assert_connection_reused(rclient, response)
    ready = rclient.get(f"/v2/models/{model}/ready")
    assert (ready.status_code, ready.json()) == (400, {"name": model, "ready": False})


@pytest.mark.parametrize(
    ("model", "reason"),
    [("bad_syntax", "config.pbtxt"), ("no_version_folder", "version")],
)
def test_unavailable_model_metadata_is_503_with_reason(
    rclient: httpx.Client, model: str, reason: str
) -> None:
    response = rclient.get(f"/v2/models/{model}")
    assert_error(response, 503, model, reason)
    assert_connection_reused(rclient, response)


def test_import_error_model_metadata_is_503_with_reason(rclient: httpx.Client) -> None:
    response = rclient.get("/v2/models/import_error")
    assert_error(response, 503, "import_error", "missing_dependency_xyz")


def test_unavailable_models_are_logged_with_reason(repo_server: ServerProcess) -> None:
    log = repo_server.log_text()
    for model, reason in (
        ("bad_syntax", "config.pbtxt"),
        ("import_error", "missing_dependency_xyz"),
        ("no_version_folder", "version"),
    ):
        lines = [line for line in log.splitlines() if f"'{model}'" in line and reason in line]
        assert lines, f"no log line gives why '{model}' failed to load"


def test_failed_version_is_logged_with_reason(repo_server: ServerProcess) -> None:
    log = repo_server.log_text()
    assert "version three is broken" in log, "the load error of version 3 is not in the log"
    assert "model 'highest_broken' ready, versions [1, 2, 3]" not in log, "version 3 is not ready"


def test_good_models_serve_next_to_broken_ones(rclient: httpx.Client) -> None:
    response = infer_int32(rclient, "default_policy", [5, -5])
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [305, 295]


def test_config_json_model_with_initialize(rclient: httpx.Client) -> None:
    metadata = rclient.get("/v2/models/json_config").json()
    assert metadata["inputs"] == [{"name": "IN", "datatype": "INT64", "shape": [-1, 2]}]
    assert metadata["outputs"] == [{"name": "OUT", "datatype": "INT64", "shape": [-1, 2]}]
    config = rclient.get("/v2/models/json_config/config").json()
    assert config["max_batch_size"] == 4
    assert config["input"][0]["data_type"] == "TYPE_INT64"
    assert config["parameters"] == {"factor": {"string_value": "3"}}
    big = 2**40
    body = {"inputs": [{"name": "IN", "datatype": "INT64", "shape": [2, 2], "data": [[1, -2], [big, 0]]}]}
    response = rclient.post("/v2/models/json_config/infer", json=body)
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"], out["data"]) == (
        "OUT",
        "INT64",
        [2, 2],
        [3, -6, 3 * big, 0],
    )


# ------------------------------------------------------------------------------------------ versions


@pytest.mark.parametrize("model", sorted(POLICIES))
def test_version_policy_metadata(rclient: httpx.Client, model: str) -> None:
    expected = [str(v) for v in POLICIES[model][1]]
    response = rclient.get(f"/v2/models/{model}")
    assert response.status_code == 200, response.text
    assert response.json()["versions"] == expected
    for version in expected:
        doc = rclient.get(f"/v2/models/{model}/versions/{version}").json()
        assert (doc["name"], doc["versions"]) == (model, [version])


@pytest.mark.parametrize("model", sorted(POLICIES))
@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_requests_to_a_version(rclient: httpx.Client, model: str, version: int) -> None:
    served = version in POLICIES[model][1]
    response = infer_int32(rclient, model, [1, 2, 3], version)
    ready = rclient.get(f"/v2/models/{model}/versions/{version}/ready")
    metadata = rclient.get(f"/v2/models/{model}/versions/{version}")
    if served:
        assert response.status_code == 200, response.text
        doc = response.json()
        assert (doc["model_name"], doc["model_version"]) == (model, str(version))
        assert doc["outputs"][0]["data"] == [1 + 100 * version, 2 + 100 * version, 3 + 100 * version]
        assert (ready.status_code, ready.json()) == (200, {"name": model, "ready": True})
        assert metadata.status_code == 200
    else:
        assert_error(response, 404, model, str(version))
        assert_error(ready, 404, model)
        assert_error(metadata, 404, model)
        assert_connection_reused(rclient, metadata)


@pytest.mark.parametrize(
    ("model", "expected"),
    [("latest_two", 3), ("all_versions", 3), ("specific_versions", 3), ("highest_broken", 2)],
)
def test_default_version_is_highest_ready(rclient: httpx.Client, model: str, expected: int) -> None:
    response = infer_int32(rclient, model, [0])
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["model_version"] == str(expected)
    assert doc["outputs"][0]["data"] == [100 * expected]


def test_broken_version_next_to_good_ones(rclient: httpx.Client) -> None:
    response = infer_int32(rclient, "highest_broken", [1], version=3)
    assert_error(response, 503, "highest_broken", "version three is broken")
    assert_connection_reused(rclient, response)
    ready3 = rclient.get("/v2/models/highest_broken/versions/3/ready")
    assert (ready3.status_code, ready3.json()) == (400, {"name": "highest_broken", "ready": False})
    ready = rclient.get("/v2/models/highest_broken/ready")
    assert (ready.status_code, ready.json()) == (200, {"name": "highest_broken", "ready": True})
    assert rclient.get("/v2/models/highest_broken").json()["versions"] == ["1", "2"]
    response = infer_int32(rclient, "highest_broken", [1], version=1)
    assert response.json()["outputs"][0]["data"] == [101]


# ------------------------------------------------------------------------------------------ misbehaving code


def test_execute_raising_is_500_and_server_stays_up(rclient: httpx.Client) -> None:
    for _ in range(2):  # and again: the model is not left broken by its own exception
        response = infer_int32(rclient, "execute_raises", [1, 2])
        assert_error(response, 500, "execute_raises")
        assert_connection_reused(rclient, response)
    ok = infer_int32(rclient, "default_policy", [1])
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [301]


def test_wrong_output_name_is_500_and_server_stays_up(rclient: httpx.Client) -> None:
    response = infer_int32(rclient, "wrong_output", [1, 2])
    assert_error(response, 500, "wrong_output", "OUTPUT0")
    assert_connection_reused(rclient, response)
    ok = infer_int32(rclient, "default_policy", [1])
    assert ok.status_code == 200


def test_model_exceptions_are_logged(repo_server: ServerProcess, rclient: httpx.Client) -> None:
    infer_int32(rclient, "execute_raises", [1])
    assert "kaboom in execute" in repo_server.log_text(), "the model's exception is not in the server log"


HELPER_MODEL = """
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import doubling_helper  # a module beside model.py, imported as a normal module


class Model:
    def execute(self, inputs):
        return {"OUTPUT0": doubling_helper.double(inputs["INPUT0"])}
"""


def test_loading_a_model_writes_nothing_into_the_repository(tmp_path: Path) -> None:
    """Not even __pycache__ for the helper modules model.py imports (checked with bytecode writing on)."""
    repo = tmp_path / "models"
    directory = write_model(repo, "helped", int32_config("helped"), {1: HELPER_MODEL})
    (directory / "1" / "doubling_helper.py").write_text("def double(x):\n    return x * 2\n")
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    server = ServerProcess(repo, tmp_path / "server.log", env=env).start()
    try:
        response = httpx.post(
            f"{server.base_url}/v2/models/helped/infer",
            json={"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}]},
            timeout=10,
        )
        assert response.json()["outputs"][0]["data"] == [2, 4]
        assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before
    finally:
        stop_all([server])
