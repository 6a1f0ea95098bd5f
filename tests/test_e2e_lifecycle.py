"""Process lifecycle: the port-0 log line, and graceful SIGTERM/SIGINT with a request in flight."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    IDENTITY_MODEL,
    RawH2,
    int32_config,
    make_client,
    wait_until_refused,
    write_model,
)

SLEEP_S = 1.0

SLOW_MODEL = f"""
import asyncio
from pathlib import Path

STARTED = Path(__file__).parent / "started"


class Model:
    async def execute(self, inputs):
        STARTED.write_text("started")
        await asyncio.sleep({SLEEP_S})
        return {{"OUTPUT0": inputs["INPUT0"] * 2}}
"""

SLOW_LOADING_MODEL = """
import time


class Model:
    def initialize(self, config):
        time.sleep(0.5)
        self.loaded = True

    def execute(self, inputs):
        assert self.loaded
        return {"OUTPUT0": inputs["INPUT0"]}
"""


def lifecycle_repository(repo: Path, *, slow_loading: bool = False) -> Path:
    write_model(repo, "slow", int32_config("slow"), {1: SLOW_MODEL})
    write_model(repo, "fast", int32_config("fast"), {1: IDENTITY_MODEL})
    if slow_loading:
        write_model(repo, "slow_loading", int32_config("slow_loading"), {1: SLOW_LOADING_MODEL})
    return repo


def infer_body(values: list[int]) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}


def test_port_zero_log_line_after_models_loaded(start_server, repo: Path) -> None:
    server = start_server(lifecycle_repository(repo, slow_loading=True))
    log = server.log_text()
    listening = re.findall(r"HTTP listening on 127\.0\.0\.1:(\d+)", log)
    assert listening == [str(server.port)]
    assert server.port != 0
    # Logged once everything is loaded, so the server is ready the moment the port is known.
    for model in ("slow", "slow_loading", "fast"):
        assert log.index(f"model '{model}' ready") < log.index("HTTP listening on")
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        ready = c.get("/v2/health/ready")
        assert (ready.status_code, ready.json()) == (200, {"ready": True})
        response = c.post("/v2/models/slow_loading/infer", json=infer_body([4]))
        assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [4]


def test_port_log_line_at_warning_level(start_server, repo: Path) -> None:
    write_model(repo, "fast", int32_config("fast"), {1: IDENTITY_MODEL})
    server = start_server(repo, log_level="warning")
    log = server.log_text()
    assert f"HTTP listening on 127.0.0.1:{server.port}" in log
    assert "model 'fast' ready" not in log, "info lines logged at --log-level warning"
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert c.get("/v2/health/live").json() == {"live": True}


@pytest.mark.parametrize(
    ("signum", "http_version"),
    [(signal.SIGTERM, "http1"), (signal.SIGTERM, "http2"), (signal.SIGINT, "http1")],
    ids=["SIGTERM-http1", "SIGTERM-http2", "SIGINT-http1"],
)
def test_signal_drains_in_flight_request(start_server, repo: Path, signum: int, http_version: str) -> None:
    server = start_server(lifecycle_repository(repo))
    started = repo / "slow" / "1" / "started"
    result: dict[str, object] = {}

    def in_flight() -> None:
        try:
            with make_client(server.base_url, http_version, timeout=20) as c:
                result["response"] = c.post("/v2/models/slow/infer", json=infer_body([1, 2, 3]))
        except Exception as e:  # reported by the main thread
            result["error"] = e

    # An idle keep-alive connection must not hold the shutdown up.
    with httpx.Client(base_url=server.base_url, timeout=10) as idle:
        assert idle.get("/v2/health/live").status_code == 200

        worker = threading.Thread(target=in_flight, daemon=True)
        worker.start()
        deadline = time.monotonic() + 10
        while not started.exists():
            assert time.monotonic() < deadline, "the slow model never started executing"
            assert worker.is_alive(), f"in-flight request ended early: {result}"
            time.sleep(0.01)

        signalled = time.monotonic()
        server.send_signal(signum)
        refused_after = wait_until_refused(server.address, timeout=SLEEP_S * 0.6)
        assert refused_after is not None, "new connections were still accepted after the signal"
        assert worker.is_alive(), "the in-flight request finished before new connections were refused"

        worker.join(timeout=15)
        assert not worker.is_alive(), "the in-flight request never completed"
        assert "error" not in result, f"in-flight request failed: {result['error']!r}"
        response = result["response"]
        assert isinstance(response, httpx.Response)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [2, 4, 6]

        assert server.wait(timeout=10) == 0
        elapsed = time.monotonic() - signalled
        assert elapsed < SLEEP_S + 4, f"exit took {elapsed:.1f} s after the signal"
    assert wait_until_refused(server.address, timeout=1) is not None


def test_http2_client_dropping_mid_request_does_not_hold_up_shutdown(start_server, repo: Path) -> None:
    """hypercorn leaves an HTTP/2 stream's send buffer open when its connection drops: without our fix the
    handler of a request whose client vanished waits forever, and SIGTERM waits the graceful timeout."""
    server = start_server(lifecycle_repository(repo))
    started = repo / "slow" / "1" / "started"
    body = json.dumps(infer_body([1, 2, 3])).encode()
    for _ in range(3):
        started.unlink(missing_ok=True)
        with RawH2(server.address) as h2c:
            h2c.start(1, "POST", "/v2/models/slow/infer", [("content-length", str(len(body)))])
            h2c.data(1, body, end=True)
            deadline = time.monotonic() + 10
            while not started.exists():
                assert time.monotonic() < deadline, "the slow model never started executing"
                time.sleep(0.01)
        # The socket is closed here, with the request still executing.
    time.sleep(SLEEP_S + 0.5)  # the dropped requests finish executing and try to answer
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert c.get("/v2/health/live").status_code == 200
    signalled = time.monotonic()
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0
    assert time.monotonic() - signalled < 5, "shutdown waited for handlers of vanished clients"
