"""Our HTTP/1.1 transport over raw sockets and real clients: keep-alive, pipelining, chunked bodies,
100-continue, HEAD, HTTP/1.0, streamed answers, and every limit with its flag."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    EXAMPLES,
    RawConnection,
    ServerProcess,
    chunked,
    http_request,
    identity_binary_request,
    need_program,
    simple_inputs,
    split_binary_response,
)

from bench.procs import process_tree

pytestmark = pytest.mark.ours

A, B = list(range(16)), [1] * 16
INFER = json.dumps({"inputs": simple_inputs(A, B, [1, 16])}).encode()
SUMS = [a + b for a, b in zip(A, B, strict=True)]


def _outputs(body: bytes) -> dict:
    return {o["name"]: o["data"] for o in json.loads(body)["outputs"]}


def _assert_serves(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=5) as client:
        assert client.get("/v2/health/live").json() == {"live": True}


def test_keep_alive_serves_many_requests_on_one_connection(v2_server: ServerProcess) -> None:
    with RawConnection(v2_server.address) as conn:
        for _ in range(5):
            conn.send(http_request("POST", "/v2/models/simple/infer", INFER, port=v2_server.port))
            response = conn.read_response()
            assert response.status == 200
            assert _outputs(response.body)["OUTPUT0"] == SUMS
        assert response.header("connection") is None  # nothing announced closing


def test_pipelined_requests_are_answered_in_order(v2_server: ServerProcess) -> None:
    requests = [
        http_request("GET", "/v2/health/live", port=v2_server.port),
        http_request("POST", "/v2/models/simple/infer", INFER, port=v2_server.port),
        http_request("GET", "/v2/nowhere", port=v2_server.port),
        http_request("GET", "/v2/models/simple", port=v2_server.port),
        http_request("GET", "/v2/health/ready", port=v2_server.port),
    ]
    with RawConnection(v2_server.address) as conn:
        conn.send(b"".join(requests))  # all in one write
        answers = [conn.read_response() for _ in requests]
    assert [a.status for a in answers] == [200, 200, 404, 200, 200]
    assert answers[0].json() == {"live": True}
    assert _outputs(answers[1].body)["OUTPUT0"] == SUMS
    assert "/v2/nowhere" in answers[2].json()["error"]
    assert answers[3].json()["name"] == "simple"
    assert answers[4].json() == {"ready": True}


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/nowhere"])  # answered by its handler, or early
def test_the_request_that_says_close_is_the_last_one_read(v2_server: ServerProcess, path: str) -> None:
    """Bytes after a request with `connection: close` are not read, let alone answered (a 400 for them
    was found by the fuzzer's output checks): one answer, then the close."""
    close = http_request("GET", path, headers={"Connection": "close"}, port=v2_server.port)
    after = http_request("GET", "/v2/health/ready", port=v2_server.port)
    with RawConnection(v2_server.address) as conn:
        conn.send(close + after + b"BAD\x01 / HTTP/1.1\r\n\r\n")
        answer = conn.read_response()
        assert answer.status == (200 if path == "/v2/health/live" else 404)
        assert answer.header("connection") == "close"
        assert conn.read_response() is None, "an answer after the last request"


def test_chunked_request_body_is_reassembled(v2_server: ServerProcess) -> None:
    pieces = [INFER[:10], INFER[10:100], INFER[100:]]
    head = http_request(
        "POST", "/v2/models/simple/infer", headers={"Transfer-Encoding": "chunked"}, port=v2_server.port
    )
    with RawConnection(v2_server.address) as conn:
        conn.send(head + chunked(*pieces))
        response = conn.read_response()
    assert response.status == 200
    assert _outputs(response.body)["OUTPUT1"] == [a - b for a, b in zip(A, B, strict=True)]


def test_body_sent_in_slow_pieces_is_read_whole(v2_server: ServerProcess) -> None:
    """The body of a declared length, coming in pieces after its head (read straight into its buffer)."""
    head = http_request(
        "POST", "/v2/models/simple/infer", headers={"Content-Length": str(len(INFER))}, port=v2_server.port
    )
    with RawConnection(v2_server.address) as conn:
        conn.send(head)
        for start in range(0, len(INFER), 50):
            conn.send(INFER[start : start + 50])
            time.sleep(0.01)
        response = conn.read_response()
        assert response.status == 200 and _outputs(response.body)["OUTPUT0"] == SUMS
        conn.send(http_request("GET", "/v2/health/live", port=v2_server.port))  # the parser is in step
        assert conn.read_response().json() == {"live": True}


def test_expect_100_continue_for_a_request_that_will_be_read(v2_server: ServerProcess) -> None:
    head = http_request(
        "POST",
        "/v2/models/simple/infer",
        headers={"Content-Length": str(len(INFER)), "Expect": "100-continue"},
        port=v2_server.port,
    )
    with RawConnection(v2_server.address) as conn:
        conn.send(head)
        interim = conn._take_until(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue"
        conn.send(INFER)
        response = conn.read_response()
    assert response.status == 200 and _outputs(response.body)["OUTPUT0"] == SUMS


@pytest.mark.parametrize(
    ("path", "length", "status"),
    [("/v2/nowhere", 100, 404), ("/v2/models/identity_fp32/infer", 10_000, 413)],
)
def test_expect_100_continue_gets_the_final_status_at_once(
    start_server, path: str, length: int, status: int
) -> None:
    server = start_server(EXAMPLES, extra_args=("--max-request-bytes", "4096"))
    head = http_request(
        "POST", path, headers={"Content-Length": str(length), "Expect": "100-continue"}, port=server.port
    )
    with RawConnection(server.address, timeout=2) as conn:
        conn.send(head)
        response = conn.read_response()  # no body sent: the answer must not wait for it
    assert response.status == status
    assert response.header("connection") == "close"
    assert "error" in response.json()
    _assert_serves(server)


def test_head_answers_the_headers_of_get_without_a_body(v2_server: ServerProcess) -> None:
    with RawConnection(v2_server.address) as conn:
        conn.send(http_request("GET", "/v2/models/simple", port=v2_server.port))
        get = conn.read_response()
        conn.send(http_request("HEAD", "/v2/models/simple", port=v2_server.port))
        head = conn._take_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert f"content-length: {len(get.body)}".encode() in head.lower()
        conn.send(http_request("GET", "/v2/health/live", port=v2_server.port))  # no body was in between
        assert conn.read_response().json() == {"live": True}


def test_http10_is_answered_and_closed_unless_keep_alive(v2_server: ServerProcess) -> None:
    with RawConnection(v2_server.address) as conn:
        conn.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        response = conn.read_response()
        assert response.status == 200 and response.json() == {"live": True}
        assert conn.closed_by_peer()
    with RawConnection(v2_server.address) as conn:
        conn.send(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert conn.read_response().json() == {"live": True}
        conn.send(b"GET /v2/health/ready HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert conn.read_response().json() == {"ready": True}


def _grps_stream_request(version: str, connection: str = "") -> bytes:
    body = json.dumps({"str_data": "a b c", "model": "token_stream"}).encode()
    field = f"Connection: {connection}\r\n" if connection else ""
    return (
        f"POST /grps/v1/infer/predict?streaming=true HTTP/{version}\r\nHost: x\r\n{field}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _until_closed(address: tuple[str, int], request: bytes) -> tuple[bytes, bytes]:
    """The head and body of the one answer to `request`, read until the server closes."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(request)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.lower(), body


def test_streamed_answer_is_chunked_over_http11_and_close_delimited_over_http10(
    v2_server: ServerProcess,
) -> None:
    with RawConnection(v2_server.address) as conn:
        conn.send(_grps_stream_request("1.1"))
        chunked_answer = conn.read_response()
    assert chunked_answer.header("transfer-encoding") == "chunked"
    lines = chunked_answer.body.decode().splitlines()
    assert len(lines) >= 2 and all(json.loads(line)["status"]["status"] == "SUCCESS" for line in lines)
    # HTTP/1.0 has no chunked encoding: the close ends the stream, even where the client asked to keep the
    # connection (then the version is read from the request line, not from keep-alive)
    for connection in ("", "keep-alive"):
        head, body = _until_closed(v2_server.address, _grps_stream_request("1.0", connection))
        assert b"transfer-encoding" not in head
        assert body.decode().splitlines() == lines
    head, body = _until_closed(v2_server.address, _grps_stream_request("1.1", "close"))
    assert b"transfer-encoding: chunked" in head and b"connection: close" in head
    assert body.endswith(b"0\r\n\r\n")


def test_streamed_answer_through_httpx(v2_server: ServerProcess) -> None:
    body = {"str_data": "x y", "model": "token_stream"}
    with (
        httpx.Client(base_url=v2_server.base_url, timeout=10) as client,
        client.stream("POST", "/grps/v1/infer/predict?streaming=true", json=body) as response,
    ):
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert len(lines) >= 2 and lines[0]["status"]["code"] == 200


def test_large_binary_tensor_round_trips_exactly(v2_server: ServerProcess) -> None:
    values = np.arange(2 * 1024 * 1024, dtype="<f4")  # 8 MiB
    body, headers = identity_binary_request(values)
    with httpx.Client(base_url=v2_server.base_url, timeout=30) as client:
        response = client.post("/v2/models/identity_fp32/infer", content=body, headers=headers)
    assert response.status_code == 200
    doc, raw = split_binary_response(response)
    assert doc["outputs"][0]["shape"] == [values.size]
    assert np.array_equal(np.frombuffer(raw["OUTPUT0"], dtype="<f4"), values)


def test_curl_gets_an_answer(v2_server: ServerProcess) -> None:
    need_program("curl", "apt-get install curl")
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
            f"{v2_server.base_url}/v2/models/simple/infer",
        ],
        input=INFER,
        capture_output=True,
        timeout=10,
        check=True,
    )
    assert _outputs(out.stdout)["OUTPUT0"] == SUMS


# ------------------------------------------------------------------------------------------ limits


def test_head_over_the_limit_is_431_and_closes(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--http-max-head-bytes", "2048"))
    with RawConnection(server.address, timeout=5) as conn:
        conn.send(http_request("GET", "/v2/health/live", headers={"X-Big": "a" * 4000}, port=server.port))
        response = conn.read_response()
        assert response.status == 431
        assert "--http-max-head-bytes" in response.json()["error"]
        assert response.header("connection") == "close"
    with RawConnection(server.address, timeout=5) as conn:  # just under it: served
        conn.send(http_request("GET", "/v2/health/live", headers={"X-Big": "a" * 1500}, port=server.port))
        assert conn.read_response().status == 200


# The timeouts below are 2 s: longer than the 1 s sweep that fires them, so that firing early (at the next
# sweep) is told apart from firing on time.
TIMEOUT = 2
GENEROUS = 15.0  # s: a bound on a timeout's firing that a loaded machine meets; the order is the test's


def assert_timed_out(started: float, timeout: float) -> None:
    """What the client saw came after the server's `timeout` (never before it), and in time."""
    elapsed = time.monotonic() - started
    assert timeout <= elapsed < GENEROUS, f"{elapsed:.2f} s, the timeout {timeout} s"


def test_slow_head_is_408_and_closes(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--http-head-timeout", str(TIMEOUT)))
    started = time.monotonic()
    with RawConnection(server.address, timeout=GENEROUS) as conn:
        conn.send(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # and never the end of the head
        response = conn.read_response()
        assert response.status == 408, response
        assert "--http-head-timeout" in response.json()["error"]
        assert_timed_out(started, TIMEOUT)
        assert conn.closed_by_peer()
    _assert_serves(server)


def test_stalled_body_is_408_and_closes(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--http-body-timeout", str(TIMEOUT)))
    head = http_request(
        "POST", "/v2/models/simple/infer", headers={"Content-Length": str(len(INFER))}, port=server.port
    )
    with RawConnection(server.address, timeout=GENEROUS) as conn:
        started = time.monotonic()
        conn.send(head + INFER[:20])  # and never the rest
        response = conn.read_response()
        assert response.status == 408, response
        assert "--http-body-timeout" in response.json()["error"]
        assert_timed_out(started, TIMEOUT)
        assert conn.closed_by_peer()
    _assert_serves(server)


def test_idle_keep_alive_connection_is_closed_after_its_timeout(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--http-keep-alive-timeout", str(TIMEOUT)))
    with RawConnection(server.address, timeout=GENEROUS) as conn:
        conn.send(http_request("GET", "/v2/health/live", port=server.port))
        started = time.monotonic()  # before the answer: the server's idle clock starts once it is sent
        assert conn.read_response().status == 200
        assert conn.closed_by_peer()
        assert_timed_out(started, TIMEOUT)


def test_connections_past_the_limit_get_503_while_the_others_work(start_server) -> None:
    # The limit is each serving process's (each worker's with --workers N): one process here, so which
    # of several workers accepts a connection does not decide which is refused.
    server = start_server(EXAMPLES, extra_args=("--http-max-connections", "3", "--workers", "1"))
    held = [RawConnection(server.address, timeout=5) for _ in range(3)]
    try:
        for conn in held:  # each counted: it has been served once
            conn.send(http_request("GET", "/v2/health/live", port=server.port))
            assert conn.read_response().status == 200
        with RawConnection(server.address, timeout=5) as extra:
            response = extra.read_response()
            assert response.status == 503
            assert "--http-max-connections" in response.json()["error"]  # C++ clients read the error
            assert extra.closed_by_peer()
        held[0].send(http_request("GET", "/v2/health/ready", port=server.port))
        assert held[0].read_response().status == 200
    finally:
        for conn in held:
            conn.close()
    deadline = time.monotonic() + 5
    while True:  # once they are gone, new connections are served
        try:
            _assert_serves(server)
            break
        except (httpx.HTTPError, AssertionError):
            assert time.monotonic() < deadline
            time.sleep(0.1)


def _open_fds(pid: int) -> int:
    """Open file descriptors of the server: every process of it (an engine and its workers)."""
    return sum(len(os.listdir(f"/proc/{each}/fd")) for each in process_tree(pid))


def test_connections_the_client_closes_are_closed_at_once(v2_server: ServerProcess) -> None:
    """No CLOSE_WAIT pile-up: the server's sockets go as soon as the clients close theirs."""
    _assert_serves(v2_server)
    pid = v2_server.proc.pid
    baseline = _open_fds(pid)
    conns = [RawConnection(v2_server.address, timeout=5) for _ in range(50)]
    for conn in conns:
        conn.send(http_request("GET", "/v2/health/live", port=v2_server.port))
        assert conn.read_response().status == 200
    assert _open_fds(pid) >= baseline + 45  # (the baseline may still hold a socket on its way out)
    for conn in conns:
        conn.close()
    deadline = time.monotonic() + 2
    while _open_fds(pid) > baseline:
        assert time.monotonic() < deadline, f"{_open_fds(pid) - baseline} sockets still open on the server"
        time.sleep(0.05)


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /v2/health/live HTTP/1.1\r\nHost x\r\n\r\n",
        b"BR0KEN\x00 / HTTP/1.1\r\n\r\n",
        b"GET /v2/health/live HTTP/9.9\r\n\r\n",
        b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: -3\r\n\r\n",
    ],
    ids=["header-without-colon", "bad-method", "bad-version", "length-and-chunked", "negative-length"],
)
def test_malformed_requests_are_400_and_close(v2_server: ServerProcess, raw: bytes) -> None:
    with RawConnection(v2_server.address, timeout=5) as conn:
        conn.send(raw)
        response = conn.read_response()
        assert response.status == 400
        assert response.header("connection") == "close"
        assert isinstance(response.json()["error"], str)
        assert conn.closed_by_peer()
    _assert_serves(v2_server)
