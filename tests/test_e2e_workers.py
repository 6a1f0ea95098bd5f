"""`--workers N` (issue 26): front-end processes on the same ports beside the engine that holds the models.
A batch mixes requests that came in on different processes; a worker that dies is replaced while the
others serve; the server goes down with its engine, every worker with it, saying why; SIGTERM leaves no
process behind. Which process holds a connection is read from /proc (the socket's inode), not guessed."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    EXAMPLES,
    ServerProcess,
    identity_binary_request,
    wait_for_file,
    wait_until_refused,
    write_model,
)

from bench.procs import process_tree

pytestmark = pytest.mark.ours

BATCH_CONFIG = """
name: "pair"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000 }
"""
DOUBLE = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': inputs['INPUT0'] * 2}\n"


def owner(server: ServerProcess, client: socket.socket) -> int:
    """The pid of the server process that accepted `client`'s connection."""
    port = client.getsockname()[1]
    inodes = {}
    for pid in process_tree(server.proc.pid):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            ours = int(local.split(":")[1], 16) == server.port and int(remote.split(":")[1], 16) == port
            if ours and inode in inodes:
                return inodes[inode]
    raise AssertionError(f"no server process holds the connection from port {port}")


def request(sock: socket.socket, server: ServerProcess, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request on `sock`; its status and body (the answers here are small and whole)."""
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n" if body else ""
    head = head or f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n"
    sock.sendall(head.encode() + body)
    data = b""
    while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed: {data!r}"
        data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data[data.index(b"\r\n\r\n") + 4 :]


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def connections_on_every_process(server: ServerProcess, count: int) -> dict[int, socket.socket]:
    """A connection held by each of the server's `count` processes (the kernel spreads new connections
    over them; enough are opened that each gets one)."""
    held: dict[int, socket.socket] = {}
    spare = []
    for _ in range(200):
        sock = socket.create_connection(server.address, timeout=10)
        assert request(sock, server, "/v2/health/live")[0] == 200  # accepted and served
        pid = owner(server, sock)
        if pid in held:
            spare.append(sock)
        else:
            held[pid] = sock
        if len(held) == count:
            break
    for sock in spare:
        sock.close()
    assert len(held) == count, f"connections landed on {len(held)} of {count} processes"
    return held


def test_a_batch_mixes_requests_from_every_front_end(start_server, repo: Path) -> None:
    write_model(repo, "pair", BATCH_CONFIG, {1: DOUBLE})
    server = start_server(repo, extra_args=("--workers", "2"))
    held = connections_on_every_process(server, 2)
    assert server.proc.pid in held, "the engine serves connections too"
    results = {}

    def infer(pid: int, sock: socket.socket, value: int) -> None:
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
        )
        results[pid] = request(sock, server, "/v2/models/pair/infer", body.encode())

    threads = [
        threading.Thread(target=infer, args=(pid, sock, i + 1)) for i, (pid, sock) in enumerate(held.items())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    answers = sorted(json.loads(body)["outputs"][0]["data"][0] for status, body in results.values())
    assert answers == [2, 4]
    stats = httpx.get(f"{server.base_url}/v2/models/pair/stats", timeout=10).json()["model_stats"][0]
    # both requests in one execution: it was not the 20 s queue delay that let either go
    assert (stats["inference_count"], stats["execution_count"]) == (2, 1), stats
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(2, 1)]
    for sock in held.values():
        sock.close()


def workers_of(server: ServerProcess) -> set[int]:
    """The server's front-end workers (its other children are the python models' processes)."""
    workers = set()
    for pid in set(process_tree(server.proc.pid)) - {server.proc.pid}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--worker-of" in f.read().split(b"\0"):
                    workers.add(pid)
        except OSError:
            continue  # gone meanwhile
    return workers


def test_with_engine_front_end_false_every_connection_reaches_a_worker(start_server) -> None:
    """What makes `make test`'s --workers pass reach a worker every time (e2e_helpers.py); the test above
    is its control: by default the engine accepts connections too."""
    server = start_server(EXAMPLES, extra_args=("--workers", "2", "--engine-front-end", "false"))
    (worker,) = workers_of(server)
    owners = set()
    for _ in range(24):
        with socket.create_connection(server.address, timeout=10) as sock:
            assert request(sock, server, "/v2/health/live")[0] == 200
            owners.add(owner(server, sock))
    assert owners == {worker}


def test_engine_front_end_false_needs_workers(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tensorgate.server", "serve", "--model-repository", str(EXAMPLES)]
    refused = subprocess.run(
        [*command, "--engine-front-end", "false"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "--engine-front-end false needs --workers 2 or more" in refused.stderr


def test_a_worker_that_dies_is_replaced_while_the_others_serve(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--workers", "3"))
    before = workers_of(server)
    assert len(before) == 2
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while len(workers_of(server) - before) < 1 or victim in workers_of(server):
        assert time.monotonic() < deadline, "the dead worker was not replaced"
        with httpx.Client(base_url=server.base_url, timeout=10) as client:  # the others serve meanwhile
            assert client.get("/v2/health/live").status_code == 200
        time.sleep(0.05)
    assert f"exited with {-signal.SIGKILL}: starting another" in server.log_text()
    held = connections_on_every_process(server, 3)  # every process serves, the new worker too
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]})
    for sock in held.values():
        status, answer = request(sock, server, "/v2/models/identity_fp32/infer", body.encode())
        assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]
        sock.close()


def test_the_server_goes_down_with_its_engine(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--workers", "2"))
    workers = workers_of(server)
    assert len(workers) == 1
    server.proc.kill()  # the engine, as the OOM killer would
    assert server.proc.wait(10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived its engine"
        time.sleep(0.02)
    assert "the engine (pid" in server.log_text() and "is gone; exiting" in server.log_text()
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=2)
    server.killed = True  # its exit was the point; the fixture must not call it a failure


# Writes `entered-<value>` on entry, then holds its request until the test writes `release`: a request in
# flight for as long as the test needs. Three instances: one request from each process at once.
HELD = {
    "name": "held",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
    "instance_group": [{"count": 3, "kind": "KIND_CPU"}],
}
HELD_PY = """
import asyncio
import time
from pathlib import Path

HERE = Path(__file__).parent


class Model:
    async def execute(self, inputs):
        (HERE / f"entered-{int(inputs['INPUT0'][0])}").touch()
        deadline = time.monotonic() + 60
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""


def test_sigterm_drains_every_process_and_leaves_none(start_server, repo: Path) -> None:
    """A request in flight on a connection of each process (the engine and its two workers) when SIGTERM
    comes is answered, once every process has stopped listening; then nothing of the server is left."""
    held_model = write_model(repo, "held", HELD, {1: HELD_PY}) / "1"
    shutil.copytree(EXAMPLES / "preprocess", repo / "preprocess")  # a Triton-API model: a process of its own
    server = start_server(repo, extra_args=("--workers", "3"))
    everyone = set(process_tree(server.proc.pid))
    assert len(workers_of(server)) == 2
    assert len(everyone) > 3  # the engine, its workers, and the process of the Triton-API model
    held = connections_on_every_process(server, 3)
    answers: dict[int, tuple[int, bytes] | BaseException] = {}

    def infer(pid: int, sock: socket.socket) -> None:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [pid]}]})
        try:
            answers[pid] = request(sock, server, "/v2/models/held/infer", body.encode())
        except (OSError, AssertionError) as e:  # the connection died unanswered
            answers[pid] = e

    callers = [threading.Thread(target=infer, args=(pid, sock)) for pid, sock in held.items()]
    for caller in callers:
        caller.start()
    for pid in held:
        wait_for_file(held_model / f"entered-{pid}")  # in the model, every one
    server.send_signal(signal.SIGTERM)
    # every process has closed its listening sockets: each is shutting down, its request still held
    assert wait_until_refused(server.address, 15) is not None, "the server still accepts after SIGTERM"
    assert server.running()
    (held_model / "release").touch()
    for caller in callers:
        caller.join(15)
    assert answers.keys() == held.keys(), "a request was still waiting"
    for pid, answer in answers.items():
        role = "engine" if pid == server.proc.pid else "worker"
        assert not isinstance(answer, BaseException), (role, pid, answer)
        status, body = answer
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2 * pid], (role, status, body)
    assert server.wait() == 0
    assert not [pid for pid in everyone if os.path.exists(f"/proc/{pid}")], "a process outlived the server"
    for sock in held.values():
        sock.close()


IDENTITY = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': inputs['INPUT0']}\n"
NEGATE = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': -inputs['INPUT0']}\n"
FP32_CONFIG = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}
MIB = 1 << 20


def binary_trip(sock: socket.socket, model: str, values: np.ndarray) -> tuple[int, bytes]:
    """A v2 binary infer of FP32 `values` on `sock`: the status, and the output's bytes (or the body)."""
    body, headers = identity_binary_request(values)
    connection = http.client.HTTPConnection("127.0.0.1")
    connection.sock = sock
    connection.request("POST", f"/v2/models/{model}/infer", body, headers)
    response = connection.getresponse()
    answer = response.read()
    length = response.getheader("Inference-Header-Content-Length")
    return response.status, answer[int(length) :] if length else answer


def test_large_tensors_cross_in_shared_memory_whose_regions_are_used_again(start_server, repo) -> None:
    # 16 MiB of shared memory each way: eight 6 MiB round trips through the worker pass only if every
    # region is handed out again once both processes are done with it
    write_model(repo, "negate", {"name": "negate", **FP32_CONFIG}, {1: NEGATE})
    write_model(repo, "identity", {"name": "identity", **FP32_CONFIG}, {1: IDENTITY})
    server = start_server(repo, extra_args=("--workers", "2", "--worker-arena-bytes", str(16 * MIB)))
    held = connections_on_every_process(server, 2)
    (worker,) = (sock for pid, sock in held.items() if pid != server.proc.pid)
    for trip in range(8):
        values = np.arange(6 * MIB // 4, dtype=np.float32) + trip
        # identity answers with a view of its input: the worker's own region goes back to it
        assert binary_trip(worker, "identity", values) == (200, values.tobytes())
        # negate answers with a new array: written into the engine's region, read by the worker
        assert binary_trip(worker, "negate", values) == (200, (-values).tobytes())

    too_large = np.ones(20 * MIB // 4, dtype=np.float32)
    status, body = binary_trip(worker, "identity", too_large)
    assert status == 413, body
    assert "--worker-arena-bytes" in json.loads(body)["error"]
    # the engine's own connections do not cross: the same request is answered there
    assert binary_trip(held[server.proc.pid], "identity", too_large) == (200, too_large.tobytes())
    assert binary_trip(worker, "negate", values) == (200, (-values).tobytes())
    for sock in held.values():
        sock.close()


# A plain `execute` runs on the engine's event loop: it writes `entered`, holds its input (a view of the
# worker's shared memory) until the test writes `release`, then writes a digest of what it read and answers
# with that view. It keeps the input, as a model may: the engine closes the dead worker's memory while an
# array over it lives on. (An `async def execute` would not do: the engine cancels the calls of a worker
# that is gone, and the request would never finish.)
HOLDING_IDENTITY = """
import hashlib
import time
from pathlib import Path

HERE = Path(__file__).parent


class Model:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        (HERE / "entered").touch()
        deadline = time.monotonic() + 60
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        (HERE / "read").write_text(hashlib.sha256(x.tobytes()).hexdigest())
        self.kept = x
        return {"OUTPUT0": x}
"""


def wait_until(condition, what: str, timeout: float = 20) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def inference_stats(server: ServerProcess, sock: socket.socket, model: str) -> dict:
    status, body = request(sock, server, f"/v2/models/{model}/stats")
    assert status == 200, body
    return json.loads(body)["model_stats"][0]["inference_stats"]


def test_a_worker_killed_while_the_engine_works_on_its_tensors(start_server, repo) -> None:
    # the engine holds arrays over the dead worker's shared memory: it finishes that request without
    # harm, and the worker that replaces it moves large tensors through shared memory of its own
    slow = write_model(repo, "slow", {"name": "slow", **FP32_CONFIG}, {1: HOLDING_IDENTITY}) / "1"
    write_model(repo, "identity", {"name": "identity", **FP32_CONFIG}, {1: IDENTITY})
    server = start_server(repo, extra_args=("--workers", "2", "--worker-arena-bytes", str(16 * MIB)))
    held = connections_on_every_process(server, 2)
    (victim,) = (pid for pid in held if pid != server.proc.pid)
    values = np.arange(6 * MIB // 4, dtype=np.float32)
    outcome = []
    caller = threading.Thread(target=lambda: outcome.append(_trip_or_error(held[victim], "slow", values)))
    caller.start()
    wait_for_file(slow / "entered")  # the request is in the engine, in the model, over the worker's memory
    os.kill(victim, signal.SIGKILL)
    caller.join(10)
    assert outcome and outcome[0][0] is None, outcome  # its connection died with its worker
    (slow / "release").touch()  # the model reads the dead worker's memory now, and answers
    engine = held[server.proc.pid]  # asked on the engine's own connection: no worker in the way
    wait_until(
        lambda: inference_stats(server, engine, "slow")["success"]["count"] == 1, "the request counted"
    )
    assert inference_stats(server, engine, "slow")["fail"]["count"] == 0
    assert (slow / "read").read_text() == hashlib.sha256(values.tobytes()).hexdigest()
    wait_until(lambda: bool(workers_of(server) - {victim}), "the dead worker replaced")
    assert victim not in workers_of(server)
    fresh = connections_on_every_process(server, 2)
    for pid, sock in fresh.items():
        assert binary_trip(sock, "identity", values + pid) == (200, (values + pid).tobytes())
        sock.close()
    assert "Traceback" not in server.log_text()
    engine.close()


def _trip_or_error(sock: socket.socket, model: str, values: np.ndarray) -> tuple[int | None, bytes]:
    try:
        return binary_trip(sock, model, values)
    except (OSError, http.client.HTTPException):
        return None, b""


def test_the_metrics_report_the_memory_of_every_process(start_server) -> None:
    """Each process of the server by its role and pid, resident and proportional: the engine, its
    worker, and the processes of the example repository's Triton-API python models."""
    server = start_server(EXAMPLES, extra_args=("--workers", "2"))
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    samples: dict[str, dict[tuple[str, int], float]] = {}
    for line in text.splitlines():
        for measure in ("resident", "proportional"):
            prefix = f"tensorgate_process_{measure}_memory_bytes{{"
            if line.startswith(prefix):
                labels, value = line[len(prefix) :].split("} ")
                fields = dict(pair.split("=") for pair in labels.split(","))
                key = (fields["process"].strip('"'), int(fields["pid"].strip('"')))
                samples.setdefault(measure, {})[key] = float(value)
    resident, proportional = samples["resident"], samples["proportional"]
    assert set(resident) == set(proportional)
    roles = [role for role, _ in resident]
    assert roles.count("engine") == 1 and roles.count("worker") == 1
    assert roles.count("python_model") >= 3  # preprocess, postprocess, sequence_python
    assert ("engine", server.proc.pid) in resident
    assert {pid for role, pid in resident if role == "worker"} == workers_of(server)
    assert all(value > 1 << 20 for value in resident.values())
    assert sum(proportional.values()) < sum(resident.values())  # shared pages counted once in all
