"""Faults between a front-end worker and the engine (`--workers`, server/frontend.py, server/engine.py,
server/link.py), injected into a real engine: each call still ends, with an error answer, in bounded time,
and the server serves on.

The faults are injected by running the engine under `fault_injection` (written per test into a temporary
folder): it wraps two of the engine's functions before the server starts. Its workers are started
unchanged (`python -m tensorgate.server`), so every client below talks to an unmodified worker:
- an answer that cannot cross to the worker (`codec.ipc.response_out` raises NotImplementedError, as
  msgspec's encoder does for a value it cannot write) for model `unsendable`;
- a call the engine never answers (`server.worker_link.WorkerLink._infer` drops it, as a lost message
  would) for model `unanswered`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2e_helpers import ServerProcess, write_model
from test_e2e_workers import connections_on_every_process, request

pytestmark = pytest.mark.ours

FAULTS = """
import tensorgate.codec.ipc as ipc
import tensorgate.server.worker_link as worker_link

_response_out = ipc.response_out
_infer = worker_link.WorkerLink._infer


def response_out(response, arenas=None):
    if response.model_name == "unsendable":
        raise NotImplementedError("set cannot cross to another process")
    return _response_out(response, arenas)


def infer(self, call_id, item):
    if item.model_name == "unanswered":
        return
    return _infer(self, call_id, item)


ipc.response_out = response_out
worker_link.WorkerLink._infer = infer
"""
IDENTITY_CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
IDENTITY = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': inputs['INPUT0']}\n"
# Sleeps 0.3 s a request in as many threads as it is given requests; records the most it held at once.
SLOW = """
import pathlib, threading, time

HERE = pathlib.Path(__file__).parent


class Model:
    def initialize(self, config):
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    async def execute(self, inputs):
        import asyncio
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            (HERE / "most").write_text(str(self.most))
        await asyncio.sleep(0.3)
        with self.lock:
            self.now -= 1
        return {'OUTPUT0': inputs['INPUT0']}
"""


class InjectedEngine(ServerProcess):
    """The server with its engine run under `fault_injection` (found on PYTHONPATH)."""

    @property
    def command(self) -> list[str]:
        run = "import fault_injection, runpy; runpy.run_module('tensorgate.server', run_name='__main__')"
        return [sys.executable, "-c", run, *super().command[3:]]


@pytest.fixture
def server(repo: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "fault_injection.py").write_text(FAULTS)
    for name in ("unsendable", "unanswered", "fine"):
        write_model(repo, name, IDENTITY_CONFIG % name, {1: IDENTITY})
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args = ("--workers", "2", "--worker-call-timeout", "1", "--worker-max-calls", "2")
    started = InjectedEngine(repo, tmp_path / "server.log", extra_args=args, env=env).start()
    yield started
    assert started.stop() == 0


def infer(sock: socket.socket, server: ServerProcess, model: str) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}]})
    status, answer = request(sock, server, f"/v2/models/{model}/infer", body.encode())
    return status, json.loads(answer)


def on_the_worker(server: ServerProcess) -> socket.socket:
    """A connection that the worker (not the engine) accepted."""
    held = connections_on_every_process(server, 2)
    held.pop(server.proc.pid).close()
    (worker,) = held.values()
    return worker


def test_an_answer_that_cannot_cross_is_an_error_answer_and_the_worker_serves_on(
    server: ServerProcess,
) -> None:
    worker = on_the_worker(server)
    started = time.monotonic()
    status, answer = infer(worker, server, "unsendable")
    assert status == 500 and answer == {"error": "internal error: NotImplementedError"}
    assert time.monotonic() - started < 5
    status, answer = infer(worker, server, "fine")
    assert status == 200 and answer["outputs"][0]["data"] == [1, 2]
    assert "an answer could not be sent to the worker" in server.log_text()


def test_a_call_the_engine_never_answers_fails_at_the_workers_deadline(server: ServerProcess) -> None:
    worker = on_the_worker(server)
    started = time.monotonic()
    status, answer = infer(worker, server, "unanswered")
    waited = time.monotonic() - started
    assert status == 503, answer
    assert answer["error"] == "the engine did not answer within 1 s (--worker-call-timeout)"
    assert 1 <= waited < 4
    status, answer = infer(worker, server, "fine")
    assert status == 200 and answer["outputs"][0]["data"] == [1, 2]


def test_past_max_calls_the_engine_stops_reading_and_every_call_is_still_answered(
    repo: Path, tmp_path: Path
) -> None:
    """`--worker-max-calls 2`: eight clients of one worker at once reach a model that would take all
    eight together; it never holds more than two of the worker's, and every client is answered."""
    version = write_model(repo, "slow", IDENTITY_CONFIG.replace("%s", "slow"), {1: SLOW}) / "1"
    (version.parent / "config.pbtxt").write_text(
        IDENTITY_CONFIG % "slow" + "instance_group [ { count: 8 kind: KIND_CPU } ]\n"
    )
    args = ("--workers", "2", "--worker-max-calls", "2")
    server = ServerProcess(repo, tmp_path / "server.log", extra_args=args).start()
    try:
        sockets = [on_the_worker(server) for _ in range(8)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda sock: infer(sock, server, "slow"), sockets))
        assert [status for status, _ in answers] == [200] * 8
        assert all(answer["outputs"][0]["data"] == [1, 2] for _, answer in answers)
        assert int((version / "most").read_text()) == 2
    finally:
        assert server.stop() == 0
