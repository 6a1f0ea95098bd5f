"""grps streaming over REST (?streaming=true) against a real server, with httpx over HTTP/1.1 and
HTTP/2 and raw HTTP/2: each message as the model yields it, bin_data, errors before and after the first
message, and clients that leave."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
from e2e_helpers import (
    A,
    B,
    RawConnection,
    RawH2,
    ServerProcess,
    assert_connection_reused,
    http_request,
    make_client,
    wait_for_pending,
)
from grps_helpers import (
    OK_STATUS,
    PREDICT,
    failure,
    gtensor,
    messages,
    ok,
    predict,
    streamed,
    ticker_end,
)

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
