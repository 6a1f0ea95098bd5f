"""Python model instances in processes of their own (`EXECUTION_MODE process`, server/backends/process.py):
each instance a child process of the server; a crash (a signal, an exit, a kill as the OOM killer's), or
an execute past EXECUTE_TIMEOUT_MS, fails that instance's requests with an error naming model, instance
and cause, restarts it, counts the restart in the statistics and the metrics, and nothing else notices;
unload and reload; the processes die with the server; our python API (BYTES, parameters) from a process;
a model's own interpreter (EXECUTION_ENV_PATH, a venv). A real server; REST clients.

The python API tests of tests/test_e2e_triton_python.py (batches, per-request errors, initialize's args,
the Logger, decoupled models, BLS, finalize) run in both modes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, write_model
from grps_helpers import gtensor, streamed

PROCESS = 'parameters { key: "EXECUTION_MODE" value: { string_value: "process" } }\n'

# MODE 0 answers its instance's pid; 1 aborts, 2 exits 3, 3 is killed (SIGKILL, as the OOM killer does),
# 4 sleeps past the execute timeout. A Triton-API model with a config as Triton's: no EXECUTION_MODE, so
# its instances are processes by default (--python-execution-mode auto), and only the timeout is ours.
FRAGILE = """
name: "fragile"
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "EXECUTE_TIMEOUT_MS" value: { string_value: "1500" } }
"""
FRAGILE_PY = """
import os, signal, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        name, pid, parent = args["model_instance_name"], os.getpid(), os.getppid()
        pb_utils.Logger.log_info(f"started {name} pid={pid} parent={parent}")

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 1:
                os.abort()
            if mode == 2:
                os._exit(3)
            if mode == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == 4:
                time.sleep(60)
            pid = np.array([os.getpid()], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info(f"finalized pid={os.getpid()}")
"""

# Our python API: BYTES through the arena, the request's parameters, the interpreter that runs it.
ECHO = """
name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
%s
"""
ECHO_PY = """
import json, os, sys
import numpy as np

class Model:
    def execute(self, inputs, parameters):
        info = {"pid": os.getpid(), "python": sys.executable, "parameters": parameters}
        upper = np.array([t.decode().upper().encode() for t in inputs["TEXT"]], dtype=object)
        return {"TEXT": upper, "INFO": np.array([json.dumps(info).encode()], dtype=object)}
"""


# grps's app_monitor from a process: each call recorded by the server (its metrics, sampled each second).
RECORDER_PY = """
import numpy as np
from grps_framework.monitor.monitor import app_monitor

class Model:
    def execute(self, inputs):
        app_monitor.inc("process_calls", 1)
        app_monitor.max("process_longest", float(len(inputs["TEXT"])))
        try:
            app_monitor.avg("process_calls", 1)  # aggregated as inc already: refused here
        except ValueError as e:
            refused = str(e)
        return {"TEXT": inputs["TEXT"], "INFO": np.array([refused.encode()], dtype=object)}
"""


# Our API's streaming model from a process: one answer per yield; N = 99 aborts the process mid-stream.
COUNTER = (
    """
name: "counter"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
    + PROCESS
)
COUNTER_PY = """
import os
import numpy as np

class Model:
    async def execute_stream(self, inputs):
        n = int(inputs["N"][0])
        for i in range(min(n, 3), 0, -1):
            yield {"I": np.array([i], np.int32)}
        if n == 99:
            os.abort()
"""


ENV = 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } }\n'
# The interpreter its process runs: the path it was started as (sys.executable resolves no links).
ENV_PY = ECHO_PY.replace(
    '"python": sys.executable,',
    '"python": os.environ.get("_", ""), "from_tarball": os.environ.get("FROM_TARBALL"),',
)


# BLS from threads the model starts, while execute waits for them: each calls fragile (in its own
# processes), whose answer (its instance's pid) this model answers.
FANOUT = (
    """
name: "fanout"
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 2 ] } ]
"""
    + PROCESS
)
FANOUT_PY = """
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import triton_python_backend_utils as pb_utils

def call(mode):
    request = pb_utils.InferenceRequest(
        model_name="fragile", inputs=[pb_utils.Tensor("MODE", mode)], requested_output_names=["PID"])
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "PID").as_numpy()[0]

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        with ThreadPoolExecutor(2) as pool:
            for request in requests:
                mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
                pids = np.array(list(pool.map(call, [mode, mode])), dtype=np.int64)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pids)]))
        return responses
"""


# Two instances without the dynamic batcher: a small batch may wait in a busy instance's socket behind the
# one it executes (server/backends/process.py). MODE 0 answers X + 1 at once; 1 and 5 each leave a marker
# file `entered_<mode>` beside model.py, wait there until a file `release` appears, then 1 aborts and 5
# answers.
QUEUE = (
    """
name: "queue"
backend: "python"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
    + PROCESS
)
QUEUE_PY = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode in (1, 5):
                here = os.path.dirname(__file__)
                open(os.path.join(here, f"entered_{mode}"), "w").close()
                deadline = time.monotonic() + 30
                while not os.path.exists(os.path.join(here, "release")) and time.monotonic() < deadline:
                    time.sleep(0.01)
            if mode == 1:
                os.abort()
            pid = np.array([os.getpid()], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", x + 1), pb_utils.Tensor("PID", pid)]))
        return responses
"""


def queue(server: ServerProcess, x: list[int], mode: int = 0) -> httpx.Response:
    body = {
        "inputs": [
            {"name": "X", "datatype": "INT32", "shape": [len(x)], "data": x},
            {"name": "MODE", "datatype": "INT32", "shape": [1], "data": [mode]},
        ]
    }
    return httpx.post(f"{server.base_url}/v2/models/queue/infer", json=body, timeout=30)


# Our API in a process, with the dynamic batcher: each answer says how many rows its batch had.
GATHERED = (
    """
name: "gathered"
backend: "python"
max_batch_size: 16
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""
    + PROCESS
)
GATHERED_PY = """
import numpy as np

class Model:
    def execute(self, inputs):
        x = inputs["X"]
        return {"Y": x + 1, "ROWS": np.full((len(x), 1), len(x), np.int32)}
"""


def fragile(server: ServerProcess, mode: int) -> httpx.Response:
    body = {"inputs": [{"name": "MODE", "datatype": "INT32", "shape": [1], "data": [mode]}]}
    return httpx.post(f"{server.base_url}/v2/models/fragile/infer", json=body, timeout=30)


def echo(server: ServerProcess, model: str, texts: list[str], **parameters) -> tuple[list[str], dict]:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    if parameters:
        body["parameters"] = parameters
    response = httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    return outputs["TEXT"], json.loads(outputs["INFO"][0])


def restarts(server: ServerProcess, model: str) -> int:
    stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()
    return stats["model_stats"][0]["instance_restarts"]


def wait_until(condition, what: str, timeout: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def started_pids(server: ServerProcess) -> list[tuple[str, int, int]]:
    """(instance name, pid, parent pid) of each start logged by fragile's initialize."""
    found = []
    for line in server.log_text().splitlines():
        if "started fragile_" in line:
            name, pid, parent = line.split("started ")[1].split()
            found.append((name, int(pid.split("=")[1]), int(parent.split("=")[1])))
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def server(start_server, repo: Path) -> Iterator[ServerProcess]:
    write_model(repo, "fragile", FRAGILE, {1: FRAGILE_PY})
    text = '{ key: "TEXT" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }'
    warmup = f'model_warmup [ {{ name: "w" batch_size: 1 count: 2 inputs {text} }} ]\n'
    write_model(repo, "echo", ECHO % ("echo", PROCESS + warmup), {1: ECHO_PY})  # warmed up in its process
    write_model(repo, "echo_thread", ECHO % ("echo_thread", ""), {1: ECHO_PY})
    write_model(repo, "recorder", ECHO % ("recorder", PROCESS), {1: RECORDER_PY})
    write_model(repo, "counter", COUNTER, {1: COUNTER_PY})
    write_model(repo, "fanout", FANOUT, {1: FANOUT_PY})
    write_model(repo, "queue", QUEUE, {1: QUEUE_PY})
    write_model(repo, "gathered", GATHERED, {1: GATHERED_PY})
    # --log-verbose 1: process.py logs each batch that waits behind another in an instance's socket
    explicit = ("--model-control-mode", "explicit", "--load-model", "*", "--log-verbose", "1")
    yield start_server(repo, extra_args=explicit)


def test_each_instance_is_a_process_of_the_server(server: ServerProcess) -> None:
    starts = started_pids(server)
    assert sorted(name for name, _, _ in starts) == ["fragile_0", "fragile_1"]
    assert {parent for _, _, parent in starts} == {server.proc.pid}
    pids = {pid for _, pid, _ in starts}
    assert len(pids) == 2 and server.proc.pid not in pids
    answered = fragile(server, 0)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"][0] in pids
    assert restarts(server, "fragile") == 0


@pytest.mark.parametrize("flag", ["thread", "process"])
def test_the_flag_sets_the_mode_of_every_model_whose_config_names_none(
    start_server, repo: Path, flag: str
) -> None:
    """--python-execution-mode thread runs a Triton-API model in the server's process, process runs one of
    our API in a process of its own; a config's EXECUTION_MODE wins over either."""
    write_model(repo, "fragile", FRAGILE.replace("count: 2", "count: 1"), {1: FRAGILE_PY})
    write_model(repo, "echo_default", ECHO % ("echo_default", ""), {1: ECHO_PY})
    named = "thread" if flag == "process" else "process"
    write_model(repo, "echo_named", ECHO % ("echo_named", PROCESS.replace("process", named)), {1: ECHO_PY})
    server = start_server(repo, extra_args=("--python-execution-mode", flag))
    answered = fragile(server, 0)
    assert answered.status_code == 200, answered.text
    triton_pid = answered.json()["outputs"][0]["data"][0]
    _, ours = echo(server, "echo_default", ["a"])
    _, named_info = echo(server, "echo_named", ["a"])
    in_server = {"thread": True, "process": False}
    assert (triton_pid == server.proc.pid) is in_server[flag]
    assert (ours["pid"] == server.proc.pid) is in_server[flag]
    assert (named_info["pid"] == server.proc.pid) is in_server[named]


def test_by_default_triton_api_models_run_in_processes_and_ours_in_threads(start_server, repo: Path) -> None:
    """Without the flag or EXECUTION_MODE: a model.py importing triton_python_backend_utils gets a
    process per instance, as Triton's stubs; a model of our API runs in the server's threads."""
    write_model(repo, "fragile", FRAGILE.replace("count: 2", "count: 1"), {1: FRAGILE_PY})
    write_model(repo, "echo_default", ECHO % ("echo_default", ""), {1: ECHO_PY})
    server = start_server(repo)
    answered = fragile(server, 0)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"][0] != server.proc.pid
    _, ours = echo(server, "echo_default", ["a"])
    assert ours["pid"] == server.proc.pid


def test_our_api_in_a_process_bytes_and_parameters(server: ServerProcess) -> None:
    texts, info = echo(server, "echo", ["abc", "héllo", ""], mode="loud")
    assert texts == ["ABC", "HÉLLO", ""]
    assert info["parameters"] == {"mode": "loud"} and info["pid"] != server.proc.pid
    big = ["x" * 1_500_000, "y" * 700_000]  # past the 1 MiB the arena starts with: it grows, both ways
    texts, _ = echo(server, "echo", big)
    assert texts == [t.upper() for t in big]
    texts, info = echo(server, "echo_thread", ["x"])
    assert texts == ["X"] and info["pid"] == server.proc.pid  # the in-thread mode, the default


def test_a_streaming_model_of_our_api_streams_from_a_process_and_a_crash_ends_its_stream(
    server: ServerProcess,
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        body = {"model": "counter", "gtensors": {"tensors": [gtensor("N", "DT_INT32", [1], [3])]}}
        answers = streamed(client, body)
        assert [a["gtensors"]["tensors"][0]["flat_int32"] for a in answers] == [[3], [2], [1]]
        body["gtensors"]["tensors"][0]["flat_int32"] = [99]
        answers = streamed(client, body)
    assert [a["gtensors"]["tensors"][0]["flat_int32"] for a in answers[:3]] == [[3], [2], [1]]
    assert "model 'counter' instance 0 exited (signal 6: SIGABRT)" in json.dumps(answers[3:])
    wait_until(lambda: restarts(server, "counter") == 1, "the instance restarted")
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        body["gtensors"]["tensors"][0]["flat_int32"] = [1]
        assert [a["gtensors"]["tensors"][0]["flat_int32"] for a in streamed(client, body)] == [[1]]


def test_bls_from_threads_of_a_model_in_a_process_to_a_model_in_others(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "MODE", "datatype": "INT32", "shape": [1], "data": [0]}]}
    response = httpx.post(f"{server.base_url}/v2/models/fanout/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    pids = response.json()["outputs"][0]["data"]
    assert len(pids) == 2 and set(pids) <= {pid for _, pid, _ in started_pids(server)}


def test_app_monitor_from_a_process_records_in_the_server(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [3], "data": ["a", "b", "c"]}]}
    response = httpx.post(f"{server.base_url}/v2/models/recorder/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    info = {o["name"]: o["data"] for o in response.json()["outputs"]}["INFO"][0]
    assert info == "metric 'process_calls' is aggregated as inc, not avg"

    def recorded() -> bool:
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        return (
            'tensorgate_app_metric{name="process_calls",aggregation="inc"} 1' in metrics
            and 'tensorgate_app_metric{name="process_longest",aggregation="max"} 3' in metrics
        )

    wait_until(recorded, "the model's metrics in the server's")


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        (1, "exited (signal 6: SIGABRT)"),
        (2, "exited (exit code 3)"),
        (3, "exited (signal 9: SIGKILL)"),
        (4, "timed out: execute ran past EXECUTE_TIMEOUT_MS (1500 ms); the instance is restarted"),
    ],
)
def test_a_dead_instance_fails_its_request_alone_and_is_restarted(
    server: ServerProcess, mode: int, cause: str
) -> None:
    """Under load on two other models (one in a process, one in a thread), an instance crashes, exits,
    is killed or hangs: its request fails naming model, instance and cause; the model stays ready and
    answers; the instance comes back, counted; the other models answer every request."""
    stop = False

    def load(model: str) -> int:
        answered = 0
        while not stop:
            texts, _ = echo(server, model, ["a", "b"])
            assert texts == ["A", "B"]
            answered += 1
        return answered

    with ThreadPoolExecutor(3) as pool:
        others = [pool.submit(load, "echo"), pool.submit(load, "echo_thread")]
        try:
            failed = fragile(server, mode)
            assert failed.status_code == 500, failed.text
            error = failed.json()["error"]
            assert error.startswith("model 'fragile' instance ") and error.endswith(cause), error
            assert httpx.get(f"{server.base_url}/v2/models/fragile/ready", timeout=10).status_code == 200
            assert fragile(server, 0).status_code == 200  # the other instance
            wait_until(lambda: restarts(server, "fragile") == 1, "the instance restarted")
        finally:
            stop = True  # the load threads end, so that a failed assert above fails at once
        assert all(other.result() > 0 for other in others)  # none failed (an assert would raise here)
    assert fragile(server, 0).status_code == 200
    assert len(started_pids(server)) == 3  # two at load, one restart
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert 'tensorgate_python_instance_restarts{model="fragile",version="1"} 1' in metrics
    for model in ("echo", "echo_thread"):
        stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()
        assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 0


def test_small_and_large_batches_in_flight_together_each_get_their_own_answer(server: ServerProcess) -> None:
    """Eight clients at once on two instances: small batches travel in the messages and queue behind
    busy instances, large ones (80 KB, past INLINE_BYTES) go through the arena; every answer is its own
    request's."""
    sizes = [16, 20_000, 3, 16, 20_000, 1, 700, 16] * 4

    def one(number: int) -> int:
        x = [(number * 7919 + i) % 100_003 for i in range(sizes[number])]
        answered = queue(server, x)
        assert answered.status_code == 200, answered.text
        outputs = {o["name"]: o["data"] for o in answered.json()["outputs"]}
        assert outputs["Y"] == [v + 1 for v in x]
        return outputs["PID"][0]

    with ThreadPoolExecutor(8) as pool:
        pids = set(pool.map(one, range(len(sizes))))
    assert len(pids) == 2 and server.proc.pid not in pids


def test_a_dynamic_batch_is_gathered_into_the_instance_s_region_and_each_request_gets_its_rows(
    server: ServerProcess,
) -> None:
    """Twelve requests of 32 KiB at once: batched (their rows gathered straight into the instance's
    shared memory, past INLINE_BYTES), each answer is its own request's rows."""
    width = 8192

    def one(number: int) -> int:
        x = [(number * 7919 + i) % 100_003 for i in range(width)]
        body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, width], "data": x}]}
        answered = httpx.post(f"{server.base_url}/v2/models/gathered/infer", json=body, timeout=30)
        assert answered.status_code == 200, answered.text
        outputs = {o["name"]: o["data"] for o in answered.json()["outputs"]}
        assert outputs["Y"] == [v + 1 for v in x]
        return outputs["ROWS"][0]

    with ThreadPoolExecutor(12) as pool:
        rows = list(pool.map(one, range(12)))
    assert max(rows) >= 3, rows  # a batch of 96 KiB or more crossed in the Region


def test_a_batch_queued_behind_one_that_kills_its_instance_is_answered_by_another(
    server: ServerProcess,
) -> None:
    """Both instances busy (one about to abort, one slow), two small batches queue, one behind each;
    the one behind the abort never began, so it is sent again and answered: only the aborting request
    fails."""
    here = server.repository / "queue" / "1"
    behind = "model 'queue' version 1: a batch waits behind instance"
    with ThreadPoolExecutor(4) as pool:
        dying = pool.submit(queue, server, [1], 1)
        wait_until(lambda: (here / "entered_1").exists(), "the aborting batch began")
        slow = pool.submit(queue, server, [2], 5)
        wait_until(lambda: (here / "entered_5").exists(), "the slow batch began on the other instance")
        waiting = [pool.submit(queue, server, [10 + n]) for n in range(2)]
        wait_until(lambda: server.log_text().count(behind) == 2, "a batch queued behind each instance")
        (here / "release").touch()
        failed = dying.result()
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"].endswith("exited (signal 6: SIGABRT)"), failed.text
        for number, answered in enumerate([slow, *waiting]):
            response = answered.result()
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [[3, 11, 12][number]]
    wait_until(lambda: restarts(server, "queue") == 1, "the instance restarted")
    resent = re.findall(
        r"model 'queue' version 1: instance \d died before it began a batch: sent again", server.log_text()
    )
    assert len(resent) == 1, "the batch behind the abort was sent again, once"


def test_an_idle_instance_killed_from_outside_is_restarted_without_a_request(server: ServerProcess) -> None:
    """As the OOM killer kills a process that is not executing: the server notices at once."""
    name, victim, _ = started_pids(server)[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: restarts(server, "fragile") == 1, "the killed instance restarted")
    index = name.rsplit("_", 1)[1]
    assert f"model 'fragile' instance {index} exited (signal 9: SIGKILL)" in server.log_text()
    answered = fragile(server, 0)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"][0] != victim


def test_unload_finalizes_and_ends_the_processes_and_reload_starts_new_ones(server: ServerProcess) -> None:
    first = {pid for _, pid, _ in started_pids(server)}
    assert len(first) == 2
    assert httpx.post(f"{server.base_url}/v2/repository/models/fragile/unload", timeout=30).status_code == 200
    wait_until(lambda: all(gone(pid) for pid in first), "the unloaded model's processes ended")
    assert all(f"finalized pid={pid}" in server.log_text() for pid in first)
    assert httpx.post(f"{server.base_url}/v2/repository/models/fragile/load", timeout=30).status_code == 200
    second = {pid for _, pid, _ in started_pids(server)} - first
    assert len(second) == 2
    assert fragile(server, 0).json()["outputs"][0]["data"][0] in second


def test_the_processes_die_with_the_server(server: ServerProcess) -> None:
    pids = [pid for _, pid, _ in started_pids(server)]
    assert len(pids) == 2
    server.kill()  # SIGKILL: nothing of the server's runs to stop them
    wait_until(lambda: all(gone(pid) for pid in pids), "the instances died with the server")


def test_a_model_that_cannot_load_fails_its_load_with_the_reason_the_server_lives(
    start_server, repo: Path
) -> None:
    write_model(repo, "bad_mode", ECHO % ("bad_mode", PROCESS.replace("process", "fork")), {1: ECHO_PY})
    timeout = 'parameters { key: "EXECUTE_TIMEOUT_MS" value: { string_value: "soon" } }\n'
    write_model(repo, "bad_timeout", ECHO % ("bad_timeout", PROCESS + timeout), {1: ECHO_PY})
    negative = ECHO % ("negative_timeout", PROCESS + timeout.replace("soon", "-5"))
    write_model(repo, "negative_timeout", negative, {1: ECHO_PY})
    raises = ECHO_PY.replace(
        "    def execute", "    def initialize(self, config):\n        1 / 0\n\n    def execute"
    )
    write_model(repo, "bad_init", ECHO % ("bad_init", PROCESS), {1: raises})
    aborts = ECHO_PY.replace(
        "    def execute", "    def initialize(self, config):\n        os.abort()\n\n    def execute"
    )
    write_model(repo, "init_aborts", ECHO % ("init_aborts", PROCESS), {1: aborts})
    http = ECHO_PY + "\n    def handle_http(self, http):\n        return b''\n"
    write_model(repo, "with_http", ECHO % ("with_http", PROCESS), {1: http})
    server = start_server(repo)
    index = httpx.post(f"{server.base_url}/v2/repository/index", timeout=10).json()
    reasons = {entry["name"]: entry.get("reason", "") for entry in index}
    assert "EXECUTION_MODE is 'process' or 'thread', not 'fork'" in reasons["bad_mode"]
    assert "EXECUTE_TIMEOUT_MS is a number of milliseconds (0: none), not 'soon'" in reasons["bad_timeout"]
    assert "EXECUTE_TIMEOUT_MS is a number of milliseconds (0: none), not '-5'" in reasons["negative_timeout"]
    assert "ZeroDivisionError: division by zero" in reasons["bad_init"]
    assert "instance 0 exited (signal 6: SIGABRT) while loading its model" in reasons["init_aborts"]
    assert "handle_http runs in the server's process: set parameters" in reasons["with_http"]
    assert httpx.get(f"{server.base_url}/v2/health/live", timeout=10).status_code == 200


def test_a_model_runs_in_the_venv_that_execution_env_path_names(
    start_server, repo: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "model_env"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
    )
    where = "$$TRITON_MODEL_DIRECTORY/../../model_env"
    env = f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{where}" }} }}\n'
    write_model(repo, "in_venv", ECHO % ("in_venv", PROCESS + env), {1: ECHO_PY})
    server = start_server(repo)
    texts, info = echo(server, "in_venv", ["z"])
    assert texts == ["Z"]
    assert Path(info["python"]).parent == venv / "bin"


def test_a_conda_pack_tarball_is_unpacked_and_its_python_runs_the_model(
    start_server, repo: Path, tmp_path: Path
) -> None:
    """A tarball holding bin/python (a script that marks its environment and runs this interpreter, as
    a packed environment's python would run): the model's processes run it, the unpacked copy goes at
    unload."""
    packed = tmp_path / "packed"
    (packed / "bin").mkdir(parents=True)
    script = packed / "bin" / "python"
    script.write_text(f'#!/bin/sh\nexport FROM_TARBALL="$0"\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    model_dir = repo / "in_tarball"
    write_model(repo, "in_tarball", ECHO % ("in_tarball", PROCESS + ENV % "env.tar.gz"), {1: ENV_PY})
    with tarfile.open(model_dir / "env.tar.gz", "w:gz") as archive:
        archive.add(packed / "bin", arcname="bin")
    server = start_server(repo)
    texts, info = echo(server, "in_tarball", ["q"])
    assert texts == ["Q"]
    unpacked = Path(info["from_tarball"]).parent.parent  # <unpacked>/bin/python
    assert unpacked.name.startswith("tensorgate-env-in_tarball-") and unpacked.is_dir()
    assert server.stop() == 0
    assert not unpacked.exists()
