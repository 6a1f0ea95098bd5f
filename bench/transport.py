"""python -m bench.transport: our transport beside the ceilings, driven by C load generators (issue 12).

Four servers run side by side on 127.0.0.1 (all up at once, so every round gives each the same moments):

    uvicorn-bare  uvicorn + httptools + uvloop answering fixed bytes (bench/bare_app.py)   HTTP/1.1 only
    ours-bare     our transport answering fixed bytes: our floor                           h1 + h2c
    ours          `python -m tensorgate.server serve` on the example repository (our transport)       h1 + h2c
    hypercorn     the same server with `--http-server hypercorn` (the reference)           h1 + h2c

Scenarios, each in `--rounds` rounds whose server order alternates (A B C D, D C B A, ...):
- json-h1: wrk -t1 -c16, POST /v2/models/simple/infer (JSON), `--duration` s per server per round.
- json-h2: h2load, 4 connections x 4 streams, the same request, a request count sized to the duration.
- binary-h1 / binary-h2: a 64 MiB FP32 tensor through identity_fp32 and back (binary tensor data): one
  round trip by curl checked byte for byte, then `--binary-trips` by h2load (`--h1` for HTTP/1.1), one
  at a time; GB/s counts the tensor both ways; the server's peak RSS growth over its RSS before, as a
  share of the payload.
- idle: `--idle` keep-alive connections opened to `ours` and left idle, then json-h1 again; its req/s
  beside the plain run's, and the RSS they cost.
Per server and scenario: req/s over the rounds and server CPU per request (from /proc).

    python -m bench.transport [--duration 4] [--rounds 3] [--only json-h1 json-h2 binary-h1 ...]
"""

import argparse
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import date

import numpy as np
import orjson

from bench.crosscheck import _lua_string
from bench.harness import JSON_BODY, JSON_PATH
from bench.procs import ServerProcess, checkout_env, cpu_clock, memory_kib, reset_peak_rss, serve_argv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ("json-h1", "json-h2", "binary-h1", "binary-h2", "idle")
BINARY_PATH = "/v2/models/identity_fp32/infer"
SERVE = serve_argv()
SERVERS = {
    "uvicorn-bare": [sys.executable, "-m", "bench.bare_app", "--server", "uvicorn"],
    "ours-bare": [sys.executable, "-m", "bench.bare_app", "--server", "tensorgate"],
    "ours": SERVE,
    "hypercorn": [*SERVE, "--http-server", "hypercorn"],
}
H2_SERVERS = ("ours-bare", "ours", "hypercorn")
BASELINE = "baseline"  # with --baseline DIR: our server from another checkout, in the same rounds
BINARY_SERVERS = ("ours", "hypercorn")
TARGETS = (  # (scenario, server, baseline or None, minimum): the targets
    ("json-h1", "ours", "uvicorn-bare", 0.5),
    ("json-h1", "ours", "hypercorn", 3.5),
    ("json-h2", "ours", "hypercorn", 4.0),
)
_WRK = re.compile(r"(\d+) requests in ([\d.]+)s")
_H2LOAD = re.compile(
    r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored"
)
_H2LOAD_TIME = re.compile(r"finished in ([\d.]+)(m?s)")


def wrk(
    port: int,
    script: str,
    seconds: float,
    connections: int = 16,
    threads: int = 1,
    path: str = JSON_PATH,
) -> tuple[int, float, str]:
    """wrk's run of `script` on `path`: (requests, seconds, a note when it saw errors)."""
    out = _run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "-s",
            script,
            f"http://127.0.0.1:{port}{path}",
        ],
        seconds + 30,
    )
    found = _WRK.search(out)
    note = "errors" if ("Non-2xx" in out or "Socket errors" in out) else ""
    return (int(found.group(1)), float(found.group(2)), note) if found else (0, 0.0, out[-200:])


def h2load(
    port: int, body_file: str, requests: int, clients: str = "-c4 -m4", path: str = JSON_PATH
) -> tuple[int, float, str]:
    out = _run(
        [
            "h2load",
            *clients.split(),
            f"-n{requests}",
            "-d",
            body_file,
            "-H",
            "content-type: application/json",
            f"http://127.0.0.1:{port}{path}",
        ],
        120,
    )
    done, took = _H2LOAD.search(out), _H2LOAD_TIME.search(out)
    if not done or not took:
        return 0, 0.0, out[-200:]
    seconds = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1)
    failed = int(done.group(2)) + int(done.group(3))
    return int(done.group(1)), seconds, f"{failed} failed" if failed else ""


def _run(argv: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{argv[0]} timed out"
    return proc.stdout + proc.stderr


def measure(server: ServerProcess, drive) -> dict:
    """Runs `drive()` -> (requests, seconds, note) and adds the server's CPU per request."""
    cpu = cpu_clock(server.pid)
    requests, seconds, note = drive()
    used = cpu_clock(server.pid) - cpu
    return {
        "requests": requests,
        "seconds": seconds,
        "rps": requests / seconds if seconds else 0.0,
        "cpu_us": 1e6 * used / requests if requests else float("nan"),
        "cores": used / seconds if seconds else 0.0,
        "note": note,
    }


def load_rounds(name: str, servers: dict[str, ServerProcess], order: list[str], args, files) -> dict:
    """`args.rounds` rounds of one load scenario over `order`, reversed every other round."""
    per_server: dict[str, list[dict]] = {key: [] for key in order}
    for round_no in range(args.rounds):
        for key in order if round_no % 2 == 0 else order[::-1]:
            port = servers[key].port
            if name == "json-h1":
                result = measure(servers[key], lambda p=port: wrk(p, files["lua"], args.duration))
            else:
                warm = h2load(port, files["json"], 2000)
                rate = warm[0] / warm[1] if warm[1] else 1000
                count = max(2000, int(rate * args.duration))
                result = measure(servers[key], lambda p=port, n=count: h2load(p, files["json"], n))
            per_server[key].append(result)
            print(
                f"  {name} round {round_no + 1} {key}: {result['rps']:.0f} req/s, {result['cpu_us']:.1f} us",
                file=sys.stderr,
            )
    return {key: summarize(rounds) for key, rounds in per_server.items()} | {"rounds": per_server}


def alternating_rounds(name: str, order: list[str], rounds: int, run: Callable[[str], dict]) -> dict:
    """`rounds` rounds of scenario `name`: `run(key)` for each key of `order`, the order reversed every
    other round; per key its summary, and every round's figures under "rounds"."""
    per_server: dict[str, list[dict]] = {key: [] for key in order}
    for round_no in range(rounds):
        for key in order if round_no % 2 == 0 else order[::-1]:
            result = run(key)
            per_server[key].append(result)
            print(
                f"  {name} round {round_no + 1} {key}: {result['rps']:.0f} req/s, "
                f"{result['cpu_us']:.1f} us, {result['cores']:.2f} cores {result['note']}",
                file=sys.stderr,
            )
    return {key: summarize(rounds) for key, rounds in per_server.items()} | {"rounds": per_server}


def summarize(rounds: list[dict]) -> dict:
    requests = sum(r["requests"] for r in rounds)
    seconds = sum(r["seconds"] for r in rounds)
    return {
        "rps": requests / seconds if seconds else 0.0,
        "cpu_us": statistics.median(r["cpu_us"] for r in rounds),
        "cores": statistics.median(r["cores"] for r in rounds),
        "notes": sorted({r["note"] for r in rounds if r["note"]}),
    }


def baseline_table(results: dict, scenarios: tuple[str, ...], cpu: str, args) -> list[str]:
    """With --baseline: our server's CPU per request against the other checkout's, round by round."""
    if not args.baseline:
        return []
    lines = [
        f"## CPU per request: ours / baseline (`{args.baseline}`)",
        "",
        "| scenario | ours | baseline | ratio (median of rounds) | per-round range |",
        "|---|---|---|---|---|",
    ]
    for name in scenarios:
        rounds = results.get(name, {}).get("rounds", {})
        if BASELINE not in rounds:
            continue
        ratios = [a[cpu] / b[cpu] for a, b in zip(rounds["ours"], rounds[BASELINE], strict=True) if b[cpu]]
        lines.append(
            f"| {name} | {results[name]['ours'][cpu]:.1f} µs | {results[name][BASELINE][cpu]:.1f} µs | "
            f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}-{max(ratios):.3f} |"
        )
    return [*lines, ""]


def ratio_per_round(rounds: dict, key: str, base: str) -> tuple[float, float, float]:
    """Median, min and max of the per-round req/s ratios key / base."""
    ratios = [a["rps"] / b["rps"] for a, b in zip(rounds[key], rounds[base], strict=True) if b["rps"]]
    return statistics.median(ratios), min(ratios), max(ratios)


def binary_body(mib: int, directory: str) -> tuple[str, bytes, int]:
    """The request body file (JSON header + raw FP32 0, 1, 2, ...), the raw bytes, the header length."""
    raw = np.arange(mib * (1 << 20) // 4, dtype="<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [len(raw) // 4],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    path = os.path.join(directory, "binary.bin")
    with open(path, "wb") as f:
        f.write(header + raw)
    return path, raw, len(header)


def curl_trip(port: int, body: str, header_length: int, http2: bool, out: str) -> tuple[float, int]:
    argv = [
        "curl",
        "-s",
        "-o",
        out,
        "-w",
        "%{http_code} %{time_total}",
        "--data-binary",
        f"@{body}",
        "-H",
        "Content-Type: application/octet-stream",
        "-H",
        f"Inference-Header-Content-Length: {header_length}",
        f"http://127.0.0.1:{port}{BINARY_PATH}",
    ]
    if http2:
        argv.insert(1, "--http2-prior-knowledge")
    code, seconds = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout.split()
    return float(seconds), int(code)


def binary(server: ServerProcess, http2: bool, args, files) -> dict:
    """One round trip by curl, its answer checked whole; then `args.binary_trips` timed by h2load (curl
    itself tops out near 1.2 GB/s here, below the servers), one connection, one request at a time."""
    body, raw, header_length = files["binary"]
    out = os.path.join(files["dir"], "answer.bin")
    _, code = curl_trip(server.port, body, header_length, http2, out)
    with open(out, "rb") as f:
        answer = f.read()
    if code != 200 or not answer.endswith(raw):
        return {"error": f"warm-up answer wrong (HTTP {code}, {len(answer)} bytes)"}
    rss_before = memory_kib(server.pid)["VmRSS"]
    reset_peak_rss(server.pid)
    cpu = cpu_clock(server.pid)
    argv = [
        "h2load",
        f"-n{args.binary_trips}",
        "-c1",
        "-m1",
        "-w30",
        "-W30",
        "-d",
        body,
        "-H",
        f"inference-header-content-length: {header_length}",
        "-H",
        "content-type: application/octet-stream",
        f"http://127.0.0.1:{server.port}{BINARY_PATH}",
    ]
    if not http2:
        argv.insert(1, "--h1")
    output = _run(argv, 300)
    done, took = _H2LOAD.search(output), _H2LOAD_TIME.search(output)
    client = "h2load"
    if done and took and int(done.group(1)) == args.binary_trips:
        seconds = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1)
    else:  # h2load cannot read hypercorn's HTTP/1.1 answer to this request: curl, slower, times it
        client = "curl"
        seconds = sum(
            curl_trip(server.port, body, header_length, http2, "/dev/null")[0]
            for _ in range(args.binary_trips)
        )
    peak = memory_kib(server.pid)["VmHWM"]
    return {
        "gb_s": 2 * len(raw) * args.binary_trips / seconds / 1e9,
        "cpu_s_per_trip": (cpu_clock(server.pid) - cpu) / args.binary_trips,
        "rss_growth_x": (peak - rss_before) * 1024 / len(raw),
        "mean_trip_s": seconds / args.binary_trips,
        "client": client,
    }


def idle(server: ServerProcess, args, files) -> dict:
    """json-h1 on `ours` with and without `args.idle` idle keep-alive connections held open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    plain = measure(server, lambda: wrk(server.port, files["lua"], args.duration))
    rss_before = memory_kib(server.pid)["VmRSS"]
    held = []
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: bench\r\n\r\n"
    try:
        for _ in range(args.idle):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(request)
            held.append(sock)
        for sock in held:  # each answered once: the server holds them as idle keep-alive connections
            sock.settimeout(10)
            if not sock.recv(4096).startswith(b"HTTP/1.1 200"):
                return {"error": "an idle connection's request was not answered"}
        rss_idle = memory_kib(server.pid)["VmRSS"]
        loaded = measure(server, lambda: wrk(server.port, files["lua"], args.duration))
        still_open = sum(1 for sock in held if _open(sock))
    finally:
        for sock in held:
            sock.close()
    return {
        "connections": len(held),
        "still_open": still_open,
        "rps_plain": plain["rps"],
        "rps_with_idle": loaded["rps"],
        "ratio": loaded["rps"] / plain["rps"] if plain["rps"] else 0.0,
        "rss_growth_mib": (rss_idle - rss_before) / 1024,
    }


def _open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def report(results: dict, args) -> str:
    lines = [
        f"# Transport bench, {date.today()} ({platform.node()}, {os.cpu_count()} cores)",
        "",
        f"wrk -t1 -c16 and h2load -c4 -m4, {args.duration:g} s per server per round, {args.rounds} rounds "
        "alternating; req/s over all rounds, server CPU per request the median of the rounds.",
        "",
    ]
    for name in ("json-h1", "json-h2"):
        if name not in results:
            continue
        lines += [
            f"## {name}",
            "",
            "| server | req/s | server CPU/request | server cores | notes |",
            "|---|---|---|---|---|",
        ]
        for key, value in results[name].items():
            if key != "rounds":
                lines.append(
                    f"| {key} | {value['rps']:,.0f} | {value['cpu_us']:.1f} µs | {value['cores']:.2f} | "
                    f"{', '.join(value['notes'])} |"
                )
        lines.append("")
    lines += baseline_table(results, ("json-h1", "json-h2"), "cpu_us", args)
    lines += [
        "## Targets",
        "",
        "| scenario | ratio | per-round range | target | met |",
        "|---|---|---|---|---|",
    ]
    for name, key, base, minimum in TARGETS:
        if name in results:
            mid, low, high = ratio_per_round(results[name]["rounds"], key, base)
            lines.append(
                f"| {name}: {key} / {base} | {mid:.2f}x | {low:.2f}-{high:.2f} | >= {minimum}x | "
                f"{'yes' if mid >= minimum else 'NO'} |"
            )
    for name, minimum in (("binary-h1", 2.5), ("binary-h2", 1.5)):
        for key, value in results.get(name, {}).items():
            if "error" in value:
                lines.append(f"| {name} {key} | {value['error']} | | | NO |")
                continue
            met = key != "ours" or (value["gb_s"] >= minimum and value["rss_growth_x"] <= 1.1)
            lines.append(
                f"| {name} {key}: GB/s, peak RSS growth | {value['gb_s']:.2f} GB/s, "
                f"{value['rss_growth_x']:.2f}x payload | "
                f"mean trip {value['mean_trip_s'] * 1000:.0f} ms ({value['client']}) | "
                f"{'>= ' + str(minimum) + ' GB/s, <= 1.1x' if key == 'ours' else 'reference'} | "
                f"{'yes' if met else 'NO'} |"
            )
    if "idle" in results:
        value = results["idle"]
        if "error" in value:
            lines.append(f"| idle | {value['error']} | | | NO |")
        else:
            met = (
                value["ratio"] >= 0.9
                and value["rss_growth_mib"] < 100
                and value["still_open"] == value["connections"]
            )
            lines.append(
                f"| idle: {value['connections']} keep-alive connections held "
                f"({value['still_open']} still open) | json-h1 {value['rps_with_idle']:,.0f} vs "
                f"{value['rps_plain']:,.0f} req/s ({value['ratio']:.2f}x), "
                f"RSS +{value['rss_growth_mib']:.0f} MiB | | >= 0.9x, < 100 MiB | {'yes' if met else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--binary-mib", type=int, default=64)
    parser.add_argument("--binary-trips", type=int, default=10)
    parser.add_argument("--idle", type=int, default=5000, help="idle keep-alive connections held")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--out", default="bench/results")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="a checkout of another commit: its server runs beside ours, same rounds",
    )
    args = parser.parse_args(argv)
    missing = [tool for tool in ("wrk", "h2load", "curl") if shutil.which(tool) is None]
    if missing:
        parser.error(f"needs {', '.join(missing)} (apt-get install wrk nghttp2-client curl)")
    results: dict = {}
    with tempfile.TemporaryDirectory() as directory:
        files = json_files(directory)
        if any(name.startswith("binary") for name in args.only):
            files["binary"] = binary_body(args.binary_mib, directory)
        commands = SERVERS | ({BASELINE: SERVE} if args.baseline else {})
        servers = {
            key: ServerProcess(
                command,
                cwd=args.baseline if key == BASELINE else ROOT,
                env=checkout_env(args.baseline) if key == BASELINE else None,
            )
            for key, command in commands.items()
        }
        try:
            if "json-h1" in args.only:
                results["json-h1"] = load_rounds("json-h1", servers, list(commands), args, files)
            if "json-h2" in args.only:
                order = [*H2_SERVERS, *([BASELINE] if args.baseline else [])]
                results["json-h2"] = load_rounds("json-h2", servers, order, args, files)
            for name in ("binary-h1", "binary-h2"):
                if name in args.only:
                    results[name] = {
                        key: binary(servers[key], name.endswith("h2"), args, files) for key in BINARY_SERVERS
                    }
            if "idle" in args.only:
                for key in ("uvicorn-bare", "ours-bare", "hypercorn", BASELINE):  # only ours shares the cores
                    if key in servers:
                        servers.pop(key).stop()
                results["idle"] = idle(servers["ours"], args, files)
        finally:
            for server in servers.values():
                server.stop()
    save(report(results, args), results, args, "transport")
    return 0


def json_files(directory: str) -> dict[str, str]:
    """The `simple` JSON request in `directory`: as a body file (h2load) and a wrk script."""
    files = {
        "dir": directory,
        "json": os.path.join(directory, "body.json"),
        "lua": os.path.join(directory, "post.lua"),
    }
    with open(files["json"], "wb") as f:
        f.write(JSON_BODY)
    with open(files["lua"], "w") as f:
        f.write(
            f'wrk.method = "POST"\nwrk.body = {_lua_string(JSON_BODY)}\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
    return files


def save(text: str, results: dict, args: argparse.Namespace, kind: str) -> None:
    """Prints the report and writes it to `<args.out>/<date>-<kind>.md`, the numbers beside it (.json)."""
    sys.stdout.write(text)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{date.today()}-{kind}")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1, default=str)
    print(f"results: {base}.md, {base}.json", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
