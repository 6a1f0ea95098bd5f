"""End to end: Triton's statistics extension (GET .../stats) and the Prometheus metrics port.

One server per module receives a known workload once; the tests then read its counters over HTTP/1.1
and HTTP/2 and from /metrics, and must agree with what was sent.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, assert_error, int32_config, make_client, stop_all, write_model
from prometheus_client.parser import text_string_to_metric_families

FAILING_ON_NEGATIVE = """
class Model:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        if (x < 0).any():
            raise ValueError("negative input")
        return {"OUTPUT0": x + 1}
"""
BROKEN = "raise RuntimeError('this model cannot load')\n"
NOT_UTF8 = """
import numpy as np


class Model:
    def execute(self, inputs):
        return {"OUTPUT0": np.array([b"\\xff\\xfe"] * inputs["INPUT0"].size, dtype=object)}
"""
NOT_UTF8_CONFIG = """
name: "not_utf8"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
STREAMING_ONLY = """
class Model:
    async def execute_stream(self, inputs):
        yield {"OUTPUT0": inputs["INPUT0"]}
"""
# Requests of one row wait (up to 10 s) until 4 rows are queued; a request of 4 or 8 rows goes at once.
BATCHING = "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 10000000 }"


def infer_body(rows: list[list[int]], batched: bool = True) -> dict:
    shape = [len(rows), 2] if batched else [2]
    data = [v for row in rows for v in row] if batched else rows[0]
    return {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": data}]}


def send_workload(base_url: str) -> None:
    """adder: 4 concurrent 1-row requests (one batch of 4), 2 requests of 4 rows, 1 of 8 rows, 1 of 4
    rows that fails. plain: 3 answered and 2 failed on version 1, 2 answered on the latest (2).
    Requests refused as bad input (400) before they reach the model, as Triton counts them: not at all."""
    barrier = threading.Barrier(4)
    statuses: list[int] = []

    def one_row(i: int) -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            barrier.wait()
            statuses.append(client.post("/v2/models/adder/infer", json=infer_body([[i, i]])).status_code)

    threads = [threading.Thread(target=one_row, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 4

    with httpx.Client(base_url=base_url, timeout=30) as client:
        for rows, status in (
            ([[1, 2]] * 4, 200),
            ([[3, 4]] * 4, 200),
            ([[5, 6]] * 8, 200),
            ([[-1, 0]] * 4, 500),
        ):
            response = client.post("/v2/models/adder/infer", json=infer_body(rows))
            assert response.status_code == status, response.text
        for path, value, status in [("/v2/models/plain/versions/1/infer", 1, 200)] * 3 + [
            ("/v2/models/plain/versions/1/infer", -1, 500),
            ("/v2/models/plain/versions/1/infer", -2, 500),
            ("/v2/models/plain/infer", 7, 200),
            ("/v2/models/plain/infer", 8, 200),
        ]:
            response = client.post(path, json=infer_body([[value, value]], batched=False))
            assert response.status_code == status, response.text
        bad_inputs = [
            ("/v2/models/adder/infer", infer_body([[1, 2]] * 9)),  # over max_batch_size
            ("/v2/models/plain/versions/1/infer", infer_body([[1, 2, 3]], batched=False)),  # wrong shape
            (
                "/v2/models/plain/versions/1/infer",
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]},
            ),
            (
                "/v2/models/plain/infer",
                {"inputs": [{"name": "NOPE", "datatype": "INT32", "shape": [2], "data": [1, 2]}]},
            ),
            ("/v2/models/streamer/infer", infer_body([[1, 2]], batched=False)),  # a plain infer, streams only
        ]
        for path, body in bad_inputs:
            assert client.post(path, json=body).status_code == 400
        # The model ran; its answer cannot be JSON: a 400 counted as a success, as Triton counts it.
        not_utf8 = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
        assert client.post("/v2/models/not_utf8/infer", json=not_utf8).status_code == 400


@pytest.fixture(scope="module")
def stats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int, int]]:
    """The server, and the time span (ms since the epoch) of its workload."""
    root = tmp_path_factory.mktemp("statistics")
    repo = root / "models"
    repo.mkdir()
    write_model(
        repo,
        "adder",
        int32_config("adder", max_batch_size=8, dims="[ 2 ]", policy=BATCHING),
        {1: FAILING_ON_NEGATIVE},
    )
    write_model(
        repo,
        "plain",
        int32_config("plain", dims="[ 2 ]", policy="version_policy: { all { } }"),
        {1: FAILING_ON_NEGATIVE, 2: FAILING_ON_NEGATIVE},
    )
    write_model(repo, "broken", int32_config("broken"), {1: BROKEN})
    write_model(repo, "streamer", int32_config("streamer", dims="[ 2 ]"), {1: STREAMING_ONLY})
    write_model(repo, "not_utf8", NOT_UTF8_CONFIG, {1: NOT_UTF8})
    server = ServerProcess(repo, root / "server.log").start()
    try:
        started = time.time_ns() // 1_000_000
        send_workload(server.base_url)
        yield server, started, time.time_ns() // 1_000_000
    finally:
        stop_all([server])


@pytest.fixture
def stats_client(stats_server: tuple[ServerProcess, int, int], http_version: str) -> Iterator[httpx.Client]:
    with make_client(stats_server[0].base_url, http_version) as client:
        yield client


def by_version(doc: dict) -> dict[tuple[str, str], dict]:
    return {(s["name"], s["version"]): s for s in doc["model_stats"]}


def test_counts_match_the_requests_sent(stats_client: httpx.Client) -> None:
    response = stats_client.get("/v2/models/stats")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    stats = by_version(response.json())
    # ready ones, by name and version
    assert list(stats) == [
        ("adder", "1"),
        ("not_utf8", "1"),
        ("plain", "1"),
        ("plain", "2"),
        ("streamer", "1"),
    ]
    not_utf8 = stats["not_utf8", "1"]["inference_stats"]
    assert (not_utf8["success"]["count"], not_utf8["fail"]["count"]) == (1, 0)
    streamer = stats["streamer", "1"]["inference_stats"]
    assert (streamer["success"]["count"], streamer["fail"]["count"]) == (0, 0)  # its 400 is not counted

    adder = stats["adder", "1"]
    assert (adder["inference_count"], adder["execution_count"]) == (20, 4)  # 4x1 + 2x4 + 8 rows; 4 batches
    assert adder["inference_stats"]["success"]["count"] == 7
    assert adder["inference_stats"]["fail"]["count"] == 1
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in adder["batch_stats"]] == [(4, 3), (8, 1)]

    expected = {("plain", "1"): (3, 2), ("plain", "2"): (2, 0)}
    for key, (answered, failed) in expected.items():
        plain = stats[key]
        assert (plain["inference_count"], plain["execution_count"]) == (answered, answered)
        assert plain["inference_stats"]["success"]["count"] == answered
        assert plain["inference_stats"]["fail"]["count"] == failed
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in plain["batch_stats"]] == [
            (1, answered)
        ]


def test_durations_are_counted_and_consistent(
    stats_server: tuple[ServerProcess, int, int], stats_client: httpx.Client
) -> None:
    _, started, finished = stats_server
    for stat in stats_client.get("/v2/models/stats").json()["model_stats"]:
        where = (stat["name"], stat["version"])
        assert set(stat) >= {"name", "version", "last_inference", "inference_count", "execution_count"}
        if stat["name"] == "streamer":  # only refused (400) requests: never an inference
            assert stat["last_inference"] == 0 and stat["inference_count"] == 0, stat
            continue
        assert started <= stat["last_inference"] <= finished, where
        inference = stat["inference_stats"]
        success = inference["success"]
        assert success["count"] > 0 and success["ns"] > 0, where
        assert inference["fail"]["ns"] > 0 if inference["fail"]["count"] else inference["fail"]["ns"] == 0
        phases = ("queue", "compute_input", "compute_infer", "compute_output")
        assert all(inference[p]["count"] == success["count"] for p in phases), (where, inference)
        assert inference["compute_infer"]["ns"] > 0, where
        # each answered request's time in the server covers its wait and its batch's compute
        assert sum(inference[p]["ns"] for p in phases) <= success["ns"], (where, inference)
        assert inference["cache_hit"] == inference["cache_miss"] == {"count": 0, "ns": 0}
        assert (
            sum(b["batch_size"] * b["compute_infer"]["count"] for b in stat["batch_stats"])
            == (stat["inference_count"])
        )
        assert sum(b["compute_infer"]["count"] for b in stat["batch_stats"]) == stat["execution_count"]
        for batch in stat["batch_stats"]:
            assert batch["compute_infer"]["ns"] > 0, (where, batch)
            assert (
                batch["compute_input"]["count"]
                == batch["compute_output"]["count"]
                == batch["compute_infer"]["count"]
            )


def test_one_model_and_one_version(stats_client: httpx.Client) -> None:
    everything = by_version(stats_client.get("/v2/models/stats").json())
    plain = stats_client.get("/v2/models/plain/stats")
    assert plain.status_code == 200, plain.text
    assert by_version(plain.json()) == {k: v for k, v in everything.items() if k[0] == "plain"}
    one = stats_client.get("/v2/models/plain/versions/1/stats")
    assert one.status_code == 200, one.text
    assert one.json() == {"model_stats": [everything["plain", "1"]]}


def test_unknown_and_unready_models_are_errors(stats_client: httpx.Client) -> None:
    assert_error(stats_client.get("/v2/models/nope/stats"), 404, "requested model 'nope' is not available")
    assert_error(
        stats_client.get("/v2/models/plain/versions/3/stats"),
        404,
        "requested model version is not available for model 'plain'",
    )
    for version in ("x", "-1"):  # not a version: Triton's version parser's 400
        assert_error(stats_client.get(f"/v2/models/plain/versions/{version}/stats"), 400, "version")
    assert_error(
        stats_client.get("/v2/models/broken/stats"), 503, "requested model 'broken' is not available"
    )
    refused = stats_client.post("/v2/models/stats", content=b"{}")
    assert_error(refused, 405)
    assert refused.headers["allow"] == "GET, HEAD"


def test_stats_routes_leave_the_model_routes_alone(stats_client: httpx.Client) -> None:
    assert "statistics" in stats_client.get("/v2").json()["extensions"]
    metadata = stats_client.get("/v2/models/plain")
    assert metadata.status_code == 200, metadata.text
    assert metadata.json()["versions"] == ["1", "2"]
    assert stats_client.get("/v2/models/plain/versions/1/ready").status_code == 200
    assert_error(stats_client.get("/v2/models/stats/ready"), 404, "stats")  # a model named "stats"


# ------------------------------------------------------------------------------------------ /metrics


def scrape(server: ServerProcess) -> tuple[httpx.Response, dict]:
    assert server.metrics_port is not None, "the server logged no metrics port"
    response = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=15)
    assert response.status_code == 200, response.text
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    return response, families


def per_version(family) -> dict[tuple[str, str], float]:
    """Each version's total (nv_inference_request_failure has a sample per `reason`)."""
    totals: dict[tuple[str, str], float] = {}
    for s in family.samples:
        key = (s.labels["model"], s.labels["version"])
        totals[key] = totals.get(key, 0) + s.value
    return totals


def test_metrics_match_the_statistics(stats_server: tuple[ServerProcess, int, int]) -> None:
    server = stats_server[0]
    stats = by_version(httpx.get(server.base_url + "/v2/models/stats", timeout=15).json())
    response, families = scrape(server)
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    # Triton's exact series names (no _total suffix), so its dashboards work
    assert '\nnv_inference_request_success{model="adder",version="1"} 7\n' in response.text
    assert "# TYPE nv_inference_count counter\n" in response.text

    def expect(name: str, read) -> None:
        family = families[name]
        assert family.type == "counter", name
        assert per_version(family) == {key: read(stat) for key, stat in stats.items()}, name

    expect("nv_inference_request_success", lambda s: s["inference_stats"]["success"]["count"])
    expect("nv_inference_request_failure", lambda s: s["inference_stats"]["fail"]["count"])
    expect("nv_inference_count", lambda s: s["inference_count"])
    expect("nv_inference_exec_count", lambda s: s["execution_count"])
    expect("nv_inference_request_duration_us", lambda s: s["inference_stats"]["success"]["ns"] // 1000)
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        expect(f"nv_inference_{phase}_duration_us", lambda s, p=phase: s["inference_stats"][p]["ns"] // 1000)
    assert per_version(families["nv_inference_count"]) == {
        ("adder", "1"): 20,
        ("plain", "1"): 3,
        ("plain", "2"): 2,
        ("streamer", "1"): 0,
        ("not_utf8", "1"): 1,
    }
    assert families["nv_inference_request_success"].documentation == (
        "Number of successful inference requests, all batch sizes"
    )


def test_metrics_port_serves_only_metrics(stats_server: tuple[ServerProcess, int, int]) -> None:
    base = f"http://127.0.0.1:{stats_server[0].metrics_port}"
    with httpx.Client(base_url=base, timeout=15) as client:
        assert client.get("/v2/health/live").status_code == 404
        refused = client.post("/metrics", content=b"x" * 100_000)
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
        again = client.get("/metrics")  # the same connection, still usable
        assert again.status_code == 200 and "nv_inference_exec_count" in again.text
    with make_client(base, "http2") as client:
        assert "nv_inference_exec_count" in client.get("/metrics").text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_allow_metrics_false_serves_no_metrics(repo: Path, start_server) -> None:
    write_model(repo, "plain", int32_config("plain", dims="[ 2 ]"), {1: FAILING_ON_NEGATIVE})
    port = free_port()
    server = start_server(repo, extra_args=("--allow-metrics", "false", "--metrics-port", str(port)))
    assert server.metrics_port is None
    assert "Metrics listening" not in server.log_text()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    # statistics are still served over HTTP
    response = httpx.get(server.base_url + "/v2/models/plain/stats", timeout=15)
    assert response.status_code == 200 and response.json()["model_stats"][0]["inference_count"] == 0


def test_unloaded_model_leaves_stats_and_metrics(repo: Path, start_server) -> None:
    write_model(repo, "plain", int32_config("plain", dims="[ 2 ]"), {1: FAILING_ON_NEGATIVE})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit", "--load-model", "plain"))
    with httpx.Client(base_url=server.base_url, timeout=15) as client:
        assert (
            client.post("/v2/models/plain/infer", json=infer_body([[1, 2]], batched=False)).status_code == 200
        )
        assert per_version(scrape(server)[1]["nv_inference_count"]) == {("plain", "1"): 1}
        assert client.post("/v2/repository/models/plain/unload").status_code == 200
        assert client.get("/v2/models/stats").json() == {"model_stats": []}
        assert_error(client.get("/v2/models/plain/stats"), 503, "requested model 'plain' is not available")
        assert per_version(scrape(server)[1]["nv_inference_count"]) == {}


def test_counters_go_on_across_a_reload(repo: Path, start_server) -> None:
    write_model(repo, "plain", int32_config("plain", dims="[ 2 ]"), {1: FAILING_ON_NEGATIVE})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit", "--load-model", "plain"))
    body = infer_body([[1, 2]], batched=False)
    with httpx.Client(base_url=server.base_url, timeout=15) as client:
        for _ in range(3):
            assert client.post("/v2/models/plain/infer", json=body).status_code == 200
        assert client.post("/v2/repository/models/plain/load").status_code == 200  # a reload
        for _ in range(2):
            assert client.post("/v2/models/plain/infer", json=body).status_code == 200
        (stats,) = client.get("/v2/models/plain/stats").json()["model_stats"]
    assert stats["inference_count"] == 5
    assert stats["inference_stats"]["success"]["count"] == 5
    assert per_version(scrape(server)[1]["nv_inference_count"]) == {("plain", "1"): 5}
