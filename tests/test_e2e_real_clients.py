"""Real clients at full speed (issue 24): gRPC's C core (grpcio sync on one channel and on a channel each,
grpcio aio), grpclib and h2load call `simple` and `identity_fp32` on both ports as fast as they can, all
at once, for SECONDS; Triton's perf_analyzer (its C++ HTTP and gRPC clients) runs sync, async, streaming
and with system shared memory. Not one call may fail, every answer is checked, and the server's own
statistics must agree that none failed.

The clients are outside peers: grpcio and grpclib from the test extra, each client in its own process
(tests/real_clients.py); h2load from Debian's nghttp2-client; perf_analyzer from the tritonclient 2.51.0
wheel in a venv of its own (bench/perf_analyzer.py; `make test` installs both, elsewhere the test says
why it skips)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, stop_all
from real_clients import request_for, tensors_for

from bench import perf_analyzer

pytestmark = pytest.mark.ours

SECONDS = 4  # each client at full rate: tens of thousands of calls
MODELS = ("simple", "identity_fp32")
CLIENTS = ("grpcio-shared", "grpcio-each", "grpcio-aio", "grpclib")
SHAPES = {"simple": [], "identity_fp32": ["--shape", "INPUT0:64"]}
H2LOAD_IN_FLIGHT = 32  # two connections of 16 streams
H2LOAD_DONE = re.compile(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("real_clients") / "server.log"
    started = ServerProcess(EXAMPLES, log, extra_args=("--allow-client-shm", "true")).start()
    yield started
    stop_all([started])


def inference_counts(server: ServerProcess, model: str) -> tuple[int, int]:
    """The model's (success, fail) request counts from the statistics extension."""
    stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def rest_body(model: str) -> bytes:
    """The JSON infer body for the tensors real_clients sends."""
    datatype, inputs, _ = tensors_for(model)
    return orjson.dumps(
        {
            "inputs": [
                {"name": name, "datatype": datatype, "shape": list(x.shape), "data": x.ravel().tolist()}
                for name, x in inputs.items()
            ]
        }
    )


def h2load(port: int, path: str, body: Path, headers: list[str]) -> subprocess.Popen:
    header_args = [arg for header in headers for arg in ("-H", header)]
    return subprocess.Popen(
        [
            "h2load",
            "-c2",
            "-m16",
            f"-D{SECONDS}",
            "-d",
            str(body),
            *header_args,
            f"http://127.0.0.1:{port}{path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.skipif(shutil.which("h2load") is None, reason="needs h2load (apt-get install nghttp2-client)")
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("port_name", ["grpc_port", "port"])
def test_grpc_clients_at_full_rate_never_fail(
    server: ServerProcess, model: str, port_name: str, tmp_path: Path
) -> None:
    port = getattr(server, port_name)
    data, _ = request_for(model)
    grpc_body = tmp_path / "infer.grpc"
    grpc_body.write_bytes(b"\x00" + len(data).to_bytes(4, "big") + data)
    before = inference_counts(server, model)
    clients = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "real_clients.py"), name, str(port), model, str(SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in CLIENTS
    }
    grpc_headers = ["content-type: application/grpc", "te: trailers"]
    loads = {
        "h2load gRPC": h2load(port, "/inference.GRPCInferenceService/ModelInfer", grpc_body, grpc_headers)
    }
    if port_name == "port":  # the HTTP port serves REST on the same HTTP/2 connections
        json_body = tmp_path / "infer.json"
        json_body.write_bytes(rest_body(model))
        loads["h2load REST"] = h2load(
            port, f"/v2/models/{model}/infer", json_body, ["content-type: application/json"]
        )
    answered = 0
    for name, proc in clients.items():
        out, err = proc.communicate(timeout=SECONDS + 120)
        assert proc.returncode == 0, (name, err[-2000:])
        tally = json.loads(out)
        assert tally["failed"] == {}, (name, tally)
        assert tally["ok"] > 0, name
        answered += tally["ok"]
    for name, proc in loads.items():
        out, _ = proc.communicate(timeout=SECONDS + 120)
        done = H2LOAD_DONE.search(out)
        assert done, (name, out[-2000:])
        succeeded, failed = int(done.group(1)), int(done.group(2))
        assert failed == 0 and succeeded > 0, (name, out[-2000:])
        assert re.search(rf"status codes: {succeeded} 2xx", out), (name, out[-2000:])
        answered += succeeded
    success, fail = inference_counts(server, model)
    # h2load counts a gRPC answer by its HTTP status: an error in the trailers would still be a 2xx, so the
    # server's own count must show every call succeeded. h2load stops counting at its deadline: the
    # streams it had in flight then were answered without being counted.
    assert fail == before[1]
    assert answered <= success - before[0] <= answered + H2LOAD_IN_FLIGHT * len(loads)
    assert server.running()


# ------------------------------------------------------------------------------ perf_analyzer


@pytest.fixture(scope="module")
def pa() -> None:
    why = perf_analyzer.install()
    if why:
        pytest.skip(why)


# mode -> (the port it calls, perf_analyzer's arguments)
MODES = {
    "http": ("port", ["-i", "http"]),
    "http async": ("port", ["-i", "http", "-a"]),
    "grpc": ("grpc_port", ["-i", "grpc"]),
    "grpc on the http port": ("port", ["-i", "grpc"]),
    "grpc async": ("grpc_port", ["-i", "grpc", "-a"]),
    "grpc streaming": ("grpc_port", ["-i", "grpc", "--streaming"]),
    "http shm": ("port", ["-i", "http", "--shared-memory", "system"]),
    "grpc shm": ("grpc_port", ["-i", "grpc", "--shared-memory", "system"]),
}


def run_perf_analyzer(server: ServerProcess, model: str, mode: str, csv: Path) -> perf_analyzer.Run:
    """One run: three measurement windows, SECONDS in all, after its warm-up, at concurrency 4."""
    port_name, args = MODES[mode]
    args = [*args, "-u", f"127.0.0.1:{getattr(server, port_name)}", "-m", model, *SHAPES[model]]
    done = perf_analyzer.run([*args, "--concurrency-range", "4"], seconds=SECONDS / 3 + 0.1, csv_path=csv)
    assert done.returncode == 0, (mode, done.output[-3000:])
    assert "error" not in done.output.lower(), (mode, done.output[-3000:])
    assert done.throughput > 0 and done.p99_us > 0, (mode, done.row)
    assert perf_analyzer.successful_requests(done.output) > 0, (mode, done.output[-3000:])
    return done


@pytest.mark.parametrize("model", MODELS)
def test_perf_analyzer_never_fails(server: ServerProcess, pa: None, model: str, tmp_path: Path) -> None:
    """Sync, async and streaming over HTTP and gRPC (gRPC on both ports), all at once."""
    before = inference_counts(server, model)
    modes = [mode for mode in MODES if "shm" not in mode]
    with concurrent.futures.ThreadPoolExecutor(len(modes)) as pool:
        runs = [
            pool.submit(run_perf_analyzer, server, model, m, tmp_path / f"{i}.csv")
            for i, m in enumerate(modes)
        ]
        for run in runs:
            run.result()
    success, fail = inference_counts(server, model)
    assert fail == before[1]
    assert success > before[0]


# One at a time: perf_analyzer names its shared-memory regions after the model's inputs, so two runs on
# one server would take each other's regions.
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", ["http shm", "grpc shm"])
def test_perf_analyzer_with_shared_memory_never_fails(
    server: ServerProcess, pa: None, model: str, mode: str, tmp_path: Path
) -> None:
    before = inference_counts(server, model)
    run_perf_analyzer(server, model, mode, tmp_path / "out.csv")
    success, fail = inference_counts(server, model)
    assert fail == before[1]
    assert success > before[0]
    regions = httpx.get(f"{server.base_url}/v2/systemsharedmemory/status", timeout=10).json()
    assert regions == [], "perf_analyzer unregisters the regions it registered"
