"""`tensorgate perf` (perf/), the load generator users point at any v2, TF Serving or grps server:
run as a user runs it (`python -m tensorgate.perf ...`, the `tensorgate perf` entry point) against a real
server, in every protocol and both load modes, its numbers checked against the server's own statistics
(every request it sent is one the server counted); its errors, its checks of answers, its reports. And its
parts alone: the HDR histogram against exact percentiles, the plan's parsing.

Runs are short (a fraction of a second measured): these check that the figures are right, bench/ measures
how fast it goes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, stop_all, write_model

from tensorgate.perf.cli import parse_levels
from tensorgate.perf.hdr import Histogram
from tensorgate.perf.model import ModelSpec, PerfError, Tensor, parse_shapes, request_shapes

SHORT = ("--warmup", "0.1", "--duration", "0.4", "--no-progress")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The example repository, served to this module alone: the statistics count only its requests."""
    started = ServerProcess(EXAMPLES, tmp_path_factory.mktemp("perf") / "server.log").start()
    yield started
    stop_all([started])


def perf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tensorgate.server", "perf", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def successes(server: ServerProcess, model: str) -> tuple[int, int]:
    stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
    inference = [entry["inference_stats"] for entry in stats]
    return sum(s["success"]["count"] for s in inference), sum(s["fail"]["count"] for s in inference)


def run_json(tmp_path: Path, *args: str) -> list[dict]:
    out = tmp_path / "levels.json"
    done = perf(*args, "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def check_level(level: dict) -> None:
    latency = level["latency_us"]
    assert level["errors"] == 0 and level["requests"] > 0 and level["requests_per_s"] > 0
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["p999"] <= latency["max"]
    assert level["answered"] == level["sent"]


@pytest.mark.parametrize(
    "protocol", ["rest", "rest-binary", "h2", "tfserving", "grps", "grpc", "grpc-stream"]
)
def test_every_protocol_closed_loop_counts_what_the_server_counts(
    server: ServerProcess, tmp_path: Path, protocol: str
) -> None:
    url = f"grpc://127.0.0.1:{server.grpc_port}" if protocol.startswith("grpc") else server.base_url
    plan = "1,4" if protocol == "rest" else "3"  # levels one after another: once is enough
    before = successes(server, "simple")
    levels = run_json(tmp_path, url, "-m", "simple", "-i", protocol, "--concurrency", plan, *SHORT)
    after = successes(server, "simple")
    assert [level["concurrency"] for level in levels] == [int(c) for c in plan.split(",")]
    for level in levels:
        check_level(level)
        # the measured window as the server's statistics saw it: equal but for the requests in flight at
        # its edges and those answered while the statistics were read there (a few ms at most)
        assert abs(level["server"]["requests"] - level["requests"]) <= 8 + 0.05 * level["requests"], level
        assert level["server"]["compute_infer_us"] > 0
    # every request sent, warmup and the drain at the end included, is one the server answered
    assert after[0] - before[0] == sum(level["sent"] for level in levels)
    assert after[1] == before[1]


@pytest.mark.parametrize("protocol", ["h2", "grpc"])
def test_large_tensors_cross_the_servers_windows_and_come_back_the_same(
    server: ServerProcess, tmp_path: Path, protocol: str
) -> None:
    """1.2 MB each way, past HTTP/2's default 64 KiB windows and 16 KiB frames: the request bodies wait
    for the server's window updates, and every answer equals the reference run's."""
    url = f"grpc://127.0.0.1:{server.grpc_port}" if protocol.startswith("grpc") else server.base_url
    levels = run_json(
        tmp_path, url, "-m", "identity_fp32", "-i", protocol, "--shape", "INPUT0:300000", "--input-sets", "2",
        "--verify", "--concurrency", "3", *SHORT,
    )  # fmt: skip
    check_level(levels[0])


@pytest.mark.parametrize("distribution", ["constant", "poisson"])
def test_open_loop_sends_at_the_rate_asked(server: ServerProcess, tmp_path: Path, distribution: str) -> None:
    before = successes(server, "simple")
    levels = run_json(
        tmp_path, server.base_url, "-m", "simple", "--request-rate", "300", "--request-distribution",
        distribution, "--warmup", "0.1", "--duration", "1.0", "--no-progress",
    )  # fmt: skip
    (level,) = levels
    check_level(level)
    assert level["request_rate"] == 300 and level["distribution"] == distribution
    tolerance = 0.05 if distribution == "constant" else 0.25  # Poisson: ~300 arrivals, sd ~6%
    assert abs(level["requests_per_s"] - 300) < 300 * tolerance, level
    assert successes(server, "simple")[0] - before[0] == level["sent"]


def test_several_load_processes_add_up(server: ServerProcess, tmp_path: Path) -> None:
    before = successes(server, "simple")
    (level,) = run_json(
        tmp_path, server.base_url, "-m", "simple", "--concurrency", "6", "--workers", "2", *SHORT
    )
    check_level(level)
    assert successes(server, "simple")[0] - before[0] == level["sent"]
    assert abs(level["server"]["requests"] - level["requests"]) <= 8 + 0.05 * level["requests"]


def test_stability_windows_as_perf_analyzer_has_them(server: ServerProcess, tmp_path: Path) -> None:
    (level,) = run_json(
        tmp_path, server.base_url, "-m", "simple", "--concurrency", "2", "-p", "250", "-r", "4", "--warmup",
        "0.2", "--no-progress",
    )  # fmt: skip
    check_level(level)
    assert 3 <= level["windows"] <= 4
    assert 0.7 < level["seconds"] < 1.5  # three 0.25 s windows merged, each a little longer


def test_verify_compare_and_the_reports(server: ServerProcess, tmp_path: Path) -> None:
    plot, table = tmp_path / "plot.png", tmp_path / "levels.csv"
    out = tmp_path / "levels.json"
    done = perf(
        server.base_url, "-m", "simple", "--concurrency", "2", "--verify", "--input-sets", "3", "--compare",
        f"http://localhost:{server.port}", "--rounds", "2", "--json", str(out), "--csv", str(table),
        "--plot", str(plot), *SHORT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    levels = json.loads(out.read_text())
    assert [level["target"] for level in levels] == [server.base_url, f"http://localhost:{server.port}"]
    for level in levels:
        check_level(level)
    assert "| concurrency 2 |" in done.stdout and "Ratios" in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = table.read_text().splitlines()
    assert rows[0].startswith("target,concurrency") and len(rows) == 3


def test_answers_that_disagree_with_the_expected_outputs_are_errors(
    server: ServerProcess, tmp_path: Path
) -> None:
    """perf_analyzer's --input-data with validation_data: the right answers pass, a wrong one is counted
    as a mismatch, with an example, and the exit status says so."""
    a, b = list(range(16)), [2] * 16
    entry = {"INPUT0": {"content": a, "shape": [1, 16]}, "INPUT1": {"content": b, "shape": [1, 16]}}
    right = {"OUTPUT0": {"content": [x + 2 for x in a], "shape": [1, 16]},
             "OUTPUT1": {"content": [x - 2 for x in a], "shape": [1, 16]}}  # fmt: skip
    wrong = {**right, "OUTPUT1": {"content": [x + 2 for x in a], "shape": [1, 16]}}
    data = tmp_path / "data.json"
    for expected, good in ((right, True), (wrong, False)):
        data.write_text(json.dumps({"data": [entry], "validation_data": [expected]}))
        done = perf(server.base_url, "-m", "simple", "--input-data", str(data), "--concurrency", "1", *SHORT)
        assert (done.returncode == 0) == good, done.stdout + done.stderr
        if not good:
            assert "mismatch" in done.stdout and "OUTPUT1 differs" in done.stderr


FLAKY = {
    "name": "flaky",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
}
FLAKY_PY = """
class Model:
    calls = 0

    def execute(self, inputs):
        Model.calls += 1
        if Model.calls % 2 == 0:
            raise ValueError("every other call fails")
        return {"Y": inputs["X"] * 2}
"""


def test_a_dynamic_shape_needs_its_size_and_server_errors_are_counted_by_kind(
    start_server, repo: Path, tmp_path: Path
) -> None:
    write_model(repo, "flaky", FLAKY, {1: FLAKY_PY})
    flaky = start_server(repo)
    done = perf(flaky.base_url, "-m", "flaky", *SHORT)
    assert done.returncode == 2 and "--shape X:N" in done.stderr, done.stderr
    before = successes(flaky, "flaky")
    out = tmp_path / "levels.json"
    done = perf(
        flaky.base_url, "-m", "flaky", "--shape", "X:5", "--concurrency", "2", "--json", str(out), *SHORT
    )
    assert done.returncode == 1, done.stdout + done.stderr  # errors happened
    (level,) = json.loads(out.read_text())
    assert level["errors_by_kind"].keys() == {"http 500"} and level["requests"] > 0
    assert abs(level["errors"] - level["requests"]) <= 2  # every other one
    assert "every other call fails" in done.stderr
    after = successes(flaky, "flaky")
    assert (after[0] - before[0]) + (after[1] - before[1]) == level["sent"]
    missing = perf(flaky.base_url, "-m", "nosuchmodel", *SHORT)
    assert missing.returncode == 2 and "nosuchmodel" in missing.stderr


def test_a_server_that_dies_under_load_is_errors_counted_not_a_hang(start_server, tmp_path: Path) -> None:
    """The server is killed mid-level: the requests in flight fail as lost, the reconnections as refused,
    the level ends on time and reports both; and a server that is not there at all is a one-line error."""
    victim = start_server(EXAMPLES)
    out = tmp_path / "levels.json"
    duration = 2.5
    command = [sys.executable, "-m", "tensorgate.server", "perf", victim.base_url, "-m", "simple",
               "--concurrency", "4", "--warmup", "0", "--duration", str(duration), "--no-progress",
               "--json", str(out)]  # fmt: skip
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # No warmup: the window is measured from the first request. Four requests in flight at most (a
        # closed loop): by the server's 20th success the client has read at least 16 answers.
        deadline = time.monotonic() + 30
        while successes(victim, "simple")[0] < 20:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "perf's requests never reached the server"
            time.sleep(0.01)
        victim.proc.kill()
        killed = time.monotonic()
        victim.proc.wait(10)
        victim.killed = True  # its death was the point; the fixture must not call it a failure
        _, err = run.communicate(timeout=60)
        late = time.monotonic() - killed
    finally:
        run.kill()
    # on time: the window began before the kill and ends `duration` after it began; then the drain (which
    # waits up to 30 s for answers still due) finds nothing in flight, the lost requests counted
    assert late < duration + 5, f"the level ended {late:.1f} s after the kill"
    assert run.returncode == 1, err
    (level,) = json.loads(out.read_text())
    assert level["requests"] > 0 and level["errors_by_kind"].get("connection refused", 0) > 0, level
    assert level["answered"] == level["sent"]
    assert abs(level["seconds"] - duration) < 1, level
    assert "Traceback" not in err
    gone = perf(victim.base_url, "-m", "simple", *SHORT)
    assert gone.returncode == 2 and "Connection refused" in gone.stderr and "Traceback" not in gone.stderr


# ------------------------------------------------------------------------------------------ its parts


def test_the_histogram_agrees_with_exact_percentiles_within_its_precision() -> None:
    rng = np.random.default_rng(7)
    seconds = rng.lognormal(np.log(400e-6), 0.8, 200_000)  # ~400 µs, a long tail
    histogram = Histogram()
    for part in np.array_split(seconds, 7):  # windows merged as they are in a run
        window = Histogram()
        window.record(part)
        histogram.add(Histogram.from_wire(window.to_wire()))
    micros = np.rint(seconds * 1e6)
    assert histogram.total == len(seconds)
    for percent in (50, 90, 99, 99.9):
        exact = np.percentile(micros, percent, method="inverted_cdf")
        assert abs(histogram.percentile(percent) - exact) <= exact / 1000 + 1, percent
    assert histogram.summary()["max"] == micros.max()


def test_the_plan_is_read_as_perf_analyzer_writes_it() -> None:
    assert parse_levels("1,8,64", int) == [1, 8, 64]
    assert parse_levels("1:9:4", int) == [1, 5, 9]
    assert parse_levels("100:300:100", float) == [100.0, 200.0, 300.0]
    with pytest.raises(PerfError):
        parse_levels("8:1", int)
    assert parse_shapes(["IN:3,224,224", "a:b:2"]) == {"IN": [3, 224, 224], "a:b": [2]}
    with pytest.raises(PerfError, match="NAME:DIM"):
        parse_shapes(["IN"])
    spec = ModelSpec("m", "", 8, [Tensor("IN", "FP32", [-1, -1, 4])], [Tensor("OUT", "FP32", [-1, 4])])
    assert request_shapes(spec, {"IN": [3, 4]}, 2) == {"IN": [2, 3, 4]}
    with pytest.raises(PerfError, match="--shape IN:N,4"):
        request_shapes(spec, {}, 1)
    with pytest.raises(PerfError, match="max_batch_size 8"):
        request_shapes(spec, {"IN": [3, 4]}, 9)
