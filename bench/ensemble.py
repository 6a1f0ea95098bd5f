"""What an ensemble costs beside its steps: the example `classifier` (preprocess -> onnx_mlp ->
postprocess) against each of its three models called alone, one server (issue 14).

    python -m bench.ensemble [--duration 4] [--rounds 3] [--connections 8] [--out bench/results]

Each scenario is wrk -t1 -c<connections> POSTing one row as v2 JSON to one model over HTTP/1.1 for
`--duration` seconds; the order of the four turns around every round. The figure is the server's CPU per
request (median over the rounds). The target: the ensemble costs at most 1.5x the sum of its three
steps' per-request server time, each measured alone. Every answer is a 200 (wrk counts non-2xx), and the
server's statistics must show each step ran once per ensemble request answered (and at most once more
for each request in flight when wrk stopped and closed its connections).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date

import httpx

from bench.crosscheck import _lua_string
from bench.procs import ServerProcess, cpu_clock, serve_argv
from bench.transport import save, wrk

TARGET = 1.5  # ensemble / sum of its steps alone, server CPU per request
BODIES = {
    "classifier": {"name": "RAW", "datatype": "UINT8", "shape": [1, 64], "data": list(range(0, 128, 2))},
    "preprocess": {"name": "RAW", "datatype": "UINT8", "shape": [1, 64], "data": list(range(0, 128, 2))},
    "onnx_mlp": {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.25] * 64},
    "postprocess": {"name": "LOGITS", "datatype": "FP32", "shape": [1, 10], "data": [0.5] * 10},
}
STEPS = ("preprocess", "onnx_mlp", "postprocess")


def successes(port: int, model: str) -> int:
    stats = httpx.get(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
    return sum(s["inference_stats"]["success"]["count"] for s in stats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ensemble", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("needs wrk (apt-get install wrk)")
    order = ["classifier", *STEPS]
    results: dict[str, list[dict]] = {model: [] for model in order}
    with tempfile.TemporaryDirectory() as directory, ServerProcess(serve_argv()) as server:
        scripts = {}
        for model, tensor in BODIES.items():
            scripts[model] = os.path.join(directory, f"{model}.lua")
            with open(scripts[model], "w") as f:
                body = json.dumps({"inputs": [tensor]}).encode()
                f.write(f'wrk.method = "POST"\nwrk.body = {_lua_string(body)}\n')
                f.write('wrk.headers["Content-Type"] = "application/json"\n')
        for model in order:  # warm-up: first calls, batchers, onnxruntime's first run
            wrk(server.port, scripts[model], 1, args.connections, path=f"/v2/models/{model}/infer")
        for round_number in range(args.rounds):
            for model in order if round_number % 2 == 0 else order[::-1]:
                before = {name: successes(server.port, name) for name in order}
                cpu = cpu_clock(server.pid)
                requests, seconds, note = wrk(
                    server.port,
                    scripts[model],
                    args.duration,
                    args.connections,
                    path=f"/v2/models/{model}/infer",
                )
                used = cpu_clock(server.pid) - cpu
                time.sleep(0.5)  # the requests wrk left in flight are answered
                ran = {name: successes(server.port, name) - before[name] for name in order}
                answered = ran["classifier"]  # steps may also have run for the requests wrk left at its end
                if model == "classifier" and any(
                    not answered <= ran[step] <= answered + args.connections for step in STEPS
                ):
                    note = (note + f" the steps ran {ran} times").strip()
                results[model].append(
                    {
                        "requests": requests,
                        "rps": requests / seconds,
                        "cpu_us": 1e6 * used / requests,
                        "note": note,
                    }
                )
                print(f"  round {round_number + 1} {model}: {requests / seconds:,.0f}/s, "
                      f"{1e6 * used / requests:.1f} us", file=sys.stderr)  # fmt: skip
    save(report(results, args), results, args, "ensemble")
    notes = [r["note"] for runs in results.values() for r in runs if r["note"]]
    return 1 if notes else 0


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    median = {model: statistics.median(r["cpu_us"] for r in runs) for model, runs in results.items()}
    steps = sum(median[step] for step in STEPS)
    ratio = median["classifier"] / steps
    per_round = [
        results["classifier"][i]["cpu_us"] / sum(results[s][i]["cpu_us"] for s in STEPS)
        for i in range(args.rounds)
    ]
    lines = [
        f"# Ensemble bench, {date.today()} ({platform.node() or 'this machine'}, {os.cpu_count()} cores)",
        "",
        f"wrk -t1 -c{args.connections}, one row per request as v2 JSON over HTTP/1.1, {args.duration:g} s "
        f"per model per round, {args.rounds} rounds in alternating order; server CPU per request is the "
        "median of the rounds.",
        "",
        "| model | requests/s | server CPU/request | notes |",
        "|---|---|---|---|",
    ]
    for model, runs in results.items():
        rps = sum(r["requests"] for r in runs) / (args.duration * len(runs))
        notes = "; ".join(r["note"] for r in runs if r["note"])
        lines.append(f"| {model} | {rps:,.0f} | {median[model]:.1f} µs | {notes} |")
    lines += [
        "",
        "## Target",
        "",
        "| | ratio | per-round range | target | met |",
        "|---|---|---|---|---|",
        f"| classifier / (preprocess + onnx_mlp + postprocess), each alone | {ratio:.2f}x "
        f"({median['classifier']:.1f} / {steps:.1f} µs) | {min(per_round):.2f}-{max(per_round):.2f} | "
        f"<= {TARGET}x | {'yes' if ratio <= TARGET else 'NO'} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
