"""`--workers 2 --worker-models inline` (issue 38): a model that runs each request at once on the event
loop also runs in each worker, which answers it without crossing to the engine. The model here answers
with the pid of the process that ran it, so which process ran a request is read, not guessed; the kernel
spreads fresh connections over the processes. Statistics and metrics count every process's requests,
exactly; a reload and an unload reach every worker's instance (its finalize runs); while the engine
traces, requests go to it; a model with a batcher stays in the engine."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
from e2e_helpers import ServerProcess, write_model
from grpc_helpers import call

import tensorgate.proto.inference as pb
from bench.procs import process_tree

pytestmark = pytest.mark.ours

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "MARK" data_type: TYPE_INT32 dims: [ 1 ] }}
]
{policy}
"""
# The pid that ran the request, the file's mark, and a failure for a negative input; finalize leaves
# its pid in a file, so a test sees which processes unloaded an instance.
MODEL = """
import os
import numpy as np

class Model:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        if (x < 0).any():
            raise ValueError("negative input")
        return {{"PID": np.full(x.shape, os.getpid(), np.int64), "MARK": np.full(x.shape, {mark}, np.int32)}}

    def finalize(self):
        with open({finalized!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
"""
CONNECTIONS = 40  # fresh ones: two processes both get some (each goes to either: 2 ** -39 they do not)


def write_models(repo: Path, finalized: Path, mark: int = 1) -> None:
    code = MODEL.format(mark=mark, finalized=str(finalized))
    write_model(repo, "whoami", CONFIG.format(name="whoami", policy=""), {1: code})
    batched = CONFIG.format(name="batched", policy="dynamic_batching { }")
    write_model(repo, "batched", batched, {1: code})


def start(start_server, repo: Path, *args: str) -> ServerProcess:
    flags = ("--workers", "2", "--worker-models", "inline", "--model-control-mode", "explicit")
    return start_server(repo, extra_args=(*flags, "--load-model", "*", *args))


def infer(server: ServerProcess, model: str = "whoami", value: int = 1) -> tuple[int, dict]:
    """One request on a fresh connection: its status and JSON answer."""
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def answered_by(server: ServerProcess, model: str = "whoami") -> tuple[set[int], set[int]]:
    """The pids that answered CONNECTIONS requests, and the marks they answered."""
    pids, marks = set(), set()
    for _ in range(CONNECTIONS):
        status, answer = infer(server, model)
        assert status == 200, answer
        outputs = {o["name"]: o["data"][0] for o in answer["outputs"]}
        pids.add(outputs["PID"])
        marks.add(outputs["MARK"])
    return pids, marks


def get(server: ServerProcess, path: str, port: int | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port or server.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def post(server: ServerProcess, path: str, body: dict | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body or {}))
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def rest_counts(server: ServerProcess) -> tuple[int, int, int, int]:
    """inference_count, execution_count, success count and fail count of whoami, from GET .../stats."""
    status, body = get(server, "/v2/models/whoami/stats")
    assert status == 200, body
    (stats,) = json.loads(body)["model_stats"]
    inference = stats["inference_stats"]
    return (
        stats["inference_count"],
        stats["execution_count"],
        inference["success"]["count"],
        inference["fail"]["count"],
    )


def grpc_counts(server: ServerProcess) -> tuple[int, int, int, int]:
    async def ask(stub) -> pb.ModelStatisticsResponse:
        return await stub.model_statistics(pb.ModelStatisticsRequest(name="whoami"))

    (stats,) = call(server, ask).model_stats
    inference = stats.inference_stats
    return stats.inference_count, stats.execution_count, inference.success.count, inference.fail.count


def metric(server: ServerProcess, name: str) -> float:
    """A counter of whoami, summed over its other labels (a failure's reason)."""
    status, body = get(server, "/metrics", server.metrics_port)
    assert status == 200
    lines = [line for line in body.decode().splitlines() if line.startswith(name + "{")]
    values = [float(line.rsplit(" ", 1)[1]) for line in lines if 'model="whoami"' in line]
    assert values, f"no {name} for whoami in the metrics"
    return sum(values)


def test_an_inline_model_answers_in_every_process_and_a_batched_one_in_the_engine(
    start_server, repo, tmp_path
):
    write_models(repo, tmp_path / "finalized")
    server = start(start_server, repo)
    processes = set(process_tree(server.proc.pid))
    pids, _ = answered_by(server)
    assert len(pids) == 2 and pids <= processes  # the engine and its worker
    batched, _ = answered_by(server, "batched")
    assert batched == {server.proc.pid}  # a batcher is the engine's: every request crosses to it
    assert "runs 'whoami' version 1 itself" in server.log_text()


def test_without_the_flag_every_request_runs_in_the_engine(start_server, repo, tmp_path):
    write_models(repo, tmp_path / "finalized")
    server = start_server(repo, extra_args=("--workers", "2"))
    pids, _ = answered_by(server)
    assert pids == {server.proc.pid}


def test_statistics_and_metrics_count_every_process_s_requests_at_once(start_server, repo, tmp_path):
    write_models(repo, tmp_path / "finalized")
    server = start(start_server, repo)
    before = rest_counts(server)
    assert grpc_counts(server) == before
    pids, _ = answered_by(server)
    assert len(pids) == 2
    failed = 0
    for _ in range(CONNECTIONS // 4):
        status, answer = infer(server, value=-1)
        assert status in (400, 500), answer
        assert "negative input" in answer["error"]
        failed += 1
    # read at once: the engine asks each worker for its counts before it answers
    after = rest_counts(server)
    delta = tuple(a - b for a, b in zip(after, before, strict=True))
    assert delta == (CONNECTIONS, CONNECTIONS, CONNECTIONS, failed)
    assert grpc_counts(server) == after
    assert metric(server, "nv_inference_count") == after[0]
    assert metric(server, "nv_inference_exec_count") == after[1]
    assert metric(server, "nv_inference_request_success") == after[2]
    assert metric(server, "nv_inference_request_failure") == after[3]


def test_a_reload_and_an_unload_reach_every_worker_s_instance(start_server, repo, tmp_path):
    finalized = tmp_path / "finalized"
    write_models(repo, finalized)
    server = start(start_server, repo)
    pids, marks = answered_by(server)
    assert len(pids) == 2 and marks == {1}
    (repo / "whoami" / "1" / "model.py").write_text(MODEL.format(mark=2, finalized=str(finalized)))
    assert post(server, "/v2/repository/models/whoami/load") == 200
    reloaded, marks = answered_by(server)  # answered after the load: every process has the new files
    assert marks == {2} and reloaded == pids
    assert set(map(int, finalized.read_text().split())) == pids  # each old instance finalized
    assert post(server, "/v2/repository/models/whoami/unload") == 200
    for _ in range(CONNECTIONS // 2):
        status, answer = infer(server)
        assert status == 503 and "unloaded" in answer["error"], answer
    finals = [int(pid) for pid in finalized.read_text().split()]
    assert sorted(finals) == sorted([*pids, *pids])  # the reloaded instances finalized too


def test_while_the_engine_traces_every_request_goes_to_it(start_server, repo, tmp_path):
    write_models(repo, tmp_path / "finalized")
    trace_file = tmp_path / "trace.json"
    server = start(start_server, repo, "--trace-config", f"triton,file={trace_file}")
    setting = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    assert post(server, "/v2/trace/setting", setting) == 200
    pids, _ = answered_by(server)
    assert pids == {server.proc.pid}  # the engine samples and writes every trace
    assert post(server, "/v2/trace/setting", {"trace_level": ["OFF"]}) == 200
    pids, _ = answered_by(server)
    assert len(pids) == 2


# Loads in the engine (whose parent is the test) and fails in a worker (whose parent is the engine).
ONLY_IN_THE_ENGINE = """
import os
import numpy as np

class Model:
    def initialize(self, config):
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            if b"tensorgate.server" in f.read():
                raise RuntimeError("not in a worker")

    def execute(self, inputs):
        x = inputs["INPUT0"]
        return {"PID": np.full(x.shape, os.getpid(), np.int64), "MARK": np.full(x.shape, 3, np.int32)}
"""


def test_a_model_that_does_not_load_in_a_worker_is_served_by_the_engine(start_server, repo):
    write_model(repo, "whoami", CONFIG.format(name="whoami", policy=""), {1: ONLY_IN_THE_ENGINE})
    server = start(start_server, repo)
    pids, marks = answered_by(server)
    assert pids == {server.proc.pid} and marks == {3}
    assert "'whoami' version 1 runs in the engine: failed to load" in server.log_text()
    assert "not in a worker" in server.log_text()
