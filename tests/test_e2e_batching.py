"""Dynamic batching end to end: concurrent clients on a real server, queue policies, errors, disconnects.

The models here record every batch they execute (the first element of each row, a request's "tag") in
`<version>/batches.log`, answer OUTPUT0 = 2 x INPUT0 and BATCH = the rows of the batch they ran in.
A request with a negative tag blocks its batch until the test creates `<version>/release`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    EXAMPLES,
    RawConnection,
    ServerProcess,
    assert_connection_reused,
    assert_error,
    http_request,
    make_client,
    simple_inputs,
    stop_all,
    wait_for_pending,
    write_model,
)

RECORDING_MODEL = """
import asyncio
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


class Model:
    async def execute(self, inputs):
        x = inputs["INPUT0"]
        with open(HERE / "batches.log", "a") as log:
            log.write(json.dumps([int(v) for v in x[:, 0]]) + "\\n")
        if (x[:, 0] < 0).any():
            (HERE / "started").write_text("started")
            while not (HERE / "release").exists():
                await asyncio.sleep(0.005)
        return {"OUTPUT0": x * 2, "BATCH": np.full((len(x), 1), len(x), dtype=np.int32)}
"""

SHORT_MODEL = """
class Model:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"][1:], "BATCH": inputs["INPUT0"][1:, :1]}
"""

# name: dynamic_batching section
MODELS = {
    "batching": "max_queue_delay_microseconds: 2000000",
    "full": "default_queue_policy { max_queue_size: 1 }",
    "timeout": "default_queue_policy { default_timeout_microseconds: 100000 }",
    "override": "default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: 1 }",
    "dropped": "",
    "short": "max_queue_delay_microseconds: 2000000",
}
WAIT_S = 15.0


def config(name: str, batching: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}
]
dynamic_batching {{ {batching} }}
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("batching") / "models"
    repo.mkdir()
    for name, batching in MODELS.items():
        write_model(
            repo, name, config(name, batching), {1: SHORT_MODEL if name == "short" else RECORDING_MODEL}
        )
    return repo


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(models, models.parent / "server.log").start()
    yield process
    for name in MODELS:  # nothing may stay blocked at shutdown
        (models / name / "1" / "release").write_text("release")
    stop_all([process])


def body(tag: int, rows: int = 1, **parameters) -> dict:
    doc: dict = {
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [rows, 4], "data": [tag] * 4 * rows}]
    }
    if parameters:
        doc["parameters"] = parameters
    return doc


def infer(client: httpx.Client, model: str, tag: int, rows: int = 1, **parameters) -> httpx.Response:
    return client.post(f"/v2/models/{model}/infer", json=body(tag, rows, **parameters))


def assert_own_answer(response: httpx.Response, tag: int, rows: int = 1) -> int:
    """Checks the answer is this request's rows; returns the batch size it ran in."""
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"]["shape"] == [rows, 4]
    assert outputs["OUTPUT0"]["data"] == [2 * tag] * 4 * rows
    sizes = set(outputs["BATCH"]["data"])
    assert len(sizes) == 1, sizes
    return sizes.pop()


def executed(models: Path, model: str) -> list[list[int]]:
    log = models / model / "1" / "batches.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def block(pool: ThreadPoolExecutor, client: httpx.Client, models: Path, model: str):
    """Sends a request that keeps the model's only instance busy; returns its future once executing."""
    blocker = pool.submit(infer, client, model, -1)
    wait_for(models / model / "1" / "started")
    return blocker


def release(models: Path, model: str) -> None:
    (models / model / "1" / "release").write_text("release")


# ------------------------------------------------------------------------------------------ batching


def stats(client: httpx.Client, model: str) -> dict:
    response = client.get(f"/v2/models/{model}/stats")
    assert response.status_code == 200, response.text
    (entry,) = response.json()["model_stats"]
    return entry


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(
    server: ServerProcess, models: Path, http_version: str
) -> None:
    base = 100 if http_version == "http1" else 200
    rows = [1, 2, 1, 3, 1]  # 8 rows: max_batch_size, so a batch goes as soon as all are queued
    tags = [base + i for i in range(len(rows))]

    def one(i: int) -> httpx.Response:
        # a client each: httpx's sync client shared by threads is not safe over HTTP/2 (httpcore can send
        # a later stream id's HEADERS first, a connection error by RFC 9113 section 5.1.1)
        with make_client(server.base_url, http_version) as own:
            return infer(own, "batching", tags[i], rows[i])

    with make_client(server.base_url, http_version) as client, ThreadPoolExecutor(len(rows)) as pool:
        before = stats(client, "batching")
        responses = list(pool.map(one, range(len(rows))))
        after = stats(client, "batching")
    sizes = [assert_own_answer(r, tag, n) for r, tag, n in zip(responses, tags, rows, strict=True)]
    batches = [b for b in executed(models, "batching") if set(b) <= set(tags)]
    assert sorted(tag for b in batches for tag in set(b)) == tags  # every request executed once
    assert max(sizes) > max(rows)
    # Triton's statistics say the same: 8 rows inferred in fewer executions than requests.
    assert after["inference_count"] - before["inference_count"] == sum(rows)
    executions = after["execution_count"] - before["execution_count"]
    assert executions == len(batches) < len(rows), f"no batching happened: {batches}"
    successes = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert successes == len(rows)


def test_a_request_over_max_batch_size_is_400(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client:
        response = infer(client, "batching", 1, rows=9)
        assert_error(response, 400, "inference request batch-size must be <= 8 for 'batching'")
        assert_connection_reused(client, response)


def test_wrong_number_of_output_rows_is_500_for_every_request_of_the_batch(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client, ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda n: infer(client, "short", 5, rows=n), (3, 5)))
        for response in responses:
            assert_error(
                response, 500, "model 'short' version 1", "output 'OUTPUT0'", "one row per input row"
            )
        assert_connection_reused(client, responses[0])


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [({"priority": "high"}, "'priority'"), ({"timeout": -5}, "'timeout'"), ({"priority": 1.5}, "'priority'")],
)
def test_bad_priority_or_timeout_parameter_is_400(
    server: ServerProcess, parameters: dict, fragment: str
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client:
        response = infer(client, "batching", 1, **parameters)
        assert_error(response, 400, "unable to parse", fragment, "unsigned integer")


# ------------------------------------------------------------------------------------------ queue policies


def test_a_full_queue_answers_503_at_once(server: ServerProcess, models: Path) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client, ThreadPoolExecutor(3) as pool:
        blocker = block(pool, client, models, "full")
        waiting = [pool.submit(infer, client, "full", tag) for tag in (1, 2)]
        # One of the two is queued (max_queue_size 1); the other is refused while the model is still busy.
        done, _ = wait(waiting, WAIT_S, return_when=FIRST_COMPLETED)
        assert len(done) == 1 and not blocker.done()
        (refused,) = done
        assert_error(refused.result(), 503, "Exceeds maximum queue size")
        release(models, "full")
        assert_own_answer(blocker.result(WAIT_S), -1)
        (queued,) = [f for f in waiting if f is not refused]
        assert queued.result(WAIT_S).status_code == 200


def test_a_request_that_times_out_in_the_queue_is_503(server: ServerProcess, models: Path) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client, ThreadPoolExecutor(2) as pool:
        blocker = block(pool, client, models, "timeout")
        response = infer(client, "timeout", 1)  # 100 ms in the queue, behind a model that never finishes
        assert_error(response, 503, "Request timeout expired")
        assert not blocker.done()
        release(models, "timeout")
        assert_own_answer(blocker.result(WAIT_S), -1)
        assert [1] not in executed(models, "timeout")


def test_the_timeout_request_parameter_shortens_the_queue_timeout(
    server: ServerProcess, models: Path
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client, ThreadPoolExecutor(2) as pool:
        blocker = block(pool, client, models, "override")
        response = infer(client, "override", 1, timeout=50_000, priority=0)  # 50 ms instead of 60 s
        assert_error(response, 503, "Request timeout expired")
        release(models, "override")
        assert_own_answer(blocker.result(WAIT_S), -1)


# ------------------------------------------------------------------------------------------ disconnects


def test_a_client_that_disconnects_while_queued_is_dropped(server: ServerProcess, models: Path) -> None:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client, ThreadPoolExecutor(1) as pool:
        blocker = block(pool, client, models, "dropped")
        payload = json.dumps(body(7)).encode()
        with RawConnection(server.address) as conn:
            conn.send(http_request("POST", "/v2/models/dropped/infer", payload, port=server.port))
            wait_for_pending(server, "dropped", 1)  # queued behind the blocker
        wait_for_pending(server, "dropped", 0)  # the client left: its request left the queue
        release(models, "dropped")
        assert_own_answer(blocker.result(WAIT_S), -1)
        assert_own_answer(infer(client, "dropped", 8), 8)  # after this, the queue has been served
        assert all(7 not in batch for batch in executed(models, "dropped")), executed(models, "dropped")


def test_the_simple_example_with_dynamic_batching(start_server, tmp_path: Path) -> None:
    """The bundled `simple` model, its config given `dynamic_batching`: concurrent clients share batches
    (the statistics show fewer executions than requests) and each gets its own sum and difference."""
    source = EXAMPLES / "simple"
    models = tmp_path / "models"
    config_text = (source / "config.pbtxt").read_text()
    write_model(
        models,
        "simple",
        config_text + "dynamic_batching { max_queue_delay_microseconds: 20000 }\n",
        {1: (source / "1" / "model.py").read_text()},
    )
    server = start_server(models)
    requests = 32

    def one(i: int) -> None:
        a, b = list(range(i, i + 16)), [i] * 16
        with make_client(server.base_url, "http1" if i % 2 else "http2", timeout=WAIT_S) as client:
            response = client.post("/v2/models/simple/infer", json={"inputs": simple_inputs(a, b, [1, 16])})
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs == {"OUTPUT0": [x + i for x in a], "OUTPUT1": [x - i for x in a]}

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(requests)))
    with httpx.Client(base_url=server.base_url) as client:
        (stats,) = client.get("/v2/models/simple/stats").json()["model_stats"]
    assert stats["inference_stats"]["success"]["count"] == requests
    assert stats["execution_count"] < requests, "no two requests shared a batch"
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
