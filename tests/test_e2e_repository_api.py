"""Triton's model repository extension over HTTP, end to end: index, load, unload, config and file
overrides, reloads under load, unloads with requests in flight, models whose code raises."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    EXAMPLES,
    IDENTITY_MODEL,
    ServerProcess,
    assert_error,
    int32_config,
    make_client,
    stop_all,
    write_model,
)

EXPLICIT = ("--model-control-mode", "explicit")


def versioned_model(version: int, offset: int = 0) -> str:
    """Adds 100 * version + offset: an answer tells which version (and which code) ran."""
    return f"""
class Model:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] + {100 * version + offset}}}
"""


SLOW_MODEL = """
import asyncio
from pathlib import Path


class Model:
    async def execute(self, inputs):
        (Path(__file__).parent / "started").write_text("started")
        await asyncio.sleep(1.0)
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""

# Loads slowly, and raises if two loads of it ever overlap (the marker file is created exclusively).
SLOW_LOADING_MODEL = """
import time
from pathlib import Path

MARKER = Path(__file__).parent / "loading"


class Model:
    def initialize(self, config):
        MARKER.open("x").close()
        time.sleep(0.3)
        MARKER.unlink()

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""

RAISING_MODEL = """
class Model:
    def initialize(self, config):
        raise RuntimeError("initialize blew up on purpose")

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""

# Writes where its model.py lives to the path its config's `report` parameter names.
HEAVY_MODEL = """
import time


class Model:
    def initialize(self, config):
        time.sleep(1.5)

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""

REPORTING_MODEL = """
from pathlib import Path


class Model:
    def initialize(self, config):
        Path(config["parameters"]["report"]["string_value"]).write_text(str(Path(__file__).parent))

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] * 3}
"""


def infer(client: httpx.Client, model: str, values: list[int], version: int | None = None) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "") + "/infer"
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}
    return client.post(path, json=body)


def answer(client: httpx.Client, model: str, values: list[int]) -> list[int]:
    response = infer(client, model, values)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def index(client: httpx.Client, **body: object) -> list[dict]:
    response = client.post("/v2/repository/index", json=body) if body else client.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    return response.json()


def entries(client: httpx.Client, model: str) -> list[dict]:
    return [e for e in index(client) if e["name"] == model]


def load(client: httpx.Client, model: str, **parameters: object) -> httpx.Response:
    body = {"parameters": parameters} if parameters else None
    return client.post(f"/v2/repository/models/{model}/load", json=body)


def unload(client: httpx.Client, model: str, **parameters: object) -> httpx.Response:
    body = {"parameters": parameters} if parameters else None
    return client.post(f"/v2/repository/models/{model}/unload", json=body)


def assert_ok(response: httpx.Response) -> None:
    assert (response.status_code, response.content) == (200, b""), response.text


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def int32_json_config(name: str, **extra: object) -> dict:
    return {
        "name": name,
        "backend": "python",
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        **extra,
    }


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# ------------------------------------------------------------------------------------------ round trips


def test_index_load_unload_round_trip(start_server, repo: Path, http_version: str) -> None:
    write_model(repo, "first", int32_config("first"), {1: versioned_model(1)})
    write_model(repo, "second", int32_config("second"), {1: versioned_model(1), 2: versioned_model(2)})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "first"))
    with make_client(server.base_url, http_version) as c:
        assert index(c) == [
            {"name": "first", "version": "1", "state": "READY"},
            {"name": "second"},  # on disk, never loaded: Triton lists its name only
        ]
        assert index(c, ready=True) == [{"name": "first", "version": "1", "state": "READY"}]
        assert_error(infer(c, "second", [1]), 404, "second")

        assert_ok(load(c, "second"))
        assert entries(c, "second") == [{"name": "second", "version": "2", "state": "READY"}]
        assert answer(c, "second", [1]) == [201]

        assert_ok(unload(c, "first"))
        assert entries(c, "first") == [
            {"name": "first", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        assert index(c, ready=True) == [{"name": "second", "version": "2", "state": "READY"}]
        assert_error(infer(c, "first", [1]), 503, "first", "unloaded")
        ready = c.get("/v2/health/ready")
        assert (ready.status_code, ready.json()) == (200, {"ready": True}), "an unloaded model counts"

        assert_ok(load(c, "first"))
        assert answer(c, "first", [1]) == [101]
        assert_ok(unload(c, "first", unload_dependents=True))
        assert_ok(unload(c, "first"))  # already unloaded: nothing to do
        assert_error(infer(c, "first", [1]), 503, "first")


def test_extensions_list_the_repository_api(start_server, repo: Path) -> None:
    server = start_server(repo, extra_args=EXPLICIT)
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        extensions = c.get("/v2").json()["extensions"]
    assert {"model_repository", "model_repository(unload_dependents)"} <= set(extensions)
    assert {"binary_tensor_data", "model_configuration"} <= set(extensions)


def test_config_override_replaces_the_config_on_disk(start_server, repo: Path) -> None:
    write_model(repo, "versions", int32_config("versions"), {n: versioned_model(n) for n in (1, 2, 3)})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "versions"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert [e["version"] for e in entries(c, "versions")] == ["3"]
        config = int32_json_config("versions", version_policy={"specific": {"versions": [1, 2]}})
        assert_ok(load(c, "versions", config=json.dumps(config)))
        assert [e["version"] for e in entries(c, "versions")] == ["1", "2"]
        assert c.get("/v2/models/versions/config").json()["version_policy"] == {
            "specific": {"versions": [1, 2]}
        }
        assert answer(c, "versions", [0]) == [200]
        assert_error(infer(c, "versions", [0], version=3), 404, "versions")
        # A load without parameters reads the configuration on disk again.
        assert_ok(load(c, "versions"))
        assert [e["version"] for e in entries(c, "versions")] == ["3"]
        assert answer(c, "versions", [0]) == [300]


def test_file_override_serves_an_uploaded_model(start_server, repo: Path, tmp_path: Path) -> None:
    server = start_server(repo, extra_args=EXPLICIT)
    report = tmp_path / "where"
    config = int32_json_config("uploaded", parameters={"report": {"string_value": str(report)}})
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        response = load(c, "uploaded", config=json.dumps(config), **{"file:1/model.py": b64(REPORTING_MODEL)})
        assert_ok(response)
        assert answer(c, "uploaded", [1, 2]) == [3, 6]
        assert entries(c, "uploaded") == [{"name": "uploaded", "version": "1", "state": "READY"}]
        folder = Path(report.read_text())
        assert folder.is_dir() and not folder.is_relative_to(repo), "the upload is in the server's own folder"
        assert not (repo / "uploaded").exists()

        assert_ok(unload(c, "uploaded"))
        assert entries(c, "uploaded") == [], "an unloaded upload is gone from the index"
        assert_error(infer(c, "uploaded", [1]), 404, "uploaded")
        assert not folder.exists(), "the uploaded files outlived the unload"

        assert_ok(load(c, "uploaded", config=json.dumps(config), **{"file:1/model.py": b64(REPORTING_MODEL)}))
        folder = Path(report.read_text())
        assert folder.is_dir()
    server.stop()
    assert not folder.exists(), "the uploaded files outlived the server"


def test_file_override_of_a_model_on_disk(start_server, repo: Path) -> None:
    write_model(repo, "swap", int32_config("swap"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "swap"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert answer(c, "swap", [0]) == [100]
        files = {"file:7/model.py": b64(versioned_model(7)), "file:7/data/notes.txt": b64("kept")}
        assert_ok(load(c, "swap", config=json.dumps(int32_json_config("swap")), **files))
        assert entries(c, "swap") == [{"name": "swap", "version": "7", "state": "READY"}]
        assert answer(c, "swap", [0]) == [700]
        assert_ok(load(c, "swap"))  # back to the folder on disk
        assert answer(c, "swap", [0]) == [100]


# ------------------------------------------------------------------------------------------ errors


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository_api")
    repo = root / "models"
    repo.mkdir()
    write_model(repo, "good", int32_config("good"), {1: versioned_model(1)})
    server = ServerProcess(repo, root / "server.log", extra_args=(*EXPLICIT, "--load-model", "good")).start()
    yield server
    stop_all([server])


GOOD_CONFIG = json.dumps(int32_json_config("good"))
BAD_REQUESTS = {
    "unknown model": ("nope", {}, ["nope"]),
    "config not JSON": ("good", {"config": "{not json"}, ["good", "config", "JSON"]),
    "config not a string": ("good", {"config": {"name": "good"}}, ["non-string as string"]),
    "config without inputs": (
        "good",
        {"config": json.dumps({"name": "good", "backend": "python"})},
        ["good", "input"],
    ),
    "config names another model": ("good", {"config": json.dumps(int32_json_config("other"))}, ["other"]),
    "files without config": (
        "good",
        {"file:1/model.py": b64(IDENTITY_MODEL)},
        ["'config' must be specified"],
    ),
    "file not base64": ("good", {"config": GOOD_CONFIG, "file:1/model.py": "@@not base64@@"}, ["base64"]),
    "file path escapes": (
        "good",
        {"config": GOOD_CONFIG, "file:../evil.py": b64("x = 1")},
        ["'file:../evil.py'", "within"],
    ),
    "file path absolute": (
        "good",
        {"config": GOOD_CONFIG, "file:/tmp/evil.py": b64("x = 1")},
        ["'file:/tmp/evil.py'", "within"],
    ),
    "model name with dots": ("..good", {}, ["invalid model name"]),
}
# Triton answers these 500 (INTERNAL): its HTTP front end reads every load parameter as a string, and its
# core refuses a model it cannot poll, an override it cannot use or a name found nowhere ('failed to poll
# from model repository').
INTERNAL = {
    "config not JSON",
    "config not a string",
    "config names another model",
    "files without config",
    "unknown model",
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_load_requests_get_tritons_status(
    explicit_server: ServerProcess, http_version: str, case: str
) -> None:
    model, parameters, fragments = BAD_REQUESTS[case]
    with make_client(explicit_server.base_url, http_version) as c:
        assert_error(load(c, model, **parameters), 500 if case in INTERNAL else 400, *fragments)
        assert answer(c, "good", [1]) == [101], "the loaded model was disturbed by a refused load"
        assert entries(c, "good") == [{"name": "good", "version": "1", "state": "READY"}]
        assert c.get("/v2/health/ready").json() == {"ready": True}


@pytest.mark.parametrize(
    ("path", "body", "fragments"),
    [
        ("/v2/repository/index", b"[1, 2", ["JSON"]),
        ("/v2/repository/index", b'{"ready": "yes"}', ["ready"]),
        ("/v2/repository/index", b"[]", ["object"]),
        ("/v2/repository/models/good/load", b'{"parameters": []}', ["parameters"]),
        ("/v2/repository/models/good/unload", b'{"parameters": {"unload_dependents": 1}}', ["unload_depend"]),
        ("/v2/repository/models/nope/unload", b"", ["nope"]),
    ],
)
def test_malformed_repository_requests_are_400(
    explicit_server: ServerProcess, path: str, body: bytes, fragments: list[str]
) -> None:
    with httpx.Client(base_url=explicit_server.base_url, timeout=10) as c:
        assert_error(c.post(path, content=body), 400, *fragments)
        assert answer(c, "good", [1]) == [101]


def test_repository_endpoints_answer_405_to_get(explicit_server: ServerProcess) -> None:
    with httpx.Client(base_url=explicit_server.base_url, timeout=10) as c:
        response = c.get("/v2/repository/index")
        assert_error(response, 405)
        assert response.headers["allow"] == "POST"


def test_model_whose_code_raises_is_unavailable_with_its_reason(start_server, repo: Path) -> None:
    write_model(repo, "good", int32_config("good"), {1: versioned_model(1)})
    write_model(repo, "broken", int32_config("broken"), {1: RAISING_MODEL})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "good"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        message = assert_error(load(c, "broken"), 400, "failed to load 'broken'", "initialize blew up")
        (entry,) = entries(c, "broken")
        assert (entry["version"], entry["state"]) == ("1", "UNAVAILABLE")
        assert "initialize blew up on purpose" in entry["reason"] and entry["reason"] in message
        assert_error(infer(c, "broken", [1]), 503, "broken", "initialize blew up")
        assert c.get("/v2/health/live").json() == {"live": True}
        ready = c.get("/v2/health/ready")
        assert (ready.status_code, ready.json()) == (400, {"ready": False}), "a failed model is loaded"
        assert answer(c, "good", [1]) == [101]
        # Unloading it makes the server ready again.
        assert_ok(unload(c, "broken"))
        assert c.get("/v2/health/ready").status_code == 200
    assert "initialize blew up on purpose" in server.log_text()


def test_failed_reload_keeps_the_loaded_model(start_server, repo: Path) -> None:
    write_model(repo, "steady", int32_config("steady"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "steady"))
    config = json.dumps(int32_json_config("steady"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        response = load(c, "steady", config=config, **{"file:1/model.py": b64(RAISING_MODEL)})
        assert_error(response, 400, "steady", "initialize blew up")
        assert entries(c, "steady") == [{"name": "steady", "version": "1", "state": "READY"}]
        assert answer(c, "steady", [1]) == [101], "the old model should serve on"
        assert c.get("/v2/health/ready").json() == {"ready": True}


# ------------------------------------------------------------------------------------------ lifecycle


def test_reload_under_load_fails_no_request(start_server, repo: Path, http_version: str) -> None:
    """Clients keep sending while the model is reloaded again and again (its loads are slow, so requests
    arrive during every swap): every request is answered, by the old code or the new."""
    directory = write_model(repo, "hot", int32_config("hot"), {1: versioned_model(1)})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "hot"))
    started, stop = threading.Semaphore(0), threading.Event()

    def hammer() -> list[tuple[int, str]]:
        seen, after_stop = [], 0
        with make_client(server.base_url, http_version) as c:
            while after_stop < 5:  # and a few more once the reloads are done
                after_stop += stop.is_set()
                response = infer(c, "hot", [0])
                seen.append((response.status_code, response.text))
                if len(seen) == 1:
                    started.release()
        return seen

    with ThreadPoolExecutor(4) as pool, make_client(server.base_url, http_version) as admin:
        clients = [pool.submit(hammer) for _ in range(4)]
        for _ in clients:
            assert started.acquire(timeout=15), "a client never got its first answer"
        for offset in range(1, 6):
            (directory / "1" / "model.py").write_text(
                versioned_model(1, offset) + "\nimport time\ntime.sleep(0.1)\n" + "#" * offset
            )
            assert_ok(load(admin, "hot"))
        stop.set()
        results = [r for future in clients for r in future.result(timeout=60)]
        assert answer(admin, "hot", [0]) == [105], "the last reload is not the one serving"
    failures = [r for r in results if r[0] != 200]
    assert not failures, f"{len(failures)} of {len(results)} requests failed, e.g. {failures[:3]}"
    served = {json.loads(text)["outputs"][0]["data"][0] for _, text in results}
    assert served <= {100, 101, 102, 103, 104, 105}, served
    assert {100, 105} <= served, f"answers before the first reload and after the last are missing: {served}"


def test_unload_waits_for_the_request_in_flight(start_server, repo: Path, http_version: str) -> None:
    write_model(repo, "slow", int32_config("slow"), {1: SLOW_MODEL})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "slow"))
    started = repo / "slow" / "1" / "started"
    with ThreadPoolExecutor(1) as pool, make_client(server.base_url, http_version) as c:
        in_flight = pool.submit(infer, c, "slow", [1, 2, 3])
        wait_for(started.exists, "the slow model to start executing")
        assert_ok(unload(c, "slow"))
        response = in_flight.result(timeout=15)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [2, 4, 6]
        assert_error(infer(c, "slow", [1]), 503, "slow")


def test_loading_runs_off_the_event_loop(start_server, repo: Path) -> None:
    write_model(repo, "fast", int32_config("fast"), {1: versioned_model(1)})
    write_model(repo, "heavy", int32_config("heavy"), {1: HEAVY_MODEL})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "fast"))
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.base_url, timeout=10) as c:
        loading = pool.submit(load, c, "heavy")
        wait_for(lambda: [e.get("state") for e in entries(c, "heavy")] == ["LOADING"], "heavy to be LOADING")
        # While it loads, the server answers everything else.
        assert answer(c, "fast", [1]) == [101]
        assert_error(infer(c, "heavy", [1]), 503, "heavy")
        assert c.get("/v2/health/ready").status_code == 400, "a loading model is not ready yet"
        assert_ok(loading.result(timeout=15))
        assert answer(c, "heavy", [4]) == [4]
        assert c.get("/v2/health/ready").status_code == 200


def test_concurrent_loads_of_one_model_take_turns(start_server, repo: Path) -> None:
    write_model(repo, "serial", int32_config("serial"), {1: SLOW_LOADING_MODEL})
    server = start_server(repo, extra_args=EXPLICIT)

    def load_once(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            return load(c, "serial")

    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(load_once, range(4)))
    for response in responses:
        assert_ok(response)  # an overlapping load would have found the marker and raised
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert entries(c, "serial") == [{"name": "serial", "version": "1", "state": "READY"}]
        assert answer(c, "serial", [9]) == [9]


MODULE_CHECKING_MODEL = """
import sys


class Model:
    def execute(self, inputs):
        assert sys.modules.get(__name__) is not None, "model module missing from sys.modules"
        return {"OUTPUT0": inputs["INPUT0"]}
"""


def test_reloaded_python_model_keeps_its_module_registered(start_server, repo: Path) -> None:
    write_model(repo, "modular", int32_config("modular"), {1: MODULE_CHECKING_MODEL})
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "modular"))
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert answer(c, "modular", [1]) == [1]
        assert_ok(load(c, "modular"))
        assert answer(c, "modular", [1]) == [1]


def test_unload_lets_a_stream_in_progress_finish(start_server, repo: Path) -> None:
    source = EXAMPLES / "token_stream"
    write_model(repo, "token_stream", (source / "config.pbtxt").read_text(), {1: ""})
    (repo / "token_stream" / "1" / "model.py").write_text((source / "1" / "model.py").read_text())
    server = start_server(repo, extra_args=(*EXPLICIT, "--load-model", "token_stream"))
    words = " ".join(f"w{i}" for i in range(8))  # 8 yields, 50 ms apart
    with (
        httpx.Client(base_url=server.base_url, timeout=15) as client,
        client.stream(
            "POST",
            "/grps/v1/infer/predict",
            params={"streaming": "true"},
            json={"model": "token_stream", "str_data": words},
        ) as response,
    ):
        lines = response.iter_lines()
        first = json.loads(next(lines))
        with ThreadPoolExecutor(1) as pool:
            unloading = pool.submit(
                lambda: httpx.post(f"{server.base_url}/v2/repository/models/token_stream/unload", timeout=15)
            )
            time.sleep(0.1)  # the stream has ~300 ms to go: the unload waits for it
            assert not unloading.done()
            rest = [json.loads(line) for line in lines if line]
            assert unloading.result().status_code == 200
    tokens = [m["str_data"] for m in (first, *rest)]
    assert tokens == words.split()
    assert all(m["status"]["status"] == "SUCCESS" for m in (first, *rest))
