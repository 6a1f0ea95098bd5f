"""grps over REST (/grps/v1/...) against a real server, with httpx over HTTP/1.1 and HTTP/2: every route,
every payload kind, model selection, status mirrored as the HTTP status, errors, streaming, offline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import ServerFactory
from e2e_helpers import (
    A,
    B,
    RawConnection,
    RawH2,
    ServerProcess,
    assert_connection_reused,
    http_request,
    make_client,
    stop_all,
    wait_for_pending,
    write_model,
)

PREDICT = "/grps/v1/infer/predict"
OK_STATUS = {"code": 200, "msg": "OK", "status": "SUCCESS"}


# ------------------------------------------------------------------------------------- test models


def bytes_config(name: str, *, policy: str = "") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "TOKEN" data_type: TYPE_STRING dims: [ -1 ] }} ]
{policy}
"""


def echo_version(version: int) -> str:
    return f"""
import numpy as np

class Model:
    def execute(self, inputs):
        return {{"TOKEN": np.array([b"v{version}:" + inputs["TEXT"][0]], dtype=object)}}
"""


# TEXT is the path of a gate file: "first" comes at once, "second" only once the client has created the
# gate. A client that reads "first" before it opens the gate proves the answer is not held back.
GATED = """
import asyncio
import os

import numpy as np

class Model:
    async def execute_stream(self, inputs):
        gate = inputs["TEXT"][0].decode()
        yield {"TOKEN": np.array([b"first"], dtype=object)}
        for _ in range(1000):
            if os.path.exists(gate):
                yield {"TOKEN": np.array([b"second"], dtype=object)}
                return
            await asyncio.sleep(0.01)
        yield {"TOKEN": np.array([b"the gate never opened"], dtype=object)}
"""

# TEXT is the path of a marker file, written when the generator ends: "closed after N ticks" when it was
# closed early (its client went away), "ran to its end" after its 150 ticks (3 s).
TICKER = """
import asyncio

import numpy as np

class Model:
    async def execute_stream(self, inputs):
        marker = inputs["TEXT"][0].decode()
        ticks = 0
        try:
            while ticks < 150:
                yield {"TOKEN": np.array([b"tick %d" % ticks], dtype=object)}
                ticks += 1
                await asyncio.sleep(0.02)
        finally:
            with open(marker, "w") as f:
                f.write("ran to its end" if ticks == 150 else f"closed after {ticks} ticks")
"""

FAILING = """
import numpy as np

class Model:
    async def execute_stream(self, inputs):
        yield {"TOKEN": np.array([b"one"], dtype=object)}
        raise ValueError("boom in the middle of the stream")
"""

# TEXT is the path of a marker file, written when the model executes; for a path ending in "block" the
# model then holds its one queue until a "release" file beside it exists.
QUEUED = """
import asyncio
import os

import numpy as np

class Model:
    async def execute(self, inputs):
        path = inputs["TEXT"][0].decode()
        with open(path, "w") as f:
            f.write("executed")
        release = os.path.join(os.path.dirname(path), "release")
        for _ in range(1000):
            if not path.endswith("block") or os.path.exists(release):
                break
            await asyncio.sleep(0.01)
        return {"TOKEN": np.array([b"done"], dtype=object)}
"""

BROKEN = """
class Model:
    def execute(self, inputs):
        raise RuntimeError("kaput")
"""


def write_grps_repository(repository: Path) -> Path:
    """echo (versions 1 and 2), my-model (a '-' in its name), gated, ticker and failing (streaming),
    queued (dynamic batching), broken (raises), unloadable (fails to load). Every model takes TEXT and
    answers TOKEN (BYTES)."""
    all_versions = "version_policy { all {} }"
    write_model(
        repository,
        "echo",
        bytes_config("echo", policy=all_versions),
        {1: echo_version(1), 2: echo_version(2)},
    )
    write_model(repository, "my-model", bytes_config("my-model"), {1: echo_version(7)})
    write_model(repository, "gated", bytes_config("gated"), {1: GATED})
    write_model(repository, "ticker", bytes_config("ticker"), {1: TICKER})
    write_model(repository, "failing", bytes_config("failing"), {1: FAILING})
    write_model(repository, "queued", bytes_config("queued", policy="dynamic_batching { }"), {1: QUEUED})
    write_model(repository, "broken", bytes_config("broken"), {1: BROKEN})
    write_model(
        repository, "unloadable", bytes_config("unloadable"), {1: "raise ImportError('cannot load')\n"}
    )
    return repository


@pytest.fixture(scope="module")
def grps_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on the test models above, shared by this module's tests."""
    repository = write_grps_repository(tmp_path_factory.mktemp("grps_models"))
    log = tmp_path_factory.mktemp("grps_server") / "server.log"
    server = ServerProcess(repository, log, extra_args=("--max-request-bytes", "65536")).start()
    yield server
    stop_all([server])


@pytest.fixture
def grps_client(grps_server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(grps_server.base_url, http_version) as c:
        yield c


# ------------------------------------------------------------------------------------------ helpers


def predict(
    client: httpx.Client, body: object = None, *, raw: bytes | None = None, **params: str
) -> httpx.Response:
    if raw is not None:
        return client.post(
            PREDICT, content=raw, headers={"content-type": "application/octet-stream"}, params=params
        )
    return client.post(
        PREDICT, content=orjson.dumps(body), headers={"content-type": "application/json"}, params=params
    )


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert doc["status"] == OK_STATUS
    return doc


def failure(response: httpx.Response, code: int, *fragments: str) -> str:
    """A grps error: the HTTP status is status.code, the body only the status."""
    assert response.status_code == code, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert set(doc) == {"status"}, doc
    status = doc["status"]
    assert status["code"] == code and status["status"] == "FAILURE", status
    for fragment in fragments:
        assert fragment in status["msg"], (fragment, status["msg"])
    return status["msg"]


def gtensor(name: str, dtype: str, shape: list[int], values: list, field: str | None = None) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape, field or "flat_" + dtype[3:].lower(): values}


def messages(response: httpx.Response) -> Iterator[tuple[float, bytes]]:
    """(arrival time, line) for each newline-ended message of a streamed answer, read as it comes."""
    buffer = b""
    for piece in response.iter_raw():
        buffer += piece
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield time.monotonic(), line
    assert buffer == b"", f"the stream ended inside a message: {buffer!r}"


def streamed(client: httpx.Client, body: dict, **params: str) -> list[dict]:
    with client.stream(
        "POST", PREDICT, content=orjson.dumps(body), params={"streaming": "true", **params}
    ) as r:
        assert r.status_code == 200
        return [orjson.loads(line) for _, line in messages(r)]


def ticker_end(marker: Path, timeout: float = 10.0) -> str:
    """How the ticker model's stream ended, once it has (its 150 ticks take 3 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text():
            return marker.read_text()
        time.sleep(0.02)
    return "still running"


# ------------------------------------------------------------------------------- health, metadata


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("route", ["health/live", "health/ready", "health/online"])
def test_health_routes_answer_get_and_post(client: httpx.Client, method: str, route: str) -> None:
    response = client.request(method, f"/grps/v1/{route}", content=b"{}" if method == "POST" else None)
    assert ok(response) == {"status": OK_STATUS}


def test_server_metadata_is_yaml_in_str_data(client: httpx.Client) -> None:
    for response in (
        client.get("/grps/v1/metadata/server"),
        client.post("/grps/v1/metadata/server", content=b"{}"),
    ):
        text = ok(response)["str_data"]
        assert text.startswith("server:\n  name: tensorgate\n")
        assert '  - name: simple\n    versions:\n      - "1"\n    ready: true\n' in text
        assert "\nonline: true\n" in text and "\ndefault_model: null\n" in text


def test_model_metadata_is_yaml_with_grps_dtypes(client: httpx.Client) -> None:
    for name in ("simple", "simple-1"):
        text = ok(client.post("/grps/v1/metadata/model", json={"str_data": name}))["str_data"]
        assert text.startswith(
            'name: simple\nversions:\n  - "1"\nplatform: python\ninputs:\n  - name: INPUT0\n'
        )
        assert "    datatype: INT32\n    shape:\n      - -1\n      - 16\n    dtype: DT_INT32\n" in text
        assert text.endswith("max_batch_size: 8\nstreaming: false\n")
    stream_text = ok(client.post("/grps/v1/metadata/model", json={"strData": "token_stream"}))["str_data"]
    assert "dtype: DT_STRING" in stream_text and stream_text.endswith("streaming: true\n")
    failure(
        client.post("/grps/v1/metadata/model", json={"str_data": "nosuch"}), 404, "unknown model 'nosuch'"
    )
    failure(client.post("/grps/v1/metadata/model", json={"str_data": "simple-9"}), 404, "has no version '9'")
    failure(client.post("/grps/v1/metadata/model", json={"str_data": ""}), 400, "no model name")
    failure(client.post("/grps/v1/metadata/model", json={"gmap": {"s_s": {"a": "b"}}}), 400, "as str_data")
    response = client.get("/grps/v1/metadata/model")
    failure(response, 405, "use POST")
    assert response.headers["allow"] == "POST"


# -------------------------------------------------------------------------------------- inference


def test_gtensors_by_name_in_either_json_spelling(client: httpx.Client) -> None:
    for body in (
        {
            "model": "simple",
            "gtensors": {
                "tensors": [
                    gtensor("INPUT0", "DT_INT32", [1, 16], A),
                    gtensor("INPUT1", "DT_INT32", [1, 16], B),
                ]
            },
        },
        {
            "model": "simple",
            "gtensors": {
                "tensors": [
                    gtensor("INPUT1", 4, [1, 16], B, "flatInt32"),
                    gtensor("INPUT0", 4, [1, 16], A, "flatInt32"),
                ]
            },
        },
    ):
        tensors = ok(predict(client, body))["gtensors"]["tensors"]
        assert tensors == [
            gtensor("OUTPUT0", "DT_INT32", [1, 16], [a + b for a, b in zip(A, B, strict=True)]),
            gtensor("OUTPUT1", "DT_INT32", [1, 16], [a - b for a, b in zip(A, B, strict=True)]),
        ]


def test_ndarray_fills_the_float_input_and_return_ndarray_answers_one(client: httpx.Client) -> None:
    doc = ok(
        predict(client, {"ndarray": [[1], [2], [5]]}, model="half_plus_two", **{"return-ndarray": "true"})
    )
    assert doc == {"status": OK_STATUS, "ndarray": [[2.5], [3.0], [4.5]]}
    plain = ok(predict(client, {"ndarray": [0.5, -1]}, model="identity_fp32"))
    assert plain["gtensors"]["tensors"] == [gtensor("OUTPUT0", "DT_FLOAT32", [2], [0.5, -1.0])]
    both_ways = ok(
        predict(client, {"ndarray": [0.25, 8]}, model="identity_fp32", **{"return-ndarray": "TRUE"})
    )
    assert both_ways["ndarray"] == [0.25, 8.0]
    ints = {
        "gtensors": {
            "tensors": [gtensor("INPUT0", "DT_INT32", [1, 16], A), gtensor("INPUT1", "DT_INT32", [1, 16], B)]
        }
    }
    response = predict(client, ints, model="simple", **{"return-ndarray": "true"})
    failure(
        response, 400, "return-ndarray needs one floating-point output", "OUTPUT0 (INT32), OUTPUT1 (INT32)"
    )


def test_str_data_answers_str_data(client: httpx.Client) -> None:
    doc = ok(predict(client, {"str_data": "hello grps ☺", "model": "simple_identity"}))
    assert doc == {"status": OK_STATUS, "str_data": "hello grps ☺"}


def test_octet_stream_is_bin_data_both_ways(client: httpx.Client) -> None:
    raw = bytes(range(256)) * 3
    response = predict(client, raw=raw, model="simple_identity")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.content == raw
    as_json = predict(client, {"bin_data": "AP8=", "model": "simple_identity"})
    assert as_json.headers["content-type"] == "application/octet-stream" and as_json.content == b"\x00\xff"


def test_gmap_values_go_to_inputs_by_key(client: httpx.Client) -> None:
    for body in ({"gmap": {"s_f": {"x": 3}}}, {"gmap": {"sI32": {"x": 3}}}, {"gmap": {"s_d": {"x": "3"}}}):
        doc = ok(predict(client, body, model="half_plus_two"))
        assert doc == {"status": OK_STATUS, "gmap": {"s_f": {"y": 3.5}}}


def test_several_output_elements_come_back_as_gtensors(client: httpx.Client) -> None:
    doc = ok(predict(client, {"str_data": "streaming models answer plainly too", "model": "token_stream"}))
    words = ["streaming", "models", "answer", "plainly", "too"]
    assert doc["gtensors"]["tensors"] == [gtensor("TOKEN", "DT_STRING", [5], words)]


def test_model_selection_name_version_body_wins_over_query(grps_client: httpx.Client) -> None:
    def answer(body: dict, **params: str) -> str:
        return ok(predict(grps_client, {"str_data": "x", **body}, **params))["str_data"]

    assert answer({"model": "echo"}) == "v2:x"  # the newest version
    assert answer({"model": "echo-1"}) == "v1:x"
    assert answer({}, model="echo-1") == "v1:x"
    assert answer({"model": "echo-2"}, model="echo-1") == "v2:x"
    assert answer({"model": "my-model"}) == "v7:x"
    assert answer({"model": "my-model-1"}) == "v7:x"
    failure(
        predict(grps_client, {"str_data": "x", "model": "echo-3"}), 404, "model 'echo' has no version '3'"
    )
    failure(predict(grps_client, {"str_data": "x"}, model="nosuch"), 404, "unknown model 'nosuch'")
    failure(predict(grps_client, {"str_data": "x"}), 400, "no model selected", "--grps-default-model")


def test_default_model_from_the_flag_or_the_only_model(start_server: ServerFactory, tmp_path: Path) -> None:
    both = write_grps_repository(tmp_path / "both")
    with make_client(
        start_server(both, extra_args=("--grps-default-model", "echo-1")).base_url, "http1"
    ) as c:
        assert ok(predict(c, {"str_data": "a"}))["str_data"] == "v1:a"
        assert ok(predict(c, {"str_data": "a", "model": "echo-2"}))["str_data"] == "v2:a"
    single = tmp_path / "single"
    write_model(single, "only", bytes_config("only"), {3: echo_version(3)})
    with make_client(start_server(single).base_url, "http2") as c:
        assert ok(predict(c, {"str_data": "b"}))["str_data"] == "v3:b"
        assert "\ndefault_model: only\n" in ok(c.get("/grps/v1/metadata/server"))["str_data"]


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "params", "code", "fragment"),
    [
        (b"{", {}, 400, "malformed JSON"),
        (b"", {}, 400, "body is empty"),
        (b"{}", {"model": "simple"}, 400, "carries no data"),
        (
            b'{"model": "simple", "gtensors": {"tensors": [{"name": "INPUT0", "flat_int32": [1, 2, 3]}]}}',
            {},
            400,
            "has shape [3] where the model expects [-1, 16]",
        ),
        (
            b'{"model": "simple", "gmap": {"s_i32": {"NOPE": 1}}}',
            {},
            400,
            "'NOPE' is unknown (expected: INPUT0, INPUT1)",
        ),
        (b'{"str_data": "1"}', {"model": "simple_string"}, 400, "model 'simple_string' has 2 of them"),
        (b'{"ndarray": [1]}', {"model": "simple"}, 400, "only floating-point input"),
        (b'{"gmap": {"s_f": {"x": 1.5}}}', {"model": "simple", "x": "1"}, 400, "'x' is unknown"),
        (
            b'{"gmap": {"s_s": {"x": "1"}}}',
            {"model": "half_plus_two"},
            400,
            "is FP32: DT_STRING values cannot fill it",
        ),
        (b'{"str_data": "x", "model": "simple-x"}', {}, 404, "model 'simple' has no version 'x'"),
        (
            b'{"gtensors": {"tensors": [{"name": "x", "dtype": "DT_FLOAT64", "flat_float64": [1e300]}]}}',
            {"model": "half_plus_two"},
            400,
            "input 'x' is FP32: the values are outside its range",
        ),
        (
            b'{"model": "simple", "gtensors": {"tensors": [{"name": "INPUT0", "flat_int32": 0}]}}',
            {},
            400,
            "flat_int32 must be a list",
        ),
    ],
)
def test_bad_requests_get_their_status_and_keep_the_connection(
    client: httpx.Client, body: bytes, params: dict, code: int, fragment: str
) -> None:
    response = client.post(PREDICT, content=body, params=params, headers={"content-type": "application/json"})
    failure(response, code, fragment)
    assert_connection_reused(client, response)


def test_wrong_method_and_model_failures(grps_client: httpx.Client) -> None:
    response = grps_client.get(PREDICT)
    failure(response, 405, "use POST")
    assert response.headers["allow"] == "POST"
    failure(
        predict(grps_client, {"str_data": "x", "model": "broken"}),
        500,
        "model 'broken'",
        "RuntimeError: kaput",
    )
    failure(predict(grps_client, {"str_data": "x", "model": "unloadable"}), 503, "not ready", "cannot load")
    failure(predict(grps_client, raw=b"x" * 70000, model="echo"), 413, "--max-request-bytes")
    assert_connection_reused(grps_client, predict(grps_client, {"str_data": "x", "model": "echo"}))


# ---------------------------------------------------------------------------------------- streaming


def test_streaming_answers_each_token_as_the_model_yields_it(client: httpx.Client) -> None:
    words = ["one", "two", "three", "four", "five", "six"]
    body = orjson.dumps({"model": "token_stream", "str_data": " ".join(words)})
    with client.stream("POST", PREDICT, content=body, params={"streaming": "true"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        if response.http_version == "HTTP/1.1":
            assert response.headers["transfer-encoding"] == "chunked"
        arrivals = [(at, orjson.loads(line)) for at, line in messages(response)]
    assert [doc for _, doc in arrivals] == [{"status": OK_STATUS, "str_data": w} for w in words]
    # The model sleeps 50 ms before each word: sent as they come, the first word leaves 250 ms before the
    # last. (Held back until the end, all would arrive together.)
    assert arrivals[-1][0] - arrivals[0][0] >= 0.1


def test_the_first_message_arrives_before_the_stream_ends(grps_client: httpx.Client, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    body = orjson.dumps({"model": "gated", "str_data": str(gate)})
    with grps_client.stream("POST", PREDICT, content=body, params={"streaming": "true"}) as response:
        lines = messages(response)
        assert orjson.loads(next(lines)[1])["str_data"] == "first"
        gate.touch()  # the model only goes on, and the stream only ends, once we have read "first"
        assert [orjson.loads(line)["str_data"] for _, line in lines] == ["second"]


def test_streamed_bin_data_is_raw_bytes(client: httpx.Client) -> None:
    with client.stream(
        "POST",
        PREDICT,
        content=b"raw bytes streamed",
        params={"streaming": "true", "model": "token_stream"},
        headers={"content-type": "application/octet-stream"},
    ) as response:
        assert response.status_code == 200
        assert response.read() == b"rawbytesstreamed"


def test_a_model_that_does_not_stream_answers_in_one_message(client: httpx.Client) -> None:
    body = {
        "model": "simple",
        "gtensors": {
            "tensors": [gtensor("INPUT0", "DT_INT32", [1, 16], A), gtensor("INPUT1", "DT_INT32", [1, 16], B)]
        },
    }
    (doc,) = streamed(client, body)
    assert doc["status"] == OK_STATUS and doc["gtensors"]["tensors"][0]["flat_int32"] == [
        a + b for a, b in zip(A, B, strict=True)
    ]
    assert streamed(client, {"ndarray": [[4]]}, model="half_plus_two", **{"return-ndarray": "true"}) == [
        {"status": OK_STATUS, "ndarray": [[4.0]]}
    ]


def test_stream_errors_before_and_after_the_first_message(grps_client: httpx.Client) -> None:
    response = grps_client.post(
        PREDICT, content=b'{"str_data": "x", "model": "nosuch"}', params={"streaming": "true"}
    )
    failure(response, 404, "unknown model 'nosuch'")
    failure(
        grps_client.post(
            PREDICT, content=b'{"ndarray": [1]}', params={"streaming": "true", "model": "ticker"}
        ),
        400,
        "only floating-point input",
    )
    first, last = streamed(grps_client, {"model": "failing", "str_data": "x"})
    assert first == {"status": OK_STATUS, "str_data": "one"}
    assert last["status"]["code"] == 500 and last["status"]["status"] == "FAILURE"
    assert "ValueError: boom in the middle of the stream" in last["status"]["msg"]
    assert_connection_reused(grps_client, response)


def test_a_streaming_client_that_leaves_while_queued_is_dropped(
    grps_server: ServerProcess, tmp_path: Path
) -> None:
    """A model without execute_stream answers a streaming request once, watched as predict is: a request
    whose client left while it waited in the queue never runs."""
    with httpx.Client(base_url=grps_server.base_url, timeout=15.0) as client, ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(predict, client, {"model": "queued", "str_data": str(tmp_path / "block")})
        deadline = time.monotonic() + 10.0
        while not (tmp_path / "block").exists():  # the model runs the blocker: the queue is held
            assert time.monotonic() < deadline, "the blocking request never ran"
            time.sleep(0.01)
        body = orjson.dumps({"model": "queued", "str_data": str(tmp_path / "dropped")})
        with RawConnection(grps_server.address) as conn:
            conn.send(http_request("POST", PREDICT + "?streaming=true", body, port=grps_server.port))
            wait_for_pending(grps_server, "queued", 1)  # queued behind the blocker
        wait_for_pending(grps_server, "queued", 0)  # the client left: its request left the queue
        (tmp_path / "release").touch()
        assert ok(blocker.result(15.0))["str_data"] == "done"
        after = {"model": "queued", "str_data": str(tmp_path / "after")}
        assert streamed(client, after) == [{"status": OK_STATUS, "str_data": "done"}]  # the queue is served
    assert not (tmp_path / "dropped").exists(), "the request of a client that left was executed"


def test_a_client_that_goes_away_closes_the_model_stream(
    grps_server: ServerProcess, http_version: str, tmp_path: Path
) -> None:
    marker = tmp_path / "closed"
    with make_client(grps_server.base_url, http_version) as c:
        body = orjson.dumps({"model": "ticker", "str_data": str(marker)})
        with c.stream("POST", PREDICT, content=body, params={"streaming": "true"}) as response:
            lines = messages(response)
            assert [orjson.loads(next(lines)[1])["str_data"] for _ in range(2)] == ["tick 0", "tick 1"]
    # the connection is gone: the server closes the model's generator, whose `finally` writes the marker
    assert ticker_end(marker).startswith("closed after"), "the model's stream was not closed"
    with make_client(grps_server.base_url, http_version) as c:
        ok(c.get("/grps/v1/health/live"))


def test_an_http2_stream_reset_closes_the_model_stream_and_the_connection_lives(
    grps_server: ServerProcess, tmp_path: Path
) -> None:
    import h2.events

    marker = tmp_path / "closed"
    with RawH2(grps_server.address) as conn:
        conn.start(1, "POST", PREDICT + "?streaming=true", [("content-type", "application/json")])
        conn.data(1, orjson.dumps({"model": "ticker", "str_data": str(marker)}), end=True)
        received = b""
        while b"\n" not in received:
            for event in conn.conn.receive_data(conn.sock.recv(65536)):
                if isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
                    received += event.data
                    conn.conn.acknowledge_received_data(event.flow_controlled_length, 1)
        assert orjson.loads(received.split(b"\n")[0])["str_data"] == "tick 0"
        conn.conn.reset_stream(1)
        conn.flush()
        assert ticker_end(marker).startswith("closed after"), "the model's stream was not closed"
        conn.start(3, "GET", "/grps/v1/health/live", end=True)
        status, body = conn.response(3)
        assert status == 200 and orjson.loads(body) == {"status": OK_STATUS}


# ------------------------------------------------------------------------------------------ offline


def test_offline_drains_every_readiness_probe_while_requests_are_served(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_model(repository, "echo", bytes_config("echo"), {1: echo_version(1)})
    server = start_server(repository)
    for version in ("http1", "http2"):
        with make_client(server.base_url, version) as c:
            ok(c.get("/grps/v1/health/ready"))
            assert c.get("/v2/health/ready").status_code == 200
            ok(c.post("/grps/v1/health/offline", content=b"{}"))
            failure(c.get("/grps/v1/health/ready"), 503, "offline")
            failure(c.post("/grps/v1/health/ready"), 503, "offline")
            ready = c.get("/v2/health/ready")
            assert (ready.status_code, ready.json()) == (400, {"ready": False})
            ok(c.get("/grps/v1/health/live"))
            assert c.get("/v2/health/live").status_code == 200
            assert ok(predict(c, {"str_data": "still served"}))["str_data"] == "v1:still served"
            ok(c.get("/grps/v1/health/online"))
            ok(c.get("/grps/v1/health/ready"))
            assert c.get("/v2/health/ready").json() == {"ready": True}
