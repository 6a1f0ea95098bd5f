"""What a response-cache hit costs beside the same request missing, on the example MLP (issue 29).

    python -m bench.cache [--duration 4] [--rounds 3] [--connections 8] [--out bench/results]

One server serves a copy of examples/model_repository/mlp with `response_cache { enable: true }`, run with
`--cache-config local,size=64 MiB`. Two scenarios, each wrk -t1 -c<connections> POSTing one [1, 64] FP32
row as v2 JSON over HTTP/1.1 for `--duration` s, their order turned around every round:
- `miss`: every request a row of fresh random values (wrk's Lua writes each body): each one looks up the
  cache, runs the dynamic batcher and TorchScript, and inserts its answer;
- `hit`: one fixed row of the same length, written the same way: after the first, every request is
  answered from the cache.
The figure is the server's CPU per request (from /proc; the median of the rounds). The target: a hit costs
at most 0.5x the CPU of a miss. The server's statistics must agree: in `hit` rounds every request but at
most one is a cache hit, in `miss` rounds every request a miss.
"""

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import httpx

from bench.procs import ServerProcess, cpu_clock, serve_argv
from bench.transport import save, wrk

TARGET = 0.5  # hit / miss, server CPU per request
MODEL = "mlp"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "model_repository" / MODEL
CACHE_BYTES = 64 << 20
WIDTH = 64
# Each body: 64 values printed "%.6f" in [0, 1), the same length whether fixed or fresh.
_BODY = f"""
local function row(fresh)
  local values = {{}}
  for i = 1, {WIDTH} do
    values[i] = string.format("%.6f", fresh and math.random() or (i / 100.0))
  end
  return '{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,{WIDTH}],"data":[' ..
    table.concat(values, ",") .. ']}}]}}'
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
"""
SCRIPTS = {
    "hit": _BODY + "wrk.body = row(false)\n",
    "miss": _BODY + "math.randomseed(os.time())\nrequest = function()\n"
    "  return wrk.format(nil, nil, nil, row(true))\nend\n",
}


PATH = f"/v2/models/{MODEL}/infer"


def copy_model(repository: Path) -> None:
    """The example MLP with the response cache enabled."""
    target = repository / MODEL
    shutil.copytree(EXAMPLE, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")


def counts(port: int) -> dict[str, int]:
    (stats,) = httpx.get(f"http://127.0.0.1:{port}/v2/models/{MODEL}/stats", timeout=10).json()["model_stats"]
    inference = stats["inference_stats"]
    return {key: inference[key]["count"] for key in ("success", "cache_hit", "cache_miss")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("needs wrk (apt-get install wrk)")
    order = ["hit", "miss"]
    results: dict[str, list[dict]] = {name: [] for name in order}
    with tempfile.TemporaryDirectory() as directory:
        repository = Path(directory) / "models"
        copy_model(repository)
        scripts = {}
        for name, text in SCRIPTS.items():
            scripts[name] = os.path.join(directory, f"{name}.lua")
            Path(scripts[name]).write_text(text)
        command = [*serve_argv(str(repository)), "--cache-config", f"local,size={CACHE_BYTES}"]
        with ServerProcess(command) as server:
            for name in order:  # warm-up: torch's first runs, the batcher, the hit's one miss
                wrk(server.port, scripts[name], 1, args.connections, path=PATH)
            for round_number in range(args.rounds):
                for name in order if round_number % 2 == 0 else order[::-1]:
                    before, cpu = counts(server.port), cpu_clock(server.pid)
                    requests, seconds, note = wrk(
                        server.port, scripts[name], args.duration, args.connections, path=PATH
                    )
                    used = cpu_clock(server.pid) - cpu
                    time.sleep(0.5)  # the requests wrk left in flight are answered
                    after = counts(server.port)
                    ran = {key: after[key] - before[key] for key in after}
                    expected = "cache_hit" if name == "hit" else "cache_miss"
                    if ran[expected] < ran["success"] - 1:
                        note = (note + f" statistics: {ran}").strip()
                    results[name].append(
                        {"requests": requests, "rps": requests / seconds, "cpu_us": 1e6 * used / requests,
                         "statistics": ran, "note": note}
                    )  # fmt: skip
                    print(f"  round {round_number + 1} {name}: {requests / seconds:,.0f}/s, "
                          f"{1e6 * used / requests:.1f} us", file=sys.stderr)  # fmt: skip
    save(report(results, args), results, args, "cache")
    notes = [r["note"] for runs in results.values() for r in runs if r["note"]]
    return 1 if notes else 0


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    median = {name: statistics.median(r["cpu_us"] for r in runs) for name, runs in results.items()}
    ratio = median["hit"] / median["miss"]
    per_round = [h["cpu_us"] / m["cpu_us"] for h, m in zip(results["hit"], results["miss"], strict=True)]
    machine = f"{platform.node() or 'this machine'}, {os.cpu_count()} cores"
    met = "yes" if ratio <= TARGET else "NO"
    lines = [
        f"# Response cache bench, {date.today()} ({machine})",
        "",
        "The example MLP (TorchScript, dynamic batching) with `response_cache { enable: true }`, server run "
        f"with `--cache-config local,size={CACHE_BYTES}`. wrk -t1 -c{args.connections}, one [1, {WIDTH}] "
        f"FP32 row per request as v2 JSON over HTTP/1.1, {args.duration:g} s per scenario per round, "
        f"{args.rounds} rounds in alternating order; server CPU per request is the median of the rounds. "
        "`miss`: every row fresh random values (each request looks up, runs the batcher and the model, "
        "inserts); `hit`: one fixed row (answered from the cache).",
        "",
        "| scenario | requests/s | server CPU/request | cache hits / misses (statistics) | notes |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        rps = sum(r["requests"] for r in runs) / (args.duration * len(runs))
        hits = sum(r["statistics"]["cache_hit"] for r in runs)
        misses = sum(r["statistics"]["cache_miss"] for r in runs)
        notes = "; ".join(r["note"] for r in runs if r["note"])
        lines.append(f"| {name} | {rps:,.0f} | {median[name]:.1f} µs | {hits:,} / {misses:,} | {notes} |")
    lines += [
        "",
        "## Target",
        "",
        "| | ratio | per-round range | target | met |",
        "|---|---|---|---|---|",
        f"| hit / miss, server CPU per request | {ratio:.2f}x ({median['hit']:.1f} / {median['miss']:.1f} "
        f"µs) | {min(per_round):.2f}-{max(per_round):.2f} | <= {TARGET}x | {met} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
