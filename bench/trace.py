"""python -m bench.trace: what Triton's trace extension costs a request (issue 29).

Servers side by side on 127.0.0.1, driven in alternating rounds by wrk (-t1 -c16, POST
/v2/models/simple/infer, JSON, as bench.transport's json-h1):

    off        our server, tracing off (the default)
    rate1000   the same with --trace-config level=TIMESTAMPS rate=1000, triton,file=..., log-frequency=10:
               one request in 1000 traced, its trace written to a file every 10 traces
    rate1      every request traced (what a trace costs, for scale)
    baseline   with --baseline DIR: our server from another checkout (the commit before tracing), tracing
               off both: that a plain request does not pay for tracing

Per server: req/s and server CPU per request (from /proc); the target: rate1000 / off <= 1.03 (the
median of the per-round ratios).

    python -m bench.trace [--duration 4] [--rounds 5] [--baseline DIR] [--out bench/results]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import timeit

from bench.crosscheck import _lua_string
from bench.harness import JSON_BODY
from bench.procs import ServerProcess, serve_argv
from bench.transport import ROOT, measure, save, summarize, wrk
from tensorgate.codec.trace import TIMESTAMPS
from tensorgate.server.tracing.settings import TraceSetting
from tensorgate.server.tracing.tracer import Tracer

TARGET = 1.03


def servers(trace_dir: str, baseline: str | None) -> dict[str, tuple[list[str], str]]:
    serve = serve_argv()
    traced = [*serve, "--trace-config", "level=TIMESTAMPS", "--trace-config", "triton,log-frequency=10"]
    commands = {
        "off": (serve, ROOT),
        "rate1000": ([*traced, "--trace-config", "rate=1000", "--trace-config", f"file={trace_dir}/a"], ROOT),
        "rate1": ([*traced, "--trace-config", "rate=1", "--trace-config", f"file={trace_dir}/b"], ROOT),
    }
    if baseline:
        commands["baseline"] = (serve, baseline)
    return commands


def sampling_ns() -> float:
    """What deciding costs an untraced request at rate 1000, in process: ns per Tracer.sample call."""
    tracer = Tracer(TraceSetting(level=(TIMESTAMPS,), rate=1000, file=os.devnull))
    calls = 1_000_000
    seconds = min(timeit.repeat(lambda: tracer.sample("simple"), number=calls, repeat=5))
    return seconds / calls * 1e9


def report(results: dict, args: argparse.Namespace, traces: dict[str, int]) -> str:
    rounds = results["rounds"]
    lines = [
        f"# Trace bench, {os.uname().nodename} ({os.cpu_count()} cores)",
        "",
        f"wrk -t1 -c16, POST /v2/models/simple/infer (JSON), {args.duration:g} s per server per round, "
        f"{args.rounds} rounds alternating; req/s over all rounds, server CPU per request the median of the "
        "rounds.",
        "",
        "| server | req/s | server CPU/request | trace files written |",
        "|---|---|---|---|",
    ]
    for key in rounds:
        summary = results[key]
        lines.append(
            f"| {key} | {summary['rps']:,.0f} | {summary['cpu_us']:.1f} µs | {traces.get(key, '-')} |"
        )
    lines += ["", "| ratio of CPU per request | median of rounds | per-round range | target | met |"]
    lines.append("|---|---|---|---|---|")
    for key, base, target in (
        ("rate1000", "off", TARGET),
        ("rate1", "off", None),
        ("off", "baseline", TARGET),
    ):
        if key not in rounds or base not in rounds:
            continue
        ratios = [a["cpu_us"] / b["cpu_us"] for a, b in zip(rounds[key], rounds[base], strict=True)]
        median = statistics.median(ratios)
        wanted = f"<= {target:.2f}x" if target else "-"
        met = ("yes" if median <= target else "no") if target else "-"
        lines.append(
            f"| {key} / {base} | {median:.3f}x | {min(ratios):.3f}-{max(ratios):.3f} | {wanted} | {met} |"
        )
    sample = results["sample_ns"]
    lines += [
        "",
        f"In process, deciding whether to trace an untraced request at rate 1000 (`Tracer.sample`, timeit, "
        f"a lambda's call included) costs {sample:.0f} ns: {sample / 10 / results['off']['cpu_us']:.2f}% of "
        "`off`'s CPU per request; the front end's `tracer.on` check and the model's `request.trace` check "
        "are one attribute read each.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--baseline", metavar="DIR", help="a checkout of another commit, run beside ours")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("needs wrk (apt-get install wrk)")
    with tempfile.TemporaryDirectory() as directory:
        lua = os.path.join(directory, "post.lua")
        with open(lua, "w") as f:
            f.write(
                f'wrk.method = "POST"\nwrk.body = {_lua_string(JSON_BODY)}\n'
                'wrk.headers["Content-Type"] = "application/json"\n'
            )
        commands = servers(directory, args.baseline)
        running = {key: ServerProcess(argv, cwd=cwd) for key, (argv, cwd) in commands.items()}
        per_server: dict[str, list[dict]] = {key: [] for key in running}
        try:
            order = list(running)
            for round_no in range(args.rounds):
                for key in order if round_no % 2 == 0 else order[::-1]:
                    port = running[key].port
                    result = measure(running[key], lambda p=port: wrk(p, lua, args.duration))
                    per_server[key].append(result)
                    rate, cpu = result["rps"], result["cpu_us"]
                    print(f"  round {round_no + 1} {key}: {rate:.0f} req/s, {cpu:.1f} us", file=sys.stderr)
        finally:
            for server in running.values():
                server.stop()
        traces = {
            key: len([name for name in os.listdir(directory) if name.startswith(f"{prefix}.")])
            for key, prefix in (("rate1000", "a"), ("rate1", "b"))
        }
    results = {key: summarize(rounds) for key, rounds in per_server.items()} | {"rounds": per_server}
    results["sample_ns"] = sampling_ns()
    save(report(results, args, traces), results, args, "trace")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
