"""`tensorgate perf` beside Triton's perf_analyzer on the same server, in alternating rounds.

    python -m bench.perf_versus [--rounds 3] [--seconds 3] [--concurrency 16] [--rate 4000] [--out DIR]

One server (`simple` on the example repository). Each round runs, in alternating order, perf_analyzer and
`tensorgate perf` with the same plan: three windows of `--seconds` at `--concurrency` (closed loop), over
HTTP (binary tensors, as perf_analyzer sends them: our `rest-binary`) and over gRPC (ModelInfer); then both
open loop at `--rate` requests/s over each, where the two put the same load on the server and their p50
should agree. (Closed loop, a lighter client leaves the server more of the two cores: more req/s, so by
Little's law a lower p50 at the same concurrency.)

Each client's CPU per request is its whole process's CPU time (rusage) over the requests the server
counted while it ran (its statistics before and after): the same method for both, start-up included.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench.procs import ServerProcess, serve_argv
from tensorgate.perf_analyzer import install, run

ROOT = Path(__file__).resolve().parent.parent


def served(port: int, model: str) -> int:
    stats = httpx.get(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
    return sum(s["inference_stats"]["success"]["count"] for s in stats)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(server: ServerProcess, client: str, plan: str, opts: argparse.Namespace, work: Path) -> dict:
    """One client's run: req/s, p50 and p99 (µs) as it reports them, its CPU µs per served request."""
    protocol, load = plan.split()
    before, cpu = served(server.port, opts.model), children_cpu()
    model = ["-m", opts.model, *opts.shape_args]
    if client == "perf_analyzer":
        url = f"127.0.0.1:{server.grpc_port if protocol == 'grpc' else server.port}"
        levels = ["--concurrency-range", str(opts.concurrency)]
        if load == "open":
            levels = ["--request-rate-range", str(opts.rate)]
        done = run(
            ["-i", protocol, "-u", url, *model, *levels], seconds=opts.seconds, csv_path=work / "pa.csv"
        )
        figures = {"rate": done.throughput, "p50_us": done.row.get("p50 latency", 0.0), "p99_us": done.p99_us}
        note = "" if done.returncode == 0 and done.row else done.output.strip()[-300:]
    else:
        url = (
            f"grpc://127.0.0.1:{server.grpc_port}"
            if protocol == "grpc"
            else f"http://127.0.0.1:{server.port}"
        )
        levels = (
            ["--concurrency", str(opts.concurrency)]
            if load == "closed"
            else ["--request-rate", str(opts.rate)]
        )
        out = work / "ours.json"
        windows = ["-p", str(int(opts.seconds * 1000)), "-s", "1000", "-r", "3", "--warmup", "0"]
        ours = "grpc" if protocol == "grpc" else "rest-binary"
        done = subprocess.run(
            [sys.executable, "-m", "tensorgate.perf", url, *model, "-i", ours, *levels, *windows,
             "--no-progress", "--no-server-stats", "--json", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        level = json.loads(out.read_text())[0] if done.returncode == 0 else {}
        figures = {
            "rate": level.get("requests_per_s", 0.0),
            "p50_us": level.get("latency_us", {}).get("p50", 0.0),
            "p99_us": level.get("latency_us", {}).get("p99", 0.0),
        }
        note = "" if done.returncode == 0 else (done.stdout + done.stderr).strip()[-300:]
    requests = served(server.port, opts.model) - before
    figures["cpu_us"] = (children_cpu() - cpu) / max(1, requests) * 1e6
    figures["note"] = note
    return figures


PLANS = ("http closed", "grpc closed", "http open", "grpc open")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf_versus", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="each of the three windows")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=4000.0, help="the open-loop plan's requests/s")
    parser.add_argument("--model", default="simple", help="a model of the example repository")
    parser.add_argument("--shape", action="append", default=[], help="NAME:DIMS, given to both clients")
    parser.add_argument("--out", default="", help="where <date>-perf-versus[-MODEL].md and .json go")
    opts = parser.parse_args(argv)
    opts.shape_args = [a for shape in opts.shape for a in ("--shape", shape)]
    why = install()
    if why:
        print(why, file=sys.stderr)
        return 1
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(serve_argv(), cwd=str(ROOT)) as server:
        for number in range(opts.rounds):
            clients = ["perf_analyzer", "tensorgate perf"]
            if number % 2:
                clients.reverse()
            for plan in PLANS:
                for client in clients:
                    figures = measure(server, client, plan, opts, Path(tmp))
                    results.setdefault(f"{plan}|{client}", []).append(figures)
                    print(f"round {number + 1} {plan:12s} {client:16s} {figures}", file=sys.stderr)
    text = render(results, opts)
    print(text)
    if opts.out:
        stamp = datetime.date.today().isoformat()
        name = f"{stamp}-perf-versus" + ("" if opts.model == "simple" else f"-{opts.model}")
        Path(opts.out).mkdir(parents=True, exist_ok=True)
        (Path(opts.out) / f"{name}.md").write_text(text)
        (Path(opts.out) / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def render(results: dict[str, list[dict]], opts: argparse.Namespace) -> str:
    from bench.report import machine

    host = machine()
    lines = [
        f"# `tensorgate perf` beside perf_analyzer (tritonclient 2.51.0), `{opts.model}` on our server",
        "",
        f"`python -m bench.perf_versus --model {opts.model} --rounds {opts.rounds} --seconds "
        f"{opts.seconds:g} --concurrency {opts.concurrency} --rate {opts.rate:g}` on {host['cpu']} "
        f"({host['cores']} cores), the clients alternating first each round. Medians of the rounds; CPU "
        "per request is each client's process CPU over the requests the server counted during its run.",
        "",
        "| plan | client | req/s | p50 µs | p99 µs | client CPU µs/req | req/s per round | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    medians: dict[str, dict[str, float]] = {}
    for key, rounds in results.items():
        plan, client = key.split("|")
        m = {k: _median([r[k] for r in rounds]) for k in ("rate", "p50_us", "p99_us", "cpu_us")}
        medians[key] = m
        notes = "; ".join(r["note"] for r in rounds if r["note"])
        per_round = ", ".join(f"{r['rate']:,.0f}" for r in rounds)
        lines.append(
            f"| {plan} | {client} | {m['rate']:,.0f} | {m['p50_us']:,.0f} | {m['p99_us']:,.0f} | "
            f"{m['cpu_us']:.1f} | {per_round} | {notes} |"
        )
    lines += [
        "",
        "| plan | req/s ours / theirs | CPU/req ours / theirs | p50 ours / theirs |",
        "|---|---|---|---|",
    ]
    for plan in PLANS:
        ours, theirs = medians.get(f"{plan}|tensorgate perf"), medians.get(f"{plan}|perf_analyzer")
        if ours and theirs and theirs["rate"] and theirs["cpu_us"] and theirs["p50_us"]:
            rate, cpu = ours["rate"] / theirs["rate"], ours["cpu_us"] / theirs["cpu_us"]
            lines.append(f"| {plan} | {rate:.2f}x | {cpu:.2f}x | {ours['p50_us'] / theirs['p50_us']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
