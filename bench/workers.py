"""python -m bench.workers: `--workers N` side by side, and beside real Triton 2.51 (issue 26).

Servers, all up at once on 127.0.0.1, in rounds whose order alternates (A B C, C B A, ...):

    w1, w2, ...   `python -m tensorgate.server serve` on the example repository with `--workers 1`, `2`, ...
    w2i, ...      with `--worker-models inline` too: `simple` also runs in each worker (no hop)
    w2h           with `--every-hop`: `--workers 2 --engine-front-end false`, so every request hops
    bw1, bw2h     with `--baseline DIR`: w1 (and with `--every-hop` w2h) from another checkout, as its tree
                  is built (a worktree of an earlier commit): the hop before and after a change, in one run
    triton        with `--triton KIT`: Triton 2.51 serving `simple` on its C++ backend
                  (../shared/triton: run its setup.sh first; TRITON_HOME as it says)

Scenarios (requests/s over all rounds; server CPU per request, summed over every process of the server, the
median of the rounds):
- json-h1: wrk -t`--wrk-threads` -c16, POST /v2/models/simple/infer (JSON).
- grpc: h2load -c8 -m4, ModelInfer on `simple` (raw contents), gRPC framing. Eight connections: with four the
  kernel sometimes hands every one to the same process.
- json-h2: h2load -c8 -m4, the JSON request over h2c (Triton has no h2c: ours only).
- binary: a 64 MiB FP32 tensor through identity_fp32 and back over HTTP/1.1 (bench.transport's `binary`) on
  the largest worker count, on `--binary-connections` connections one after the other (the kernel picks
  the process of each; the one whose CPU grew most served it): GB/s both ways, peak RSS growth of all its
  processes over the payload (past each warm-up trip), and the resident memory the server keeps after all
  of them (a worker's arena keeps the pages it used).
- batching: the example MLP (dynamic batching) at 64 connections (h2load --h1 -c64, one binary row a
  request); the mean batch size from the statistics (rows inferred / executions).

The process hop (what a request served through a worker costs beyond one process) is the CPU per request of
w2 less w1's, round by round: with two processes about half the requests hop, so the per-hop figure is
twice that. With `--every-hop`, w2h less w1 is the hop itself (the engine answers no client: issue 38's
goal, at most 20 µs).

    python -m bench.workers [--workers 1 2] [--baseline DIR] [--triton ../shared/triton] [--rounds 3]
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import httpx

from bench.batching import infer_request as mlp_request
from bench.grpc_bench import grpc_body
from bench.grpc_bench import h2load as grpc_h2load
from bench.grpc_load import INFER_PATH
from bench.grpc_load import infer_request as grpc_request
from bench.procs import ServerProcess, checkout_env, cpu_clock, memory_kib, process_tree, serve_argv
from bench.transport import (
    _run,
    alternating_rounds,
    binary,
    binary_body,
    h2load,
    json_files,
    measure,
    save,
    wrk,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ("json-h1", "grpc", "json-h2", "binary", "batching")
TRITON = "triton"
TARGETS = (  # (scenario, server, against, at least): the issues' req/s targets (26; 38 for w2i)
    ("json-h1", "w2", "w1", 1.4),
    ("grpc", "w2", "w1", 1.4),
    ("json-h2", "w2", "w1", 1.3),
    ("json-h1", "w2", TRITON, 1.3),
    ("grpc", "w2", TRITON, 1.3),
    ("json-h1", "w2i", "w1", 1.3),
    ("grpc", "w2i", "w1", 1.3),
)
HOP_TARGET_US = 8.0
EVERY_HOP_TARGET_US = 20.0  # issue 38: a request hopped costs at most this much more
BINARY_TARGET = (2.5, 1.1)  # GB/s at least, peak RSS growth at most (x payload)


class Triton:
    """Triton 2.51 on the kit's C++ backend (`start.sh cxx`), on three free ports."""

    def __init__(self, kit: str) -> None:
        self.port, self.grpc_port, metrics = free_ports(3)
        out = subprocess.run(
            [os.path.join(kit, "start.sh"), "cxx", str(self.port), str(self.grpc_port), str(metrics)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        if out.returncode != 0:
            raise RuntimeError(f"Triton did not start: {out.stderr[-2000:]}")
        self.pid = int(out.stdout.split()[-1])

    def stop(self) -> None:
        try:
            os.kill(self.pid, 15)
        except ProcessLookupError:
            return
        for _ in range(300):
            if not os.path.exists(f"/proc/{self.pid}"):
                return
            time.sleep(0.1)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def prepare(name: str, server, args, files) -> Callable[[], tuple[int, float, str]]:
    """The timed run of scenario `name` on `server`, after an untimed warm-up sizing it to the duration."""
    if name == "json-h1":
        return lambda: wrk(server.port, files["lua"], args.duration, threads=args.wrk_threads)
    if name == "json-h2":
        warm = h2load(server.port, files["json"], 2000, "-c8 -m4")
        count = max(2000, int(warm[0] / warm[1] * args.duration)) if warm[1] else 2000
        return lambda: h2load(server.port, files["json"], count, "-c8 -m4")
    warm = grpc_h2load(server.grpc_port, INFER_PATH, files["grpc"], 2000, "-c8 -m4")
    count = max(2000, int(warm[0] / warm[1] * args.duration)) if warm[1] else 2000
    return lambda: grpc_h2load(server.grpc_port, INFER_PATH, files["grpc"], count, "-c8 -m4")


def load_rounds(name: str, servers: dict, args, files) -> dict:
    order = [key for key in servers if not (name == "json-h2" and key == TRITON)]
    return alternating_rounds(
        name, order, args.rounds, lambda key: measure(servers[key], prepare(name, servers[key], args, files))
    )


def batching(server: ServerProcess, args, files) -> dict:
    """The MLP at 64 connections for `args.duration` s: rows inferred per execution, from the statistics."""
    base = f"http://127.0.0.1:{server.port}/v2/models/mlp/stats"

    def counts() -> tuple[int, int]:
        (stats,) = httpx.get(base, timeout=10).json()["model_stats"]
        return stats["inference_count"], stats["execution_count"]

    header, raw = files["mlp"]
    argv = [
        "h2load",
        "--h1",
        "-c64",
        "-m1",
        "-w30",
        "-W30",
        "-d",
        raw,
        "-H",
        f"inference-header-content-length: {header}",
    ]
    _run([*argv, "-n2000", f"http://127.0.0.1:{server.port}/v2/models/mlp/infer"], 120)  # warm
    before = counts()
    started = time.monotonic()
    out = _run(
        [*argv, f"-D{max(1, round(args.duration))}", f"http://127.0.0.1:{server.port}/v2/models/mlp/infer"],
        120,
    )
    seconds = time.monotonic() - started
    after = counts()
    rows, executions = after[0] - before[0], after[1] - before[1]
    return {
        "rows": rows,
        "rps": rows / seconds,
        "mean_batch": rows / executions if executions else 0.0,
        "note": "" if " 0 failed" in out else out[-300:],
    }


def served(server: ServerProcess, args, files) -> dict:
    """bench.transport's `binary` on one connection, and which process served it."""
    before = {pid: cpu_clock(pid, tree=False) for pid in process_tree(server.pid)}
    result = binary(server, False, args, files)
    grew = {pid: cpu_clock(pid, tree=False) - used for pid, used in before.items()}
    result["served_by"] = "engine" if max(grew, key=grew.get) == server.pid else "a worker"
    return result


def resident_kib(pid: int) -> list[int]:
    """VmRSS of each process of a server, the engine first."""
    kib = []
    for each in process_tree(pid):
        with open(f"/proc/{each}/status") as status:
            kib += [int(line.split()[1]) for line in status if line.startswith("VmRSS:")]
    return kib


def hop_us(rounds: dict, key: str = "w2", base: str = "w1") -> tuple[float, float, float]:
    """Median, min, max over rounds of the extra CPU per request of `key` over `base`."""
    extra = [a["cpu_us"] - b["cpu_us"] for a, b in zip(rounds[key], rounds[base], strict=True)]
    return statistics.median(extra), min(extra), max(extra)


def ratio(rounds: dict, key: str, base: str) -> tuple[float, float, float]:
    ratios = [a["rps"] / b["rps"] for a, b in zip(rounds[key], rounds[base], strict=True) if b["rps"]]
    return statistics.median(ratios), min(ratios), max(ratios)


def yes(met: bool) -> str:
    return "yes" if met else "no"


def report(results: dict, args) -> str:
    cores = os.cpu_count()
    lines = [
        f"# `--workers` side by side: {time.strftime('%Y-%m-%d')}",
        "",
        f"`python -m bench.workers {' '.join(args.argv)}` on {args.machine} ({cores} cores); the load "
        f"generators run on the same cores. {args.rounds} rounds of {args.duration:g} s per server, order "
        "alternating; req/s over all rounds, server CPU per request (every process of the server) the "
        "median of the rounds.",
        "",
        "| scenario | server | req/s | CPU/request | cores used | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("json-h1", "grpc", "json-h2"):
        for key, value in results.get(name, {}).items():
            if key != "rounds":
                notes = "; ".join(value["notes"])
                lines.append(
                    f"| {name} | {key} | {value['rps']:,.0f} | {value['cpu_us']:.1f} µs | "
                    f"{value['cores']:.2f} | {notes} |"
                )
    lines += [
        "",
        "| target | measured (median of rounds) | per-round range | goal | met |",
        "|---|---|---|---|---|",
    ]
    for name, key, base, goal in TARGETS:
        rounds = results.get(name, {}).get("rounds", {})
        if key in rounds and base in rounds:
            mid, low, high = ratio(rounds, key, base)
            met = "yes" if mid >= goal else "no"
            lines.append(
                f"| {name} req/s {key} / {base} | {mid:.2f}x | {low:.2f}-{high:.2f} | >= {goal}x | {met} |"
            )
    for name in ("json-h1", "grpc", "json-h2"):
        rounds = results.get(name, {}).get("rounds", {})
        if "w2" in rounds and "w1" in rounds:
            mid, low, high = hop_us(rounds)
            lines.append(
                f"| {name} CPU/request w2 - w1 (about half the requests hop) | {mid:+.1f} µs | "
                f"{low:+.1f}-{high:+.1f} | <= {HOP_TARGET_US:g} µs | {yes(mid <= HOP_TARGET_US)} |"
            )
        for every, one, where in (("w2h", "w1", ""), ("bw2h", "bw1", ", the baseline")):
            if every in rounds and one in rounds:
                mid, low, high = hop_us(rounds, every, one)
                lines.append(
                    f"| {name} CPU/request {every} - {one} (every request hops{where}) | {mid:+.1f} µs | "
                    f"{low:+.1f}-{high:+.1f} | <= {EVERY_HOP_TARGET_US:g} µs | "
                    f"{yes(mid <= EVERY_HOP_TARGET_US)} |"
                )
    gbs, rss = BINARY_TARGET
    for value in results.get("binary", []):
        if "error" in value:
            lines.append(f"| 64 MiB binary round trip | {value['error']} | | | no |")
            continue
        where = f"{args.workers[-1]} workers, served by {value['served_by']}"
        lines.append(
            f"| 64 MiB binary round trip, {where} | {value['gb_s']:.2f} GB/s | | >= {gbs} GB/s | "
            f"{yes(value['gb_s'] >= gbs)} |"
        )
        lines.append(
            f"| its peak RSS growth, all processes | {value['rss_growth_x']:.2f}x the payload | | "
            f"<= {rss}x | {yes(value['rss_growth_x'] <= rss)} |"
        )
    memory = results.get("memory", {})
    if memory:
        lines += ["", "| server | resident memory of each process after the load (the engine first) |"]
        lines.append("|---|---|")
        for key, kib in memory.items():
            lines.append(f"| {key} | {', '.join(f'{k / 1024:.0f} MiB' for k in kib)} |")
    if "binary_kept_x" in results:
        lines.append(
            f"| resident memory kept after them, all processes (an arena keeps the pages it used) | "
            f"{results['binary_kept_x']:.2f}x the payload | | - | - |"
        )
    batches = results.get("batching", {})
    if "w1" in batches and "w2" in batches:
        one, two = batches["w1"]["mean_batch"], batches["w2"]["mean_batch"]
        lines.append(
            f"| MLP mean batch at c=64, w2 (w1) | {two:.1f} ({one:.1f}) | | >= w1's | {yes(two >= one)} |"
        )
    if batches:
        lines += ["", "| MLP at c=64 | rows/s | mean batch | notes |", "|---|---|---|---|"]
        for key, value in batches.items():
            lines.append(f"| {key} | {value['rps']:,.0f} | {value['mean_batch']:.1f} | {value['note']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts side by side")
    parser.add_argument(
        "--inline", action="store_true", help="also each count over 1 with --worker-models inline (w2i, ...)"
    )
    parser.add_argument(
        "--every-hop", action="store_true", help="also --workers 2 --engine-front-end false (w2h): every hop"
    )
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, built: its w1 (and w2h) beside")
    parser.add_argument("--triton", metavar="KIT", help="../shared/triton, set up: Triton on C++ beside ours")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (more on a many-core machine)")
    parser.add_argument("--binary-mib", type=int, default=64)
    parser.add_argument("--binary-trips", type=int, default=10)
    parser.add_argument("--binary-connections", type=int, default=4)
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--machine", default="vm", help="what the report names the machine")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    if shutil.which("wrk") is None or shutil.which("h2load") is None:
        parser.error("needs wrk and h2load (apt-get install wrk nghttp2-client)")
    results: dict = {}
    with tempfile.TemporaryDirectory() as directory:
        files = json_files(directory) | {"grpc": os.path.join(directory, "grpc")}
        with open(files["grpc"], "wb") as f:
            f.write(grpc_body([bytes(grpc_request())]))
        request = mlp_request("127.0.0.1", 0, "mlp")
        body = request.split(b"\r\n\r\n", 1)[1]
        header = int(request.split(b"Inference-Header-Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        files["mlp"] = (header, os.path.join(directory, "mlp"))
        with open(files["mlp"][1], "wb") as f:
            f.write(body)
        if "binary" in args.only:
            files["binary"] = binary_body(args.binary_mib, directory)
        servers: dict = {}
        # Beside a baseline, ours start as its do (a link tree on PYTHONPATH): only their code differs
        ours = checkout_env(ROOT) if args.baseline else None
        try:
            for count in args.workers:
                plain = [*serve_argv(), "--workers", str(count)]
                servers[f"w{count}"] = ServerProcess(plain, cwd=ROOT, env=ours)
                if args.inline and count > 1:
                    inline = [*serve_argv(), "--workers", str(count), "--worker-models", "inline"]
                    servers[f"w{count}i"] = ServerProcess(inline, cwd=ROOT, env=ours)
            every = [*serve_argv(), "--workers", "2", "--engine-front-end", "false"]
            if args.every_hop:
                servers["w2h"] = ServerProcess(every, cwd=ROOT, env=ours)
            if args.baseline:
                baseline = os.path.abspath(args.baseline)
                env = checkout_env(baseline)
                servers["bw1"] = ServerProcess([*serve_argv(), "--workers", "1"], cwd=baseline, env=env)
                if args.every_hop:
                    servers["bw2h"] = ServerProcess(every, cwd=baseline, env=env)
            if args.triton:
                servers[TRITON] = Triton(args.triton)
            for name in ("json-h1", "grpc", "json-h2"):
                if name in args.only:
                    results[name] = load_rounds(name, servers, args, files)
            ours = {key: server for key, server in servers.items() if key != TRITON}
            results["memory"] = {key: resident_kib(server.pid) for key, server in ours.items()}
            if "batching" in args.only:
                results["batching"] = {key: batching(server, args, files) for key, server in ours.items()}
            if "binary" in args.only:
                largest = f"w{args.workers[-1]}"
                for key in [key for key in servers if key != largest]:
                    servers.pop(key).stop()  # the round trip alone on the cores
                before = memory_kib(servers[largest].pid)["VmRSS"]
                results["binary"] = [
                    served(servers[largest], args, files) for _ in range(args.binary_connections)
                ]
                kept = memory_kib(servers[largest].pid)["VmRSS"] - before
                results["binary_kept_x"] = kept * 1024 / len(files["binary"][1])
        finally:
            for server in servers.values():
                server.stop()
    save(report(results, args), results, args, "workers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
