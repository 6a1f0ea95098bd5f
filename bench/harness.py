"""Runs the scenarios in order against the bare ceiling app and our server, and collects their numbers."""

import asyncio
import contextlib
import math
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from bench import crosscheck
from bench.bare_app import new_event_loop
from bench.binary import run_binary
from bench.grpc_load import GRPC_MODES, run_grpc
from bench.grpc_load import verify as verify_grpc
from bench.h1client import run_h1
from bench.h2client import run_h2
from bench.procs import ServerProcess, cpu_clock, exit_note, memory_kib, reset_peak_rss, serve_argv
from bench.stats import Recorder, drive, show_progress, summarize
from tensorgate.perf.h1wire import build_request
from tensorgate.perf.h2wire import build_headers

SCENARIOS = (
    "bare-h1",
    "bare-h2",
    "json-h1",
    "json-h2",
    "hpt-v2-h1",
    "hpt-tf-h1",
    "hpt-v2-h2",
    "hpt-tf-h2",
    "bare-grpc",
    "infer-grpc",
    "bare-grpcstream",
    "infer-grpcstream",
    "binary-h1",
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JSON_PATH = "/v2/models/simple/infer"
BINARY_PATH = "/v2/models/identity_fp32/infer"
JSON_BODY = orjson.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }
)
# The same three numbers through half_plus_two, as a KServe v2 JSON infer and as a TF Serving predict.
HPT_V2_PATH = "/v2/models/half_plus_two/infer"
HPT_V2_BODY = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 1], "data": [1.0, 2.0, 5.0]}]}
)
HPT_TF_PATH = "/v1/models/half_plus_two:predict"
HPT_TF_BODY = orjson.dumps({"instances": [1.0, 2.0, 5.0]})
# A load scenario's family (its name less -h1 / -h2) -> the request it repeats.
REQUESTS = {
    "bare": (JSON_PATH, JSON_BODY),
    "json": (JSON_PATH, JSON_BODY),
    "hpt-v2": (HPT_V2_PATH, HPT_V2_BODY),
    "hpt-tf": (HPT_TF_PATH, HPT_TF_BODY),
}
# Families measured against another, round by round, on the same HTTP version.
BASELINES = {"json": "bare", "hpt-tf": "hpt-v2", "infer": "bare"}  # infer-grpc*: our gRPC vs grpclib echo


def family(name: str) -> str:
    return name.rsplit("-", 1)[0]


def baseline_of(name: str) -> str | None:
    """The scenario `name` is measured against (json-h2 -> bare-h2), or None."""
    base = BASELINES.get(family(name))
    return f"{base}-{name.rsplit('-', 1)[1]}" if base else None


@dataclass
class Options:
    url: str | None = None
    duration: float = 10.0
    warmup: float = 1.0
    concurrency: int = 16
    h2_connections: int = 4
    only: list[str] = field(default_factory=lambda: list(SCENARIOS))
    cross_check: bool = False
    binary_mib: int = 64
    rounds: int = 10
    ratio_rounds: int = 5
    model_repository: str = "examples/model_repository"
    server_args: list[str] = field(default_factory=list)


@dataclass
class Result:
    name: str
    target: str  # "bare" or "server"
    http: str
    concurrency: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    rps: float = float("nan")
    p50_ms: float = float("nan")
    p90_ms: float = float("nan")
    p99_ms: float = float("nan")
    cpu: dict[str, float] = field(default_factory=dict)  # cores busy during the measured part
    vs_ceiling: float | None = None  # median over the rounds of (our req/s / the ceiling's) in that round
    vs_v2: float | None = None  # hpt-tf: the same median ratio, to the v2 JSON infer on half_plus_two
    ratios: list[float] = field(default_factory=list)  # that ratio, round by round
    gb_per_s: float | None = None
    payload_bytes: int | None = None
    rss: dict[str, Any] | None = None
    cross_check: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _new_result(name: str, concurrency: int, **fields: Any) -> Result:
    http = "gRPC" if name in GRPC_MODES else "2" if name.endswith("h2") else "1.1"
    return Result(name, "bare" if name.startswith("bare") else "server", http, concurrency, **fields)


def _clocks(pid: int | None) -> dict[str, Callable[[], float]]:
    """CPU-seconds counters of the load generator (this process) and of the server, where its pid is known."""
    clocks = {"client": time.process_time}
    if pid is not None:
        clocks["server"] = lambda: cpu_clock(pid)
    return clocks


async def _load(name: str, host: str, port: int, opts: Options, pid: int | None) -> Result:
    result = _new_result(name, opts.concurrency)
    rec = Recorder()
    authority = f"{host}:{port}"
    path, body = REQUESTS.get(family(name), REQUESTS["json"])
    if name in GRPC_MODES:  # our server's gRPC port, or the bare grpclib echo service (bench/grpc_echo.py)
        mode = GRPC_MODES[name]
        load = asyncio.create_task(run_grpc(host, port, mode, opts.concurrency, rec, opts.h2_connections))
    elif result.http == "1.1":
        request = build_request("POST", path, authority, body, {"Content-Type": "application/json"})
        load = asyncio.create_task(run_h1(host, port, request, opts.concurrency, rec))
    else:
        headers = build_headers("POST", path, authority, body, {"content-type": "application/json"})
        load = asyncio.create_task(
            run_h2(host, port, headers, body, opts.concurrency, rec, opts.h2_connections)
        )
    summary, result.cpu = await drive(name, rec, load, opts.warmup, opts.duration, _clocks(pid))
    for key, value in asdict(summary).items():
        setattr(result, key, value)
    if summary.requests == 0:
        result.notes.append("no request completed")
    return result


async def _binary(host: str, port: int, opts: Options, pid: int | None) -> Result:
    result = _new_result("binary-h1", 1)
    nbytes = opts.binary_mib * 1024 * 1024
    rec = Recorder()
    before: dict[str, int] = {}
    if pid is not None:
        if not reset_peak_rss(pid):
            result.notes.append("could not reset the peak RSS; growth may include an earlier peak")
        before = memory_kib(pid)
    progress = asyncio.create_task(show_progress("binary-h1", rec, time.perf_counter()))
    try:
        max_seconds = 6 * opts.duration + 60
        out = await run_binary(host, port, BINARY_PATH, nbytes, opts.rounds, rec, max_seconds, _clocks(pid))
    finally:
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)
    result.cpu = out.cpu
    if pid is not None:
        after = memory_kib(pid)
        growth = (after["VmHWM"] - before["VmRSS"]) * 1024
        result.rss = {
            "before_rss_kib": before["VmRSS"],
            "after_rss_kib": after["VmRSS"],
            "peak_kib": after["VmHWM"],
            "peak_growth_bytes": growth,
            "ratio_to_payload": growth / nbytes,
        }
    result.requests, result.seconds = out.round_trips, out.seconds
    result.rps = out.round_trips / out.seconds if out.seconds else float("nan")
    summary = summarize(rec)
    result.p50_ms, result.p90_ms, result.p99_ms = summary.p50_ms, summary.p90_ms, summary.p99_ms
    result.errors = max(rec.errors, 1 if out.problem else 0)  # a failed warm-up is not in `rec`
    result.gb_per_s, result.payload_bytes = out.gb_per_s, nbytes
    if out.problem:
        result.notes.append(out.problem)
    if out.chunked:
        result.notes.append("response had no Content-Length (chunked)")
    return result


def verify_json(host: str, port: int, http2: bool, kind: str = "json") -> str:
    """'' when one request of the family `kind` gets the right answer (the sums and differences of
    `simple`, or 2.5, 3.0, 4.5 from half_plus_two), else what went wrong."""
    try:
        import httpx
    except ImportError:
        return ""
    path, body = REQUESTS[kind]
    try:
        with httpx.Client(http1=not http2, http2=http2, timeout=10) as client:
            response = client.post(f"http://{host}:{port}{path}", content=body)
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {response.text[:200]}"
        doc = response.json()
        if kind == "hpt-tf":
            right = doc.get("predictions") == [2.5, 3.0, 4.5]
        elif kind == "hpt-v2":
            right = [out["data"] for out in doc["outputs"]] == [[2.5, 3.0, 4.5]]
        else:
            outputs = {out["name"]: out["data"] for out in doc["outputs"]}
            right = outputs.get("OUTPUT0") == list(range(1, 17)) and outputs.get("OUTPUT1") == list(
                range(-1, 15)
            )
        if not right:
            return f"wrong outputs: {response.text[:200]}"
    except Exception as exc:  # report, don't crash the run
        return f"{type(exc).__name__}: {exc}"
    return ""


def _cross_check(result: Result, host: str, port: int, opts: Options) -> None:
    if result.name in GRPC_MODES:
        return
    tools = crosscheck.available()
    path, body = REQUESTS[family(result.name)]
    url = f"http://{host}:{port}{path}"
    if result.http == "1.1" and tools["wrk"]:
        rps, note = crosscheck.run_wrk(url, body, "application/json", opts.concurrency, opts.duration)
        result.cross_check = {"tool": "wrk", "rps": rps, "note": note}
    elif result.http == "2" and tools["h2load"]:
        requests = max(1000, int(result.rps * opts.duration)) if result.requests else 1000  # ~ as long
        rps, note = crosscheck.run_h2load(
            url, body, "application/json", opts.concurrency, requests, opts.h2_connections
        )
        result.cross_check = {"tool": "h2load", "rps": rps, "note": note}


def _failed(name: str, opts: Options, why: str) -> Result:
    concurrency = 1 if name == "binary-h1" else opts.concurrency
    return _new_result(name, concurrency, errors=1, notes=[why])


def _verify(name: str, host: str, port: int) -> str:
    """'' when one request of the scenario gets the right answer, else what went wrong. The ceilings are
    not checked, and binary-h1 checks its own answers."""
    kind = family(name)
    if kind in ("bare", "binary"):
        return ""
    if name in GRPC_MODES:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(verify_grpc(host, port))
    return verify_json(host, port, name.endswith("h2"), kind)


def _run_on(
    names: list[str],
    host: str,
    port: int,
    opts: Options,
    proc: ServerProcess | None,
    checks: dict[str, str] | None = None,
) -> list[Result]:
    """Each scenario once; `checks`: what _verify found wrong with a scenario, noted on its result."""
    results = []
    pid = proc.pid if proc is not None else None
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        for name in names:
            if proc is not None and proc.proc.poll() is not None:
                results.append(_failed(name, opts, f"server had exited ({proc.proc.returncode})"))
                continue
            try:
                if name == "binary-h1":
                    result = runner.run(_binary(host, port, opts, pid))
                else:
                    result = runner.run(_load(name, host, port, opts, pid))
                    if opts.cross_check:
                        _cross_check(result, host, port, opts)
            except Exception as exc:
                result = _failed(name, opts, f"failed: {type(exc).__name__}: {exc}")
            if problem := (checks or {}).get(name):
                result.notes.insert(0, f"check failed: {problem}")
            results.append(result)
            print(f"{name}: {result.rps:.0f}/s, {result.errors} errors", file=sys.stderr)
    return results


def run_all(opts: Options) -> tuple[list[Result], list[str]]:
    """Every selected scenario: the load scenarios of the ceiling and of our server interleaved round by
    round (both processes up at once), then the binary round trip on our server.

    Also returns the last lines our server wrote to stderr besides its listening line (at log level
    warning, anything there is worth a look).
    """
    selected = [name for name in SCENARIOS if name in opts.only]
    if opts.url:  # a server of the user's: the ceiling first, then that server, not interleaved
        # gRPC scenarios need the harness's own server (and its gRPC port): not run here
        selected = [name for name in selected if name not in GRPC_MODES]
        parts = urllib.parse.urlsplit(opts.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        results = []
        if bare_names := [name for name in selected if name.startswith("bare")]:
            with ServerProcess(
                [sys.executable, "-m", "bench.bare_app", "--server", "tensorgate"], cwd=ROOT
            ) as bare:
                results += _run_on(bare_names, "127.0.0.1", bare.port, opts, bare)
        ours = [name for name in selected if not name.startswith("bare")]
        checks = {name: _verify(name, host, port) for name in ours}
        return _with_ratios(results + _run_on(ours, host, port, opts, None, checks)), []
    argv = serve_argv(opts.model_repository) + opts.server_args
    echo = None
    if any(name.startswith("bare") and name in GRPC_MODES for name in selected):
        echo = ServerProcess([sys.executable, "-m", "bench.grpc_echo"], cwd=ROOT, listens="gRPC")
    with (
        echo or contextlib.nullcontext(),
        ServerProcess([sys.executable, "-m", "bench.bare_app", "--server", "tensorgate"], cwd=ROOT) as bare,
    ):
        try:
            server = ServerProcess(argv, cwd=ROOT)
        except RuntimeError as exc:
            results = [_failed(name, opts, "server did not start") for name in selected]
            return results, str(exc).splitlines()[-20:]
        with server:
            procs = {
                name: ((echo if name in GRPC_MODES else bare) if name.startswith("bare") else server)
                for name in selected
            }
            loads = [name for name in selected if name != "binary-h1"]
            results = _interleaved(loads, procs, opts)
            if "binary-h1" in selected:
                results += _run_on(["binary-h1"], "127.0.0.1", server.port, opts, server)
        if note := exit_note(server.proc.returncode):
            results[-1].notes.append(note)
        log = [line.rstrip() for line in server.tail if "listening on" not in line]
    return _with_ratios(results), log


def _interleaved(names: list[str], procs: dict[str, ServerProcess], opts: Options) -> list[Result]:
    """`opts.ratio_rounds` rounds, each running every scenario for duration / rounds: the ceiling and our
    server then share the same moments of a machine whose speed drifts (other work on these cores), and
    each round gives one ratio. The order reverses every other round (A B, B A, A B, ...), so that a drift
    favours neither side of a pair. Each scenario's answer is checked once, before the rounds."""
    short = replace(opts, duration=opts.duration / opts.ratio_rounds, cross_check=False)
    ports = {name: procs[name].grpc_port if name in GRPC_MODES else procs[name].port for name in names}
    checks = {name: _verify(name, "127.0.0.1", ports[name]) for name in names}
    rounds: dict[str, list[Result]] = {name: [] for name in names}
    for i in range(opts.ratio_rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            rounds[name] += _run_on([name], "127.0.0.1", ports[name], short, procs[name], checks)
    merged = [_merge(rounds[name]) for name in names]
    for name, result in zip(names, merged, strict=True):
        if opts.cross_check and result.requests:
            _cross_check(result, "127.0.0.1", procs[name].port, opts)
        baseline = rounds.get(baseline_of(name) or "", [])
        result.ratios = [  # a failed round (rps NaN) on either side gives no ratio
            ours.rps / base.rps
            for ours, base in zip(rounds[name], baseline, strict=False)
            if base.rps > 0 and not math.isnan(ours.rps)
        ]
    return merged


def _merge(rounds: list[Result]) -> Result:
    """One scenario's rounds as one result: counts added up, latency percentiles and CPU as medians."""
    merged = replace(rounds[0], notes=list(dict.fromkeys(n for r in rounds for n in r.notes)))
    merged.requests = sum(r.requests for r in rounds)
    merged.errors = sum(r.errors for r in rounds)
    merged.seconds = sum(r.seconds for r in rounds)
    merged.rps = merged.requests / merged.seconds if merged.seconds else float("nan")
    for attr in ("p50_ms", "p90_ms", "p99_ms"):
        setattr(merged, attr, statistics.median(getattr(r, attr) for r in rounds))
    merged.cpu = {key: statistics.median(r.cpu.get(key, 0.0) for r in rounds) for key in rounds[0].cpu}
    return merged


def _with_ratios(results: list[Result]) -> list[Result]:
    """vs_ceiling (json-*, infer-grpc*) and vs_v2 (hpt-tf-*): the median per-round ratio to the baseline
    where rounds were interleaved, else (with --url) the plain ratio of the two sequential runs."""
    rates = {r.name: r.rps for r in results if r.requests}
    for r in results:
        if (base := baseline_of(r.name)) is None:
            continue
        baseline = rates.get(base)
        ratio = statistics.median(r.ratios) if r.ratios else (r.rps / baseline if baseline else None)
        if base.startswith("bare"):
            r.vs_ceiling = ratio
        else:
            r.vs_v2 = ratio
    return results
