"""Real clients at full speed (issue 24): gRPC's C core (grpcio sync on one channel and on a channel each,
grpcio aio), grpclib and h2load call `simple` and `identity_fp32` on both ports as fast as they can, all
at once, for SECONDS; Triton's perf_analyzer (its C++ HTTP and gRPC clients) runs sync, async, streaming
and with system shared memory. Not one call may fail, and the server's own statistics must agree that none
failed. The answers are checked:
- the Python clients check every answer they get (tests/real_clients.py);
- h2load reads none (it counts statuses): while it runs, nghttp (nghttp2's own client, the library h2load
  is built on) sends the same request bytes with the same headers, NGHTTP_SAMPLE times on one connection,
  and every answer it prints is checked;
- perf_analyzer checks every answer of `simple` itself, against the `validation_data` of its --input-data,
  but with shared memory. Those runs, and identity_fp32's, are checked by status and counts alone:
  perf_analyzer validates the bytes the response carries (InferResult::RawData), and an output written
  into a region is not in the response; it sizes a validated output by the model's dims, and
  identity_fp32's are [-1] (`--shape` sets inputs' only).

The clients are outside peers: grpcio and grpclib from the test extra, each client in its own process
(tests/real_clients.py); h2load and nghttp from Debian's nghttp2-client; perf_analyzer from the tritonclient
2.51.0 wheel in a venv of its own (bench/perf_analyzer.py; `make test` installs both, elsewhere the tests
that need them say why they skip, and the Python clients run without h2load)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, missing, need_program, stop_all
from real_clients import check, request_for, tensors_for

from bench import perf_analyzer

pytestmark = pytest.mark.ours

SECONDS = 4  # each client at full rate: tens of thousands of calls
MODELS = ("simple", "identity_fp32")
CLIENTS = ("grpcio-shared", "grpcio-each", "grpcio-aio", "grpclib")
SHAPES = {"simple": [], "identity_fp32": ["--shape", "INPUT0:64"]}
H2LOAD_IN_FLIGHT = 32  # two connections of 16 streams
H2LOAD_DONE = re.compile(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed")
NGHTTP2_CLIENT = "apt-get install nghttp2-client"
NGHTTP_SAMPLE = 64  # answers read, of the requests h2load sends (the same bytes, on the same port, meanwhile)


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


def nghttp(port: int, path: str, body: Path, headers: list[str]) -> subprocess.Popen:
    """The request h2load sends, NGHTTP_SAMPLE times at once on one connection; the bodies of the answers,
    one after another, on its stdout."""
    header_args = [arg for header in headers for arg in ("-H", header)]
    return subprocess.Popen(
        # windows of 1 MiB a stream, 16 MiB in all: each answer comes whole, in one DATA frame
        ["nghttp", f"-m{NGHTTP_SAMPLE}", "-w20", "-W24", "-d", str(body), *header_args]
        + [f"http://127.0.0.1:{port}{path}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def grpc_answers_wrong(bodies: bytes, model: str) -> list[str]:
    """Why each of the gRPC answer bodies (length-prefixed messages, one after another) is wrong; [] when
    there are NGHTTP_SAMPLE and each is right."""
    _, expected = request_for(model)
    wrong, offset, count = [], 0, 0
    while offset < len(bodies):
        compressed, length = bodies[offset], int.from_bytes(bodies[offset + 1 : offset + 5], "big")
        message = bodies[offset + 5 : offset + 5 + length]
        offset += 5 + length
        count += 1
        why = "compressed" if compressed else check(message, expected)
        if why:
            wrong.append(why)
    return wrong if count == NGHTTP_SAMPLE else [*wrong, f"{count} answers, not {NGHTTP_SAMPLE}"]


def rest_answers_wrong(bodies: bytes, model: str) -> list[str]:
    """Why each of the JSON answer bodies (one after another) is wrong; [] when there are NGHTTP_SAMPLE and
    each is right."""
    datatype, _, expected = tensors_for(model)
    text, decoder = bodies.decode(), json.JSONDecoder()
    wrong, offset, count = [], 0, 0
    while offset < len(text):
        doc, offset = decoder.raw_decode(text, offset)
        count += 1
        outputs = doc.get("outputs", [])
        right = len(outputs) == len(expected) and all(
            (o["name"], o["datatype"], o["shape"]) == (f"OUTPUT{i}", datatype, list(y.shape))
            and np.array_equal(np.array(o["data"], y.dtype), y.ravel())
            for i, (o, y) in enumerate(zip(outputs, expected, strict=True))
        )
        if not right:
            wrong.append(f"not the outputs expected: {str(doc)[:300]}")
    return wrong if count == NGHTTP_SAMPLE else [*wrong, f"{count} answers, not {NGHTTP_SAMPLE}"]


def test_h2load_is_here_for_the_full_rate_tests() -> None:
    """Without h2load and nghttp the full-rate tests below run their Python clients alone: this says so
    (a skip, a failure under TENSORGATE_REQUIRE_PEERS), where they cannot."""
    need_program("h2load", NGHTTP2_CLIENT)
    need_program("nghttp", NGHTTP2_CLIENT)


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
    # h2load beside them where it is here (test_h2load_is_here... says where it is not), with nghttp reading
    # a sample of the answers its requests get
    peers = shutil.which("h2load") is not None and shutil.which("nghttp") is not None
    grpc_headers = ["content-type: application/grpc", "te: trailers"]
    grpc_path = "/inference.GRPCInferenceService/ModelInfer"
    requests = {"h2load gRPC": (grpc_path, grpc_body, grpc_headers, grpc_answers_wrong)}
    if port_name == "port":  # the HTTP port serves REST on the same HTTP/2 connections
        json_body = tmp_path / "infer.json"
        json_body.write_bytes(rest_body(model))
        rest_headers = ["content-type: application/json"]
        requests["h2load REST"] = (f"/v2/models/{model}/infer", json_body, rest_headers, rest_answers_wrong)
    loads, samples = {}, {}
    if peers:
        for name, (path, body, headers, _) in requests.items():
            loads[name] = h2load(port, path, body, headers)
        for name, (path, body, headers, _) in requests.items():
            samples[name] = nghttp(port, path, body, headers)
    answered = 0
    for name, proc in clients.items():
        out, err = proc.communicate(timeout=SECONDS + 120)
        assert proc.returncode == 0, (name, err[-2000:])
        tally = json.loads(out)
        assert tally["failed"] == {}, (name, tally)
        assert tally["ok"] > 0, name
        answered += tally["ok"]
    for name, proc in samples.items():
        bodies, err = proc.communicate(timeout=SECONDS + 120)
        assert proc.returncode == 0, (name, err[-2000:])
        wrong = requests[name][3](bodies, model)
        assert not wrong, (name, len(wrong), sorted(set(wrong))[:3])
    for name, proc in loads.items():
        out, _ = proc.communicate(timeout=SECONDS + 120)
        done = H2LOAD_DONE.search(out)
        assert done, (name, out[-2000:])
        succeeded, failed = int(done.group(1)), int(done.group(2))
        assert failed == 0 and succeeded > 0, (name, out[-2000:])
        assert re.search(rf"status codes: {succeeded} 2xx", out), (name, out[-2000:])
        answered += succeeded
    answered += NGHTTP_SAMPLE * len(samples)
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
        missing(why)


VALIDATED = ("simple",)  # identity_fp32's output dims are [-1]: perf_analyzer cannot size it (docstring)


def validation_data(model: str, path: Path) -> Path:
    """perf_analyzer's --input-data for `model` (one of VALIDATED, which batch): the inputs real_clients
    sends, and the outputs every answer must hold (`validation_data`: perf_analyzer compares each answer's
    bytes with them). Shapes without the batch dim: perf_analyzer adds it (-b 1)."""
    _, inputs, expected = tensors_for(model)

    def entry(x: np.ndarray) -> dict:
        return {"content": x.ravel().tolist(), "shape": list(x.shape[1:])}

    data = {name: entry(x) for name, x in inputs.items()}
    outputs = {f"OUTPUT{i}": entry(y) for i, y in enumerate(expected)}
    path.write_text(json.dumps({"data": [data], "validation_data": [outputs]}))
    return path


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
    """One run: three measurement windows, SECONDS in all, after its warm-up, at concurrency 4; every
    answer checked against the expected outputs where perf_analyzer can (VALIDATED, without shared
    memory: the module's docstring says why)."""
    port_name, args = MODES[mode]
    args = [*args, "-u", f"127.0.0.1:{getattr(server, port_name)}", "-m", model, *SHAPES[model]]
    if "shm" not in mode and model in VALIDATED:
        args += ["--input-data", str(validation_data(model, csv.with_suffix(".json")))]
    done = perf_analyzer.run([*args, "--concurrency-range", "4"], seconds=SECONDS / 3 + 0.1, csv_path=csv)
    assert done.returncode == 0, (mode, done.output[-3000:])
    assert "error" not in done.output.lower(), (mode, done.output[-3000:])
    assert done.throughput > 0 and done.p99_us > 0, (mode, done.row)
    assert perf_analyzer.successful_requests(done.output) > 0, (mode, done.output[-3000:])
    return done


@pytest.mark.parametrize("model", MODELS)
def test_perf_analyzer_never_fails(server: ServerProcess, pa: None, model: str, tmp_path: Path) -> None:
    """Sync, async and streaming over HTTP and gRPC (gRPC on both ports), all at once; every answer of
    `simple` checked by perf_analyzer."""
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
    """Checked by status and counts: perf_analyzer cannot validate outputs it reads from a region."""
    before = inference_counts(server, model)
    run_perf_analyzer(server, model, mode, tmp_path / "out.csv")
    success, fail = inference_counts(server, model)
    assert fail == before[1]
    assert success > before[0]
    regions = httpx.get(f"{server.base_url}/v2/systemsharedmemory/status", timeout=10).json()
    assert regions == [], "perf_analyzer unregisters the regions it registered"
