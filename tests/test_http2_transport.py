"""Our HTTP/2 transport with real clients (httpx, the `h2` library as a strict client, curl) and raw
frames for its defences: concurrent streams, rapid reset, CONTINUATION floods, HPACK bombs, control
frame floods, window overflows, cancellation and graceful shutdown."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    EXAMPLES,
    ServerProcess,
    identity_binary_request,
    missing,
    need_program,
    simple_inputs,
    split_binary_response,
    wait_for_file,
    write_model,
)
from h2_wire import (
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    H2Wire,
    frame,
)

pytestmark = pytest.mark.ours

STREAM_INFER_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
INFER = json.dumps({"inputs": simple_inputs(list(range(16)), [1] * 16, [1, 16])}).encode()


def _assert_serves(v2_server: ServerProcess) -> None:
    with H2Wire(v2_server.address) as fresh:
        fresh.open()
        fresh.request(1)
        assert fresh.response(1)[0] == 200


def test_httpx_runs_concurrent_requests_on_one_connection(v2_server: ServerProcess) -> None:
    with httpx.Client(base_url=v2_server.base_url, http1=False, http2=True, timeout=10) as client:
        from concurrent.futures import ThreadPoolExecutor

        def one(i: int) -> list[int]:
            body = {"inputs": simple_inputs(list(range(16)), [i] * 16, [1, 16])}
            response = client.post("/v2/models/simple/infer", json=body)
            assert response.http_version == "HTTP/2"
            return response.json()["outputs"][0]["data"]

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(32)))
    assert results == [[x + i for x in range(16)] for i in range(32)]


def test_the_h2_library_as_a_strict_client(v2_server: ServerProcess) -> None:
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=True, validate_inbound_headers=True, normalize_inbound_headers=False
        )
    )
    with socket.create_connection(v2_server.address, timeout=5) as sock:
        conn.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v2/models/simple/infer"),
            (":authority", "127.0.0.1"),
            ("content-length", str(len(INFER))),
        ]
        conn.send_headers(1, headers)
        conn.send_data(1, INFER, end_stream=True)
        sock.sendall(conn.data_to_send())
        status, body, ended = None, b"", False
        while not ended:
            data = sock.recv(65536)
            assert data, "connection closed"
            for event in conn.receive_data(data):  # raises on any protocol violation of the server's
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            sock.sendall(conn.data_to_send())
    assert status == b"200"
    assert json.loads(body)["outputs"][0]["data"] == [x + 1 for x in range(16)]


def test_curl_with_prior_knowledge(v2_server: ServerProcess) -> None:
    probe = subprocess.run(
        [need_program("curl", "apt-get install curl"), "--version"], capture_output=True, text=True
    )
    if "HTTP2" not in probe.stdout:
        missing("this curl has no HTTP/2")
    argv = ["curl", "-s", "--http2-prior-knowledge", "-w", "\n%{http_version}", "--data-binary", "@-"]
    argv += ["-H", "Content-Type: application/json", f"{v2_server.base_url}/v2/models/simple/infer"]
    out = subprocess.run(argv, input=INFER, capture_output=True, timeout=10, check=True)
    body, version = out.stdout.rsplit(b"\n", 1)
    assert version == b"2"
    assert json.loads(body)["outputs"][0]["data"] == [x + 1 for x in range(16)]


def test_a_header_block_sent_again_is_read_with_the_table_as_it_is_then(v2_server: ServerProcess) -> None:
    # The server keeps a repeated block's request head; the same bytes mean other fields once the HPACK
    # table has changed, and must be read as such.
    def get(wire: H2Wire, stream: int, block: bytes) -> tuple[int, bytes]:
        wire.send(frame(HEADERS, END_HEADERS | END_STREAM, stream, block))
        status, _, body = wire.response(stream)
        return status, body

    with H2Wire(v2_server.address) as wire:
        wire.open()
        assert (
            get(wire, 1, wire.block("GET", "/v2/models/simple"))[0] == 200
        )  # its :path and :authority indexed
        again = wire.block("GET", "/v2/models/simple")  # now all indexed: :path is entry 63, :authority 62
        for stream in (3, 5):
            status, body = get(wire, stream, again)
            assert status == 200 and json.loads(body)["name"] == "simple"
        missing_model = get(wire, 7, wire.block("GET", "/v2/models/no_such_model"))  # a new entry 62
        assert missing_model[0] == 404
        # The same bytes as `again`: entry 63 is now :authority and entry 62 the other :path.
        assert get(wire, 9, again) == missing_model


def test_large_binary_tensor_round_trips_with_flow_control(v2_server: ServerProcess) -> None:
    values = np.arange(2 * 1024 * 1024, dtype="<f4")  # 8 MiB, past every default window
    body, headers = identity_binary_request(values)
    with httpx.Client(base_url=v2_server.base_url, http1=False, http2=True, timeout=30) as client:
        response = client.post("/v2/models/identity_fp32/infer", content=body, headers=headers)
    assert response.http_version == "HTTP/2" and response.status_code == 200
    _, raw = split_binary_response(response)
    assert np.array_equal(np.frombuffer(raw["OUTPUT0"], dtype="<f4"), values)


def test_answer_waits_for_the_clients_window(v2_server: ServerProcess) -> None:
    """A client announcing a 10-byte stream window gets its answer 10 bytes at a time, as it opens it."""
    with H2Wire(v2_server.address) as h2:
        h2.open(client_settings=b"\x00\x04\x00\x00\x00\x0a")  # INITIAL_WINDOW_SIZE 10
        h2.request(1, "GET", "/v2/models/simple")
        received = b""
        while True:
            got = h2.read_frame()
            assert got is not None and got.kind != RST_STREAM
            if got.kind == DATA and got.stream == 1:
                assert len(got.payload) <= 10
                received += got.payload
                if got.flags & END_STREAM:
                    break
                if got.payload:
                    h2.send(frame(WINDOW_UPDATE, 0, 1, len(got.payload).to_bytes(4, "big")))
    assert json.loads(received)["name"] == "simple"


def test_streamed_grps_answer(v2_server: ServerProcess) -> None:
    with H2Wire(v2_server.address) as h2:
        h2.open()
        body = json.dumps({"str_data": "a b c", "model": "token_stream"}).encode()
        h2.request(
            1, "POST", "/grps/v1/infer/predict?streaming=true", body, [("content-type", "application/json")]
        )
        status, _, answer = h2.response(1)
    assert status == 200
    lines = answer.decode().splitlines()
    assert len(lines) >= 2 and all(json.loads(line)["status"]["status"] == "SUCCESS" for line in lines)


# ------------------------------------------------------------------------------------------ limits


def test_streams_past_the_limit_are_refused(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--http2-max-concurrent-streams", "2"))
    with H2Wire(server.address) as h2:
        h2.open()
        assert h2.server_settings[3] == 2  # MAX_CONCURRENT_STREAMS, as advertised
        for stream in (1, 3):  # open, their bodies never end
            h2.send(frame(HEADERS, END_HEADERS, stream, h2.block("POST", "/v2/models/simple/infer")))
        h2.request(5)
        h2.expect_stream_error(5, REFUSED_STREAM)
        h2.send(frame(RST_STREAM, 0, 1, CANCEL.to_bytes(4, "big")))  # one closes: room for another
        h2.request(7)
        assert h2.response(7)[0] == 200


def test_stalled_body_is_408_on_its_stream(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--http-body-timeout", "1"))
    with H2Wire(server.address, timeout=6) as h2:
        h2.open()
        h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", "/v2/models/simple/infer")))
        h2.send(frame(DATA, 0, 1, INFER[:20]))  # and never the rest
        status, _, body = h2.response(1)
        assert status == 408 and "--http-body-timeout" in json.loads(body)["error"]
        h2.request(3)  # the connection serves on
        assert h2.response(3)[0] == 200


def _rapid_reset(h2: H2Wire) -> None:
    """Streams opened and reset at once, 200 in one burst (CVE-2023-44487)."""
    burst = b""
    for n in range(200):
        stream = 1 + 2 * n
        burst += frame(HEADERS, END_HEADERS, stream, h2.block("POST", "/v2/models/simple/infer"))
        burst += frame(RST_STREAM, 0, stream, CANCEL.to_bytes(4, "big"))
    h2.send(burst)


def _continuation_flood(h2: H2Wire) -> None:
    """20 KB of a header block that never ends (CVE-2024-27316 class), over a 4 KiB head limit."""
    h2.send(frame(HEADERS, 0, 1, h2.block()))
    for _ in range(20):
        h2.send(frame(CONTINUATION, 0, 1, b"\x40\x01a\x01b" * 200))


def _hpack_bomb(h2: H2Wire) -> None:
    """One big field in the dynamic table, then a small block naming it hundreds of times."""
    h2.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, h2.block(extra=[("x-bomb", "b" * 3000)])))
    assert h2.response(1)[0] == 200
    index = bytes([0x80 | 62])  # the field just added: the newest dynamic entry
    h2.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, h2.block() + index * 500))


def _empty_data_flood(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", "/v2/models/simple/infer")))
    h2.send(frame(DATA, 0, 1, b"") * 500)


def _flood(one: bytes):
    return lambda h2: h2.send(one * 500)


CONTROL_LIMIT = ("--http2-max-control-frames-per-second", "100")
CALM = {  # abuse -> (the flag that limits it, the abuse)
    "rapid-reset": (("--http2-max-resets-per-second", "50"), _rapid_reset),
    "continuation-flood": (("--http-max-head-bytes", "4096"), _continuation_flood),
    "hpack-bomb": (("--http-max-head-bytes", "16384"), _hpack_bomb),
    "ping-flood": (CONTROL_LIMIT, _flood(frame(PING, 0, 0, b"12345678"))),
    "settings-flood": (CONTROL_LIMIT, _flood(frame(SETTINGS, 0, 0, b""))),
    "window-update-flood": (CONTROL_LIMIT, _flood(frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")))),
    "priority-flood": (CONTROL_LIMIT, _flood(frame(PRIORITY, 0, 9, b"\x00\x00\x00\x00\x10"))),
    "empty-data-flood": (CONTROL_LIMIT, _empty_data_flood),
}


@pytest.mark.parametrize("abuse", sorted(CALM))
def test_abuse_is_goaway_enhance_your_calm_and_the_server_serves_on(start_server, abuse: str) -> None:
    flags, attack = CALM[abuse]
    server = start_server(EXAMPLES, extra_args=flags)
    with H2Wire(server.address) as h2:
        h2.open()
        attack(h2)
        h2.expect_connection_error(ENHANCE_YOUR_CALM)
    _assert_serves(server)


def test_connection_window_past_the_maximum_is_flow_control_error(v2_server: ServerProcess) -> None:
    with H2Wire(v2_server.address) as h2:
        h2.open()
        h2.send(frame(WINDOW_UPDATE, 0, 0, (0x7FFFFFFF).to_bytes(4, "big")))
        h2.expect_connection_error(FLOW_CONTROL_ERROR)


def test_stream_window_past_the_maximum_is_a_stream_error(v2_server: ServerProcess) -> None:
    with H2Wire(v2_server.address) as h2:
        h2.open()
        h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", "/v2/models/simple/infer")))
        h2.send(frame(WINDOW_UPDATE, 0, 1, (0x7FFFFFFF).to_bytes(4, "big")))
        h2.expect_stream_error(1, FLOW_CONTROL_ERROR)
        h2.expect_alive()


SLOW_MODEL = """
import asyncio, pathlib
HERE = pathlib.Path(__file__).parent

class Model:
    async def execute(self, inputs):
        (HERE / "started").write_text("1")
        while not (HERE / "release").exists():
            await asyncio.sleep(0.01)
        return {"OUTPUT0": inputs["INPUT0"]}
"""
SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { }
"""
SLOW_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [7]}]}
).encode()


def test_client_reset_cancels_a_queued_request(start_server, tmp_path: Path) -> None:
    """A one-instance model busy with stream 1; stream 3 waits in its queue; the client resets stream 3.
    Stream 5, sent after the release, runs after anything still queued: two executions, not three."""
    repo = tmp_path / "models"
    write_model(repo, "slow", SLOW_CONFIG, {1: SLOW_MODEL})
    version_dir = repo / "slow" / "1"
    server = start_server(repo)
    try:
        with H2Wire(server.address, timeout=10) as h2:
            h2.open()
            h2.request(1, "POST", "/v2/models/slow/infer", SLOW_BODY)
            wait_for_file(version_dir / "started")
            h2.request(3, "POST", "/v2/models/slow/infer", SLOW_BODY)
            # The PING's ACK comes after the server read stream 3 whole and started its request (the
            # task runs before the loop reads the socket again), so stream 3 is queued by now.
            h2.expect_alive()
            h2.send(frame(RST_STREAM, 0, 3, CANCEL.to_bytes(4, "big")))
            h2.expect_alive()
            (version_dir / "release").write_text("1")
            assert h2.response(1)[0] == 200
            h2.request(5, "POST", "/v2/models/slow/infer", SLOW_BODY)
            assert h2.response(5)[0] == 200
        stats = httpx.get(f"{server.base_url}/v2/models/slow/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 2, stats
        assert stats["inference_stats"]["success"]["count"] == 2
    finally:
        (version_dir / "release").write_text("1")


def refusing_connections(address: tuple[str, int], timeout: float = 10) -> None:
    """Waits until the port refuses connections: on SIGTERM the server stops listening, then tells each
    connection to finish (both before it next reads a socket)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(address, timeout=timeout).close()
        except ConnectionRefusedError:
            return
        assert time.monotonic() < deadline, f"{address} still accepts connections"
        time.sleep(0.01)


def test_sigterm_answers_the_open_stream_then_goaway_and_exit_0(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "slow", SLOW_CONFIG, {1: SLOW_MODEL})
    version_dir = repo / "slow" / "1"
    server = start_server(repo)
    with H2Wire(server.address, timeout=10) as h2:
        h2.open()
        h2.request(1, "POST", "/v2/models/slow/infer", SLOW_BODY)
        wait_for_file(version_dir / "started")
        server.send_signal(signal.SIGTERM)
        refusing_connections(server.address)  # the shutdown has begun, stream 1 still unanswered
        (version_dir / "release").write_text("1")
        status, _, body = h2.response(1)  # (no GOAWAY before it: response() asserts that)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [7]
        frames = h2.frames_until(lambda f: f.kind == GOAWAY)
        assert frames[-1] is not None and frames[-1].kind == GOAWAY and frames[-1].error_code == 0
        assert int.from_bytes(frames[-1].payload[:4], "big") == 1  # the last stream it took
    assert server.wait(timeout=10) == 0


def test_window_updates_of_a_client_reading_an_answer_are_not_a_flood(start_server) -> None:
    """A client that opens its window a little per DATA frame sends many WINDOW_UPDATEs, all while the
    answer goes out: they do not count towards --http2-max-control-frames-per-second."""
    server = start_server(EXAMPLES, extra_args=("--http2-max-control-frames-per-second", "20"))
    with H2Wire(server.address) as h2:
        h2.open(client_settings=b"\x00\x04\x00\x00\x00\x10")  # INITIAL_WINDOW_SIZE 16
        h2.request(1, "GET", "/v2/models/simple/config")
        received, updates = b"", 0
        while True:
            got = h2.read_frame()
            assert got is not None and got.kind not in (GOAWAY, RST_STREAM), got
            if got.kind == DATA and got.stream == 1:
                received += got.payload
                if got.flags & END_STREAM:
                    break
                h2.send(frame(WINDOW_UPDATE, 0, 1, len(got.payload).to_bytes(4, "big")))
                h2.send(frame(WINDOW_UPDATE, 0, 0, len(got.payload).to_bytes(4, "big")))
                updates += 2
    assert updates > 40
    assert json.loads(received)["name"] == "simple"


# ------------------------------------------------------------------ the head and keep-alive timeouts

TIMEOUT = 2  # s, longer than the 1 s sweep that fires these timeouts: early is told apart from on time
GENEROUS = 15.0  # s: a bound on a timeout's firing that a loaded machine meets


def closed_after(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a read timing out fails the test)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def test_a_connection_without_the_whole_preface_is_closed_after_the_head_timeout(start_server) -> None:
    """docs/operations/transport.md: HTTP/2 with no preface within --http-head-timeout is closed. Half a
    preface on either port, and nothing at all, are closed after the timeout, not before it; a connection
    that sent the whole preface at the same moment is served on (keep-alive is 75 s)."""
    server = start_server(EXAMPLES, extra_args=("--http-head-timeout", str(TIMEOUT)))
    started = time.monotonic()
    ports = {"http half": server.port, "grpc half": server.grpc_port, "grpc nothing": server.grpc_port}
    socks = {
        name: socket.create_connection(("127.0.0.1", port), timeout=GENEROUS) for name, port in ports.items()
    }
    try:
        with H2Wire(server.address, timeout=GENEROUS) as whole:
            whole.open()
            socks["http half"].sendall(PREFACE[:16])  # "PRI * HTTP/2.0\r\n": HTTP/2, then nothing more
            socks["grpc half"].sendall(PREFACE[:-1])
            for name, sock in socks.items():
                closed_after(sock)
                elapsed = time.monotonic() - started
                assert TIMEOUT <= elapsed < GENEROUS, f"{name}: closed after {elapsed:.2f} s"
            whole.expect_alive()
            whole.request(1)
            assert whole.response(1)[0] == 200
    finally:
        for sock in socks.values():
            sock.close()


def test_an_idle_connection_gets_goaway_then_close_after_the_keep_alive_timeout(start_server) -> None:
    """docs/protocols/v2-grpc.md: an HTTP/2 connection (gRPC's too) with no stream open for
    --http-keep-alive-timeout gets GOAWAY NO_ERROR, naming the last stream it took, and is closed; one with
    a gRPC call open (idle, its messages still to come) is not."""
    server = start_server(EXAMPLES, extra_args=("--http-keep-alive-timeout", str(TIMEOUT)))
    with (
        H2Wire(server.address, timeout=GENEROUS) as http,
        H2Wire(("127.0.0.1", server.grpc_port), timeout=GENEROUS) as grpc_idle,
        H2Wire(("127.0.0.1", server.grpc_port), timeout=GENEROUS) as grpc_open,
    ):
        started = time.monotonic()  # each idle clock starts later: at the preface, then at each answer
        for h2 in (http, grpc_idle, grpc_open):
            h2.open()
        http.request(1)
        assert http.response(1)[0] == 200
        # grpc_open: a ModelStreamInfer call, its headers sent, no message yet, the stream left open
        call = [("content-type", "application/grpc"), ("te", "trailers")]
        grpc_open.send(frame(HEADERS, END_HEADERS, 1, grpc_open.block("POST", STREAM_INFER_PATH, call)))
        for name, h2, last_stream in (("http", http, 1), ("grpc", grpc_idle, 0)):
            frames = h2.frames_until(lambda f: f.kind == GOAWAY)
            elapsed = time.monotonic() - started
            goaway = frames[-1]
            assert goaway is not None and goaway.kind == GOAWAY, f"{name}: closed without GOAWAY: {frames}"
            assert goaway.error_code == NO_ERROR, name
            assert int.from_bytes(goaway.payload[:4], "big") == last_stream, name
            assert h2.read_frame() is None, f"{name}: not closed after GOAWAY"
            assert TIMEOUT <= elapsed < GENEROUS, f"{name}: GOAWAY after {elapsed:.2f} s"
        grpc_open.expect_alive()  # past the timeout, its call open: served on
