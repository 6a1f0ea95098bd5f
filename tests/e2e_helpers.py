"""Shared pieces of the end-to-end tests: a real server process, model repositories, wire helpers."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "model_repository"
# `make test` sets TENSORGATE_REQUIRE_PEERS=1: then a missing outside peer (h2load, wrk, curl, perf_analyzer,
# chromium) or optional package (onnx, onnxruntime, torch, OpenTelemetry) fails the tests that need it
# instead of skipping them, so that "the whole suite" is the whole suite.
REQUIRE_PEERS = os.environ.get("TENSORGATE_REQUIRE_PEERS", "") not in ("", "0")


def missing(reason: str) -> NoReturn:
    """What a test needs is not here: skip with `reason`, or fail with it under TENSORGATE_REQUIRE_PEERS."""
    if REQUIRE_PEERS:
        pytest.fail(f"{reason}; TENSORGATE_REQUIRE_PEERS is set (make test): a failure, not a skip")
    pytest.skip(reason, allow_module_level=True)  # within a test, it skips that test only


def need_module(name: str, why: str = "") -> Any:
    """The module `name`, imported; missing, as `missing` says (pytest.importorskip's strict twin)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"needs {name}{' (' + why + ')' if why else ''}: {e}")


def need_program(name: str, install: str) -> str:
    """The path of the program `name`; missing, as `missing` says, with how to install it."""
    path = shutil.which(name)
    if path is None:
        missing(f"needs {name} ({install})")
    return path


LISTEN_RE = re.compile(rb"HTTP listening on 127\.0\.0\.1:(\d+)")
GRPC_LISTEN_RE = re.compile(rb"gRPC listening on 127\.0\.0\.1:(\d+)")
METRICS_LISTEN_RE = re.compile(rb"Metrics listening on 127\.0\.0\.1:(\d+)")
# `make test` runs the HTTP end-to-end tests a second time on the reference transport (hypercorn):
# TENSORGATE_TEST_HTTP_SERVER=hypercorn adds `--http-server hypercorn` to every server started here.
HTTP_SERVER = os.environ.get("TENSORGATE_TEST_HTTP_SERVER", "")
HTTP_SERVER_ARGS = ("--http-server", HTTP_SERVER) if HTTP_SERVER else ()
# ... and its end-to-end tests again with front-end workers beside an engine: TENSORGATE_TEST_WORKERS=2 adds
# `--workers 2 --engine-front-end false` to every server started here, so that every connection reaches a
# worker and every request crosses to the engine (with the engine accepting too, the kernel would give it
# about half of them, and a worker-only bug would fail one run in two). A test that sets --workers itself
# keeps its own.
WORKERS = int(os.environ.get("TENSORGATE_TEST_WORKERS", "1"))
WORKERS_ARGS = ("--workers", str(WORKERS), "--engine-front-end", "false") if WORKERS > 1 else ()
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
LOG_TAIL = 20_000


class ServerProcess:
    """One `tensorgate serve` process (as `python -m tensorgate.server serve`), its stderr/stdout in a log
    file, its port from the log."""

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        *,
        extra_args: tuple[str, ...] = (),
        log_level: str = "info",
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = env  # the process's environment; None: this one's
        self.repository = Path(repository)
        self.log_path = Path(log_path)
        self.extra_args = tuple(extra_args)
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None  # None with --allow-metrics false
        self.returncode: int | None = None
        self.killed = False  # set when wait() had to kill it: the failure was already raised there

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tensorgate.server",
            "serve",
            "--model-repository",
            str(self.repository),
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--log-level",
            self.log_level,
            *HTTP_SERVER_ARGS,
            *(WORKERS_ARGS if "--workers" not in self.extra_args else ()),
            *self.extra_args,
        ]

    def start(self, timeout: float = START_TIMEOUT) -> ServerProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log_bytes = self.log_path.read_bytes()
            found = LISTEN_RE.search(log_bytes)
            if found:  # gRPC listens before HTTP, so its line is there by now
                self.port = int(found.group(1))
                self.grpc_port = int(GRPC_LISTEN_RE.search(log_bytes).group(1))
                metrics = METRICS_LISTEN_RE.search(log_bytes)  # logged before HTTP too, when enabled
                self.metrics_port = int(metrics.group(1)) if metrics else None
                return self
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise RuntimeError(
                    f"server exited with {self.returncode} before listening:\n{self.log_text()}"
                )
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"server did not log its port within {timeout} s:\n{self.log_text()}")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        assert self.port is not None
        return ("127.0.0.1", self.port)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError as e:
            return f"<no log: {e}>"

    def send_signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """The exit code; kills the process (and raises) if it does not exit within `timeout`."""
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server did not exit within {timeout} s; killed") from None
        return self.returncode

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        if self.proc is None:
            raise RuntimeError("server was never started")
        if self.proc.poll() is None:
            self.send_signal(signum)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            self.proc.wait(10)


def stop_all(servers: list[ServerProcess]) -> None:
    """SIGTERM each server still running; every one must exit 0 (a hung one is killed and fails)."""
    failures = []
    for server in servers:
        if server.proc is None or server.killed:
            continue
        try:
            code = server.stop()
        except AssertionError as e:
            failures.append(f"{server.repository}: {e}\n{server.log_text()[-LOG_TAIL:]}")
            continue
        if code != 0:
            failures.append(f"{server.repository}: exit code {code}\n{server.log_text()[-LOG_TAIL:]}")
    if failures:
        pytest.fail("server shutdown failed:\n" + "\n".join(failures))


def make_client(base_url: str, http_version: str, **kwargs) -> httpx.Client:
    """An httpx client speaking HTTP/1.1, or HTTP/2 with prior knowledge (h2c); each response is checked
    to have really come over that protocol."""
    expected = {"http1": "HTTP/1.1", "http2": "HTTP/2"}[http_version]

    def check_version(response: httpx.Response) -> None:
        assert response.http_version == expected, f"got {response.http_version}, wanted {expected}"

    return httpx.Client(
        base_url=base_url,
        http1=http_version == "http1",
        http2=http_version == "http2",
        timeout=kwargs.pop("timeout", 15.0),
        event_hooks={"response": [check_version]},
        **kwargs,
    )


# ------------------------------------------------------------------------------------------ repositories


def wait_for_file(path: Path, timeout: float = 10) -> None:
    """Waits for a file a test model writes to say it got somewhere."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def write_model(
    repository: Path,
    name: str,
    config: str | dict,
    versions: dict[int, str | None],
    *,
    config_file: str | None = None,
) -> Path:
    """`<repository>/<name>/config.pbtxt` (a str) or config.json (a dict), and `<n>/model.py` per version."""
    directory = repository / name
    directory.mkdir(parents=True)
    if isinstance(config, dict):
        (directory / (config_file or "config.json")).write_text(json.dumps(config))
    else:
        (directory / (config_file or "config.pbtxt")).write_text(config)
    for number, code in versions.items():
        (directory / str(number)).mkdir()
        if code is not None:  # None: an empty version folder (an ensemble's)
            (directory / str(number) / "model.py").write_text(code)
    return directory


IDENTITY_MODEL = """
class Model:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""


def int32_config(name: str, *, policy: str = "", max_batch_size: int = 0, dims: str = "[ -1 ]") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: {dims} }} ]
{policy}
"""


# ------------------------------------------------------------------------------------------ HTTP helpers


def local_port(response: httpx.Response) -> int:
    """The client-side port of the connection that carried `response`."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def assert_connection_reused(client: httpx.Client, previous: httpx.Response) -> None:
    """The server still answers, on the same keep-alive connection that carried `previous`."""
    port = local_port(previous)
    follow = client.get("/v2/health/live")
    assert follow.status_code == 200, follow.text
    assert follow.json() == {"live": True}
    assert local_port(follow) == port, "the server closed the keep-alive connection after the error"


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    message = body["error"]
    assert isinstance(message, str) and message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def binary_body(header: dict, *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor-data request: JSON header then raw chunks, and the headers announcing it."""
    head = json.dumps(header).encode()
    return head + b"".join(chunks), {"Inference-Header-Content-Length": str(len(head))}


def identity_binary_request(values) -> tuple[bytes, dict[str, str]]:
    """An FP32 tensor for identity_fp32 as binary tensor data, its output asked for as binary too."""
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [values.size],
                "parameters": {"binary_data_size": values.nbytes},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    return binary_body(header, values.tobytes())


def split_binary_response(response: httpx.Response) -> tuple[dict, dict[str, bytes]]:
    """(JSON header, {output name: raw bytes}) of a binary-tensor-data response."""
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    body = response.content
    doc = json.loads(body[:length])
    raw, offset = {}, length
    for output in doc["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        assert "data" not in output
        raw[output["name"]] = body[offset : offset + size]
        offset += size
    assert offset == len(body), "binary response has bytes no output accounts for"
    return doc, raw


def encode_bytes_elements(elements: list[bytes]) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def decode_bytes_elements(raw: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(raw):
        length = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4
        out.append(raw[offset : offset + length])
        offset += length
    assert offset == len(raw)
    return out


# ------------------------------------------------------------------------------------------ raw sockets


class RawResponse:
    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"RawResponse({self.status}, {self.headers!r}, {self.body[:300]!r})"


class RawConnection:
    """A plain TCP socket speaking HTTP/1.1 by hand; responses are parsed off a buffer (pipelining-safe)."""

    def __init__(self, address: tuple[str, int], timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def _take_until(self, marker: bytes) -> bytes | None:
        while marker not in self.buffer:
            if not self._fill():
                return None
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise ConnectionError(f"connection closed with {len(self.buffer)} of {n} body bytes")
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def read_response(self) -> RawResponse | None:
        """The next response, or None when the server closed the connection before sending one."""
        head = self._take_until(b"\r\n\r\n")
        if head is None:
            assert not self.buffer, f"connection closed mid-response: {self.buffer!r}"
            return None
        lines = head.decode("latin-1").split("\r\n")
        version, status, *reason = lines[0].split(" ", 2)
        assert version == "HTTP/1.1", lines[0]
        headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:]]
        response = RawResponse(int(status), reason[0] if reason else "", headers, b"")  # type: ignore[arg-type]
        if response.header("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line = self._take_until(b"\r\n")
                assert size_line is not None, "connection closed inside a chunked body"
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    self._take_until(b"\r\n")
                    break
                body += self._take(size)
                assert self._take(2) == b"\r\n"
            response.body = body
        elif response.header("content-length") is not None:
            response.body = self._take(int(response.header("content-length")))  # type: ignore[arg-type]
        else:
            while self._fill():
                pass
            response.body, self.buffer = self.buffer, b""
        return response

    def closed_by_peer(self) -> bool:
        """True when the server has closed its side (EOF, or a reset)."""
        try:
            return not self._fill()
        except ConnectionResetError:
            return True


def http_request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *, port: int
) -> bytes:
    """An HTTP/1.1 request with a Content-Length (unless headers say Transfer-Encoding)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    headers = dict(headers or {})
    if body and "Transfer-Encoding" not in headers and "Content-Length" not in headers:
        headers["Content-Length"] = str(len(body))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(*pieces: bytes) -> bytes:
    """A Transfer-Encoding: chunked body carrying `pieces`, one chunk each."""
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces if p) + b"0\r\n\r\n"


def wait_for_pending(server: ServerProcess, model: str, count: int, timeout: float = 10.0) -> None:
    """Waits until the model's queue holds `count` requests, as /metrics' nv_inference_pending_request_count
    says: what a test waits on instead of a sleep when it needs a request queued (or gone)."""
    pattern = re.compile(
        rf'^nv_inference_pending_request_count{{model="{re.escape(model)}",version="\d+"}} (\d+)', re.M
    )
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
        found = pattern.search(text)
        if found and int(found.group(1)) == count:
            return
        assert time.monotonic() < deadline, f"{model}: never {count} pending: {found and found.group(0)}"
        time.sleep(0.01)


def wait_until_refused(address: tuple[str, int], timeout: float) -> float | None:
    """Seconds until a new TCP connection to `address` is refused, or None if it never was within timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with socket.create_connection(address, timeout=1.0):
                pass
        except ConnectionRefusedError:
            return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.02)
    return None


class RawH2:
    """A prior-knowledge HTTP/2 (h2c) client on a plain socket, driven frame by frame with the h2 library,
    for what httpx cannot do: keep sending a request body after the response arrived."""

    def __init__(self, address: tuple[str, int], timeout: float = 10.0) -> None:
        import h2.config
        import h2.connection

        self.sock = socket.create_connection(address, timeout=timeout)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.authority = f"{address[0]}:{address[1]}"
        self.closed = False

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(
        self, stream_id: int, method: str, path: str, extra: list[tuple[str, str]] = (), end=False
    ) -> None:
        headers = [(":method", method), (":path", path), (":scheme", "http"), (":authority", self.authority)]
        self.conn.send_headers(stream_id, headers + list(extra), end_stream=end)
        self.flush()

    def data(self, stream_id: int, payload: bytes, end: bool = False) -> None:
        self.conn.send_data(stream_id, payload, end_stream=end)
        self.flush()

    def response(self, stream_id: int) -> tuple[int | None, bytes]:
        """(status, body) once the stream ends; (None, partial body) if the connection ends first."""
        import h2.events

        status, body = None, b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None, body
            for event in self.conn.receive_data(chunk):
                if isinstance(event, h2.events.ConnectionTerminated):
                    self.closed = True
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    self.flush()
                    return status, body
            self.flush()


# The inputs of the `simple` example model, as the e2e tests send them.
A = list(range(16))
B = [3 * i - 20 for i in range(16)]


def simple_inputs(a: list, b: list, shape: list[int]) -> list[dict]:
    return [
        {"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": a},
        {"name": "INPUT1", "datatype": "INT32", "shape": shape, "data": b},
    ]


async def serving_in_process(router: Any, client: Any) -> Any:
    """Our transport serving `router` on a loopback port of this process's running event loop, while
    `client(address)` runs in a thread; its result, once the listener has shut down."""
    import asyncio

    from tensorgate.server.http.listener import HttpSettings, Listener, bind

    sockets = bind("127.0.0.1", 0)
    listener = Listener(router, HttpSettings(), sockets)
    await listener.start()
    try:
        return await asyncio.get_running_loop().run_in_executor(None, client, sockets[0].getsockname()[:2])
    finally:
        await listener.shutdown()
