"""grps's customized HTTP: a path of the operator's choosing answered by a python model's handle_http
(the example `customized_add`, grps's "c = a + b"), plain and streamed, over HTTP/1.1 and HTTP/2; the
streaming control modes (query, header, JSON body) for it and for /grps/v1/infer/predict; the paths the
server refuses to take."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, make_client, stop_all
from grps_helpers import messages

PATH = "/custom_predict"


def repository(base: Path) -> Path:
    for name in ("customized_add", "simple", "token_stream"):
        shutil.copytree(EXAMPLES / name, base / name)
    return base


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = repository(tmp_path_factory.mktemp("customized_models"))
    log = tmp_path_factory.mktemp("customized_server") / "server.log"
    extra = ("--grps-customized-predict-http", PATH, "--grps-default-model", "customized_add")
    server = ServerProcess(repo, log, extra_args=extra).start()
    yield server
    stop_all([server])


@pytest.fixture
def client(server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(server.base_url, http_version) as c:
        yield c


def test_the_model_reads_the_request_and_writes_the_answer(client: httpx.Client) -> None:
    response = client.post(PATH, json={"a": 1, "b": 2})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {"c": 3.0}
    response = client.post(PATH, params={"model": "customized_add-1"}, json={"a": [1, 2], "b": [10, 20]})
    assert response.json() == {"c": [11.0, 22.0]}
    refused = client.post(PATH, json={"a": [1, 2], "b": [1]})  # the model's own answer
    assert refused.status_code == 400 and refused.json() == {"error": "a and b differ in shape"}


def test_a_streamed_answer_comes_chunk_by_chunk(client: httpx.Client) -> None:
    body = orjson.dumps({"a": [1, 2, 3], "b": [0.5, 0.5, 0.5]})
    with client.stream("POST", PATH, content=body, params={"streaming": "true"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        if response.http_version == "HTTP/1.1":
            assert response.headers["transfer-encoding"] == "chunked"
        lines = [json.loads(line) for _, line in messages(response)]
    assert lines == [{"c": 1.5}, {"c": 2.5}, {"c": 3.5}]


def test_a_streamed_request_the_model_answers_whole_gets_that_answer(client: httpx.Client) -> None:
    """The model refuses before sending a chunk (set_response, no send): its own answer, not a stream."""
    refused = client.post(PATH, params={"streaming": "true"}, json={"a": [1, 2], "b": [1]})
    assert refused.status_code == 400 and refused.headers["content-type"] == "application/json"
    assert refused.json() == {"error": "a and b differ in shape"}


def test_errors_are_grps_failures(client: httpx.Client, server: ServerProcess) -> None:
    not_json = client.post(PATH, content=b"{oops")
    assert not_json.status_code == 400
    assert not_json.json()["status"]["status"] == "FAILURE"
    assert "the request body is not JSON" in not_json.json()["status"]["msg"]
    no_handler = client.post(PATH, params={"model": "simple"}, json={})
    assert no_handler.status_code == 400
    assert "model 'simple' has no handle_http" in no_handler.json()["status"]["msg"]
    unknown = client.post(PATH, params={"model": "nope"}, json={})
    assert unknown.status_code == 404 and "unknown model 'nope'" in unknown.json()["status"]["msg"]


def test_customized_requests_count_in_the_statistics(server: ServerProcess) -> None:
    def count() -> int:
        stats = httpx.get(f"{server.base_url}/v2/models/customized_add/stats").json()["model_stats"][0]
        return stats["inference_stats"]["success"]["count"]

    before = count()
    with httpx.Client(base_url=server.base_url) as client:
        for i in range(3):
            assert client.post(PATH, json={"a": i, "b": i}).status_code == 200
    assert count() - before == 3


@pytest.mark.parametrize(
    ("mode", "how"),
    [
        ("header_param", lambda key: {"headers": {key: "true"}}),
        ("body_param", lambda key: {"body": {key: True}}),
    ],
)
def test_streaming_control_modes(start_server, tmp_path: Path, mode: str, how) -> None:
    key, content_type = "want-stream", "text/plain; charset=utf-8"
    server = start_server(
        repository(tmp_path / "models"),
        extra_args=(
            "--grps-customized-predict-http", PATH, "--grps-default-model", "customized_add",
            "--grps-streaming-ctrl-mode", mode, "--grps-streaming-ctrl-key", key,
            "--grps-streaming-res-content-type", content_type,
        ),
    )  # fmt: skip
    ask = how(key)
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        # the customized path
        body = {"a": [1, 2], "b": [1, 1], **ask.get("body", {})}
        streamed = client.post(PATH, json=body, headers=ask.get("headers"))
        assert streamed.headers["content-type"] == content_type
        assert [json.loads(line) for line in streamed.text.splitlines()] == [{"c": 2.0}, {"c": 3.0}]
        plain = client.post(PATH, json={"a": [1, 2], "b": [1, 1]})
        assert plain.json() == {"c": [2.0, 3.0]}
        # /grps/v1/infer/predict follows the same control; ?streaming=true no longer does
        predict = {"model": "token_stream", "str_data": "one two", **ask.get("body", {})}
        answer = client.post("/grps/v1/infer/predict", json=predict, headers=ask.get("headers"))
        assert answer.headers["content-type"] == content_type
        assert [json.loads(line)["str_data"] for line in answer.text.splitlines()] == ["one", "two"]
        query_only = client.post(
            "/grps/v1/infer/predict", params={"streaming": "true"}, json=predict | {key: 0}
        )
        assert query_only.status_code == 200 and query_only.headers["content-type"] == "application/json"
        assert query_only.json()["status"]["status"] == "SUCCESS"  # one whole answer, not a stream


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/grps/v1/infer/predict", "collides with a built-in route"),
        ("/", "must match"),
        ("/v2/models/simple/infer", "collides with a built-in route"),
        ("/grps/v1/monitor/metrics", "collides with a built-in route"),
        ("/with space", "must match"),
    ],
)
def test_a_path_that_is_not_free_is_refused_at_start(tmp_path: Path, path: str, why: str) -> None:
    repo = repository(tmp_path / "models")
    argv = [
        sys.executable,
        "-m",
        "tensorgate.server",
        "serve",
        "--model-repository",
        str(repo),
        "--host",
        "127.0.0.1",
    ]
    argv += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    done = subprocess.run(
        [*argv, "--grps-customized-predict-http", path], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert why in done.stderr and "Traceback" not in done.stderr
