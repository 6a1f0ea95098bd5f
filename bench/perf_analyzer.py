"""Triton's perf_analyzer (its C++ HTTP and gRPC clients) as an outside peer, and its figures beside ours.

    python -m bench.perf_analyzer --install      # sets it up in .peers/perf_analyzer (idempotent)
    python -m bench.perf_analyzer [--duration 10] [--rounds 3] [--concurrency 16] [--out bench/results]

perf_analyzer is what Triton's users load-test with; its clients are strict where the Python ones are
lenient, so it is a peer of the tests and the bench, like curl or h2load, never a dependency of the
project. It comes from the `tritonclient==2.51.0` wheel (later wheels' binaries need a newer glibc than
Debian 12's) into a venv of its own, with `nvidia-cuda-runtime-cu12` for the libcudart.so.12 it links
(it runs without a GPU), and Debian's `libb64-0d` (`make peers` installs it with apt-get).

The bench starts our server on the example repository and measures `simple` over HTTP and gRPC at
`--concurrency` with perf_analyzer, then with our own C load generators (wrk for HTTP/1.1 JSON, h2load for
gRPC ModelInfer) on the same server, alternating: requests/s and p99 latency side by side.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".peers" / "perf_analyzer"
VENV = HOME / "venv"
BINARY = VENV / "bin" / "perf_analyzer"
PACKAGES = ("tritonclient==2.51.0", "nvidia-cuda-runtime-cu12==12.9.79")
CUDART = "lib/python{v}/site-packages/nvidia/cuda_runtime/lib"


def _environment() -> dict[str, str]:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    libs = [str(path) for path in VENV.glob(CUDART.format(v="*"))] or [str(VENV / CUDART.format(v=version))]
    return {**os.environ, "LD_LIBRARY_PATH": ":".join(libs + [os.environ.get("LD_LIBRARY_PATH", "")])}


def missing_libraries() -> list[str]:
    """The shared libraries the installed binary cannot find (ldd's 'not found' lines)."""
    out = subprocess.run(["ldd", str(BINARY)], capture_output=True, text=True, env=_environment()).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def install() -> str | None:
    """Sets perf_analyzer up in its own venv; None when it runs, else why it cannot here."""
    if not BINARY.exists():
        HOME.mkdir(parents=True, exist_ok=True)
        steps = [
            [sys.executable, "-m", "venv", "--without-pip", str(VENV)],
            [sys.executable, "-m", "pip", "--python", str(VENV / "bin" / "python"), "install", "-q"]
            + ["--no-deps", *PACKAGES],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode:
                shutil.rmtree(VENV, ignore_errors=True)
                return f"could not install {' '.join(PACKAGES)}: {(done.stderr or done.stdout)[-300:]}"
    missing = missing_libraries()
    if missing:
        return f"perf_analyzer needs {', '.join(missing)} (Debian: apt-get install libb64-0d)"
    done = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True, env=_environment())
    if done.returncode:
        return f"perf_analyzer does not run here: {(done.stderr or done.stdout)[-300:]}"
    return None


@dataclass
class Run:
    """One perf_analyzer run: its exit status, what it printed, and its CSV row (requests/s, latencies in
    microseconds), empty when it failed."""

    returncode: int
    output: str
    row: dict[str, float]

    @property
    def throughput(self) -> float:
        return self.row.get("Inferences/Second", 0.0)

    @property
    def p99_us(self) -> float:
        return self.row.get("p99 latency", 0.0)


def run(args: list[str], *, seconds: float = 3.4, timeout: float = 120.0, csv_path: Path) -> Run:
    """perf_analyzer ARGS measuring windows of `seconds` each, three in a row (stability not required: the
    figure is the run's, as our other load generators report theirs) with p99 latencies in the CSV. Up to
    6 windows: on a loaded machine a window that starves (no answer in it) makes perf_analyzer call the
    three unstable however wide the threshold, and the next ones are measured instead."""
    argv = [str(BINARY), *args, "-p", str(int(seconds * 1000)), "-s", "1000", "-r", "6"]
    argv += ["--percentile", "99", "-f", str(csv_path)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_environment())
    except subprocess.TimeoutExpired as e:
        return Run(-1, f"timed out after {timeout} s: {e.stdout or ''}", {})
    row: dict[str, float] = {}
    if done.returncode == 0 and csv_path.exists():
        rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
        if rows:
            row = {key: float(value) for key, value in rows[0].items() if value not in (None, "")}
    return Run(done.returncode, done.stdout + done.stderr, row)


def successful_requests(output: str) -> int:
    """The 'Successful request count' of the measured windows that perf_analyzer printed."""
    counts = [int(line.split(":")[1]) for line in output.splitlines() if "Successful request count" in line]
    return counts[-1] if counts else 0


# ------------------------------------------------------------------------------ the bench


def _bench(opts: argparse.Namespace) -> int:
    from bench.crosscheck import _lua_string
    from bench.grpc_bench import INFER_PATH, grpc_body, h2load
    from bench.grpc_load import infer_request
    from bench.harness import JSON_BODY
    from bench.procs import ServerProcess, serve_argv
    from bench.transport import wrk

    why = install()
    if why:
        print(why, file=sys.stderr)
        return 1
    work = HOME / "run"
    work.mkdir(parents=True, exist_ok=True)
    (work / "infer.grpc").write_bytes(grpc_body([bytes(infer_request())]))
    (work / "post.lua").write_text(
        f'wrk.method = "POST"\nwrk.body = {_lua_string(JSON_BODY)}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    results: dict[str, list[dict]] = {}
    with ServerProcess(serve_argv(), cwd=str(ROOT)) as server:
        pa = {
            "http": ["-i", "http", "-u", f"127.0.0.1:{server.port}"],
            "grpc": ["-i", "grpc", "-u", f"127.0.0.1:{server.grpc_port}"],
        }
        for round_ in range(opts.rounds):
            for protocol in ("http", "grpc") if round_ % 2 == 0 else ("grpc", "http"):
                done = run(
                    [*pa[protocol], "-m", "simple", "--concurrency-range", str(opts.concurrency)],
                    seconds=opts.seconds,
                    csv_path=work / "out.csv",
                )
                ok = done.returncode == 0 and done.row
                results.setdefault(f"perf_analyzer {protocol}", []).append(
                    {
                        "rate": done.throughput,
                        "p99_us": done.p99_us,
                        "note": "" if ok else done.output.strip().splitlines()[-1:],
                    }
                )
                seconds = 3 * opts.seconds
                if protocol == "http":
                    count, took, note = wrk(server.port, str(work / "post.lua"), seconds, opts.concurrency)
                    name = f"wrk -c{opts.concurrency} (HTTP/1.1 JSON)"
                else:
                    count, took, note = h2load(
                        server.grpc_port,
                        INFER_PATH,
                        str(work / "infer.grpc"),
                        int(seconds * 4000),
                        f"-c4 -m{max(1, opts.concurrency // 4)}",
                    )
                    name = f"h2load -c4 -m{max(1, opts.concurrency // 4)} (gRPC)"
                results.setdefault(name, []).append(
                    {"rate": count / took if took else 0.0, "p99_us": None, "note": note}
                )
    print(_report(results, opts))
    if opts.out:
        stamp = datetime.date.today().isoformat()
        out = Path(opts.out)
        (out / f"{stamp}-perf-analyzer.md").write_text(_report(results, opts))
        (out / f"{stamp}-perf-analyzer.json").write_text(json.dumps(results, indent=1))
    return 0


def _report(results: dict[str, list[dict]], opts: argparse.Namespace) -> str:
    from bench.report import machine

    host = machine()
    lines = [
        f"# perf_analyzer (tritonclient 2.51.0) beside our load generators: `simple`, concurrency "
        f"{opts.concurrency}",
        "",
        f"`python -m bench.perf_analyzer --rounds {opts.rounds} --duration {opts.duration:g}` on "
        f"{host['cpu']} ({host['cores']} cores): one server (`simple` on the example repository); each round "
        f"runs perf_analyzer (three windows of {opts.seconds:.1f} s, binary tensors over HTTP) then our own "
        "generator for as long on the same protocol, HTTP and gRPC alternating first. p99 is perf_analyzer's "
        "(wrk and h2load report none here).",
        "",
        "| client | req/s per round | req/s (median) | p99 (median) | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, rounds in results.items():
        rates = sorted(r["rate"] for r in rounds)
        p99s = sorted(r["p99_us"] for r in rounds if r["p99_us"])
        notes = "; ".join(str(r["note"]) for r in rounds if r["note"])
        lines.append(
            f"| {name} | {', '.join(f'{r:,.0f}' for r in (x['rate'] for x in rounds))} | "
            f"{rates[len(rates) // 2]:,.0f} | "
            f"{f'{p99s[len(p99s) // 2] / 1000:.2f} ms' if p99s else '-'} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf_analyzer", description=__doc__.split("\n")[0])
    parser.add_argument("--install", action="store_true", help="only set perf_analyzer up, then exit")
    parser.add_argument("--duration", type=float, default=10.2, help="seconds measured per client per round")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results", help="where <date>-perf-analyzer.md and .json go")
    opts, _ = parser.parse_known_args(argv)  # `make bench ARGS=...` passes the other benches' flags too
    opts.seconds = opts.duration / 3  # perf_analyzer measures three windows
    if opts.install:
        why = install()
        print(why or f"perf_analyzer ready: {BINARY}")
        return 1 if why else 0
    return _bench(opts)


if __name__ == "__main__":
    sys.exit(main())
