"""python -m bench.grpc_bench: our gRPC beside the bare grpclib echo, driven by C or lean clients (issue 13).

Two servers run side by side on 127.0.0.1:

    grpclib-echo  bench/grpc_echo.py: grpclib's server answering ModelInfer / ModelStreamInfer with fixed
                  bytes, parsing nothing (the ceiling of a grpclib server)
    ours          `python -m tensorgate.server serve` on the example repository, on its gRPC port (and, for
                  `unary-http-port`, on its HTTP port: one port for everything)

Scenarios, each in `--rounds` rounds whose server order alternates:
- unary: h2load -c4 -m4 (16 calls in flight), ModelInfer on `simple` (raw contents), gRPC framing.
- unary-http-port: the same on our HTTP port (no target: one port for everything costs nothing).
- stream: h2load -c4 -m4 with gRPC framing, ModelStreamInfer on `simple`, each of the 16 streams in
  flight sending 32 requests without waiting (as tritonclient's async_stream_infer streams); messages/s.
- stream-pingpong: 4 connections x 4 streams, each sending its next request only when the answer to the
  last has come (bench/grpc_pingpong.py; h2load cannot). No target: a syscall and a wake-up a message
  on both sides weigh more here than what the servers do.
- binary: a 64 MiB FP32 tensor through `identity_fp32` and back as raw contents, h2load -c1 -m1
  `--binary-trips` times after one round trip by grpcio checked byte for byte; GB/s counts the tensor
  both ways, RSS growth is the peak over the RSS before, as a share of the payload.
h2load counts HTTP 200s; a gRPC error is in the trailers. So every run on ours is checked against the
server's own counters: the model's success count grows by the calls answered, its failure count stays.

    python -m bench.grpc_bench [--duration 4] [--rounds 3] [--only unary stream ...]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import date

import grpc
import httpx
import numpy as np

import tensorgate.proto.inference as pb
from bench.grpc_load import INFER_PATH, STREAM_PATH, infer_request
from bench.procs import ServerProcess, checkout_env, cpu_clock, memory_kib, reset_peak_rss, serve_argv
from bench.transport import _H2LOAD, _H2LOAD_TIME, BASELINE, _run, baseline_table, save

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ("unary", "unary-http-port", "stream", "stream-pingpong", "binary")
SERVERS = {
    "grpclib-echo": [sys.executable, "-m", "bench.grpc_echo"],
    "ours": serve_argv(),
}
TARGETS = (("unary", 2.5), ("stream", 1.5))  # ours / grpclib-echo
BINARY_TARGET = (1.5, 1.5)  # GB/s at least, peak RSS growth at most (x payload)
PIPELINED = 32


def grpc_body(messages: list[bytes]) -> bytes:
    return b"".join(b"\x00" + len(m).to_bytes(4, "big") + m for m in messages)


def h2load(
    port: int, path: str, body_file: str, requests: int, clients: str = "-c4 -m4"
) -> tuple[int, float, str]:
    out = _run(
        [
            "h2load",
            *clients.split(),
            "-w30",
            "-W30",
            f"-n{requests}",
            "-d",
            body_file,
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            f"http://127.0.0.1:{port}{path}",
        ],
        300,
    )
    done, took = _H2LOAD.search(out), _H2LOAD_TIME.search(out)
    if not done or not took:
        return 0, 0.0, out[-200:]
    seconds = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1)
    failed = int(done.group(2)) + int(done.group(3))
    return int(done.group(1)), seconds, f"{failed} failed" if failed else ""


def counters(server: ServerProcess, model: str) -> tuple[float, float]:
    """The model's (success, failure) request counts, from the metrics port."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        for kind in ("success", "failure"):
            if line.startswith(f'nv_inference_request_{kind}{{model="{model}"'):
                found[kind] = float(line.split()[-1])
    return found.get("success", 0.0), found.get("failure", 0.0)


def run_one(name: str, key: str, server: ServerProcess, args, files) -> dict:
    """One round of a load scenario on one server: messages answered, seconds, server CPU."""
    port = server.port if name == "unary-http-port" else server.grpc_port
    before = counters(server, "simple") if key != "grpclib-echo" else None
    cpu = cpu_clock(server.pid)
    client_cpu = None
    if name in ("unary", "unary-http-port"):
        warm = h2load(port, INFER_PATH, files["unary"], 2000)
        count = max(2000, int(warm[0] / warm[1] * args.duration)) if warm[1] else 2000
        cpu = cpu_clock(server.pid)
        answered, seconds, note = h2load(port, INFER_PATH, files["unary"], count)
    elif name == "stream":
        count = max(100, int(args.duration * 1000))
        cpu = cpu_clock(server.pid)
        streams, seconds, note = h2load(port, STREAM_PATH, files["pipelined"], count)
        answered = streams * PIPELINED
    else:  # stream-pingpong: the driver in its own process (its CPU reported beside the server's)
        out = subprocess.run(
            [sys.executable, "-m", "bench.grpc_pingpong", str(port), "--seconds", str(args.duration)]
            + ["--warmup", "0"],
            capture_output=True,
            text=True,
            timeout=args.duration + 60,
            cwd=ROOT,
        )
        result = json.loads(out.stdout)
        answered, seconds, client_cpu = result["messages"], result["seconds"], result["client_cpu_seconds"]
        note = f"{result['errors']} errors" if result["errors"] else ""
    used = cpu_clock(server.pid) - cpu
    if before is not None:  # every answer an answer, not an error in trailers
        success, failure = counters(server, "simple")
        if failure != before[1] or success - before[0] < answered:
            note += f" server counted {success - before[0]:.0f} answered, {failure - before[1]:.0f} failed"
    return {
        "messages": answered,
        "seconds": seconds,
        "rate": answered / seconds if seconds else 0.0,
        "cpu_us": 1e6 * used / answered if answered else float("nan"),
        "client_cpu_us": 1e6 * client_cpu / answered if client_cpu and answered else None,
        "note": note.strip(),
    }


def load_rounds(name: str, servers: dict[str, ServerProcess], args, files) -> dict:
    order = [key for key in servers if key != "grpclib-echo"] if name == "unary-http-port" else list(servers)
    rounds: dict[str, list[dict]] = {key: [] for key in order}
    for round_no in range(args.rounds):
        for key in order if round_no % 2 == 0 else order[::-1]:
            result = run_one(name, key, servers[key], args, files)
            rounds[key].append(result)
            print(
                f"  {name} round {round_no + 1} {key}: {result['rate']:.0f}/s, {result['cpu_us']:.1f} us",
                file=sys.stderr,
            )
    summary = {}
    for key, results in rounds.items():
        messages = sum(r["messages"] for r in results)
        seconds = sum(r["seconds"] for r in results)
        client = [r["client_cpu_us"] for r in results if r["client_cpu_us"]]
        summary[key] = {
            "rate": messages / seconds if seconds else 0.0,
            "cpu_us": statistics.median(r["cpu_us"] for r in results),
            "client_cpu_us": statistics.median(client) if client else None,
            "notes": sorted({r["note"] for r in results if r["note"]}),
        }
    return summary | {"rounds": rounds}


def binary(server: ServerProcess, args, files) -> dict:
    raw = np.arange(args.binary_mib * (1 << 20) // 4, dtype="<f4").tobytes()
    request = pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[pb.ModelInferRequestInferInputTensor("INPUT0", "FP32", [len(raw) // 4])],
        raw_input_contents=[raw],
    )
    body = bytes(request)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        infer = channel.unary_unary(
            INFER_PATH, request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
        )
        answer = infer(body, timeout=120)
    if bytes(answer.raw_output_contents[0]) != raw:
        return {"error": "the round trip by grpcio came back different"}
    path = os.path.join(files["dir"], "binary.grpc")
    with open(path, "wb") as f:
        f.write(grpc_body([body]))
    del answer, body, request
    rss_before = memory_kib(server.pid)["VmRSS"]
    reset_peak_rss(server.pid)
    cpu = cpu_clock(server.pid)
    done, seconds, note = h2load(server.grpc_port, INFER_PATH, path, args.binary_trips, "-c1 -m1")
    if done != args.binary_trips:
        return {"error": f"h2load answered {done} of {args.binary_trips}: {note}"}
    peak = memory_kib(server.pid)["VmHWM"]
    return {
        "gb_s": 2 * len(raw) * args.binary_trips / seconds / 1e9,
        "cpu_s_per_trip": (cpu_clock(server.pid) - cpu) / args.binary_trips,
        "rss_growth_x": (peak - rss_before) * 1024 / len(raw),
        "mean_trip_s": seconds / args.binary_trips,
    }


def report(results: dict, args) -> str:
    lines = [
        f"# gRPC bench, {date.today()} ({platform.node()}, {os.cpu_count()} cores)",
        "",
        f"{args.duration:g} s per server per round, {args.rounds} rounds alternating; rates over all rounds, "
        f"server CPU per message the median of the rounds. unary: h2load -c4 -m4; stream: h2load -c4 -m4, "
        f"{PIPELINED} requests a stream; stream-pingpong: 16 streams each waiting for an answer before its "
        "next request (bench/grpc_pingpong.py).",
        "",
        "| scenario | server | messages/s | server CPU/message | client CPU/message | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name in SCENARIOS[:-1]:
        for key, value in results.get(name, {}).items():
            if key != "rounds":
                client = f"{value['client_cpu_us']:.1f} µs" if value["client_cpu_us"] else "h2load"
                lines.append(
                    f"| {name} | {key} | {value['rate']:,.0f} | {value['cpu_us']:.1f} µs | {client} | "
                    f"{', '.join(value['notes'])} |"
                )
    lines += ["", *baseline_table(results, SCENARIOS[:-1], "cpu_us", args)]
    lines += [
        "## Targets",
        "",
        "| scenario | ratio | per-round range | target | met |",
        "|---|---|---|---|---|",
    ]
    for name, minimum in TARGETS:
        if name in results:
            ratios = [
                a["rate"] / b["rate"]
                for a, b in zip(
                    results[name]["rounds"]["ours"], results[name]["rounds"]["grpclib-echo"], strict=True
                )
                if b["rate"]
            ]
            mid = statistics.median(ratios)
            lines.append(
                f"| {name}: ours / grpclib-echo | {mid:.2f}x | {min(ratios):.2f}-{max(ratios):.2f} | "
                f">= {minimum}x | {'yes' if mid >= minimum else 'NO'} |"
            )
    if "binary" in results:
        value = results["binary"]
        if "error" in value:
            lines.append(f"| binary | {value['error']} | | | NO |")
        else:
            gb_s, rss = BINARY_TARGET
            met = value["gb_s"] >= gb_s and value["rss_growth_x"] <= rss
            lines.append(
                f"| binary {args.binary_mib} MiB FP32 round trip: GB/s, peak RSS growth | "
                f"{value['gb_s']:.2f} GB/s, {value['rss_growth_x']:.2f}x payload | "
                f"mean trip {value['mean_trip_s'] * 1000:.0f} ms, "
                f"{value['cpu_s_per_trip'] * 1000:.0f} ms CPU | "
                f">= {gb_s} GB/s, <= {rss}x | {'yes' if met else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--binary-mib", type=int, default=64)
    parser.add_argument("--binary-trips", type=int, default=10)
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--out", default="bench/results")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="a checkout of another commit: its server runs beside ours, same rounds",
    )
    args = parser.parse_args(argv)
    if shutil.which("h2load") is None:
        parser.error("needs h2load (apt-get install nghttp2-client)")
    results: dict = {}
    with tempfile.TemporaryDirectory() as directory:
        request = bytes(infer_request())
        files = {
            "dir": directory,
            "unary": os.path.join(directory, "unary"),
            "pipelined": os.path.join(directory, "pipe"),
        }
        with open(files["unary"], "wb") as f:
            f.write(grpc_body([request]))
        with open(files["pipelined"], "wb") as f:
            f.write(grpc_body([request] * PIPELINED))
        commands = SERVERS | ({BASELINE: SERVERS["ours"]} if args.baseline else {})
        servers = {
            key: ServerProcess(
                command,
                cwd=args.baseline if key == BASELINE else ROOT,
                env=checkout_env(args.baseline) if key == BASELINE else None,
                listens="gRPC" if key == "grpclib-echo" else "HTTP",
            )
            for key, command in commands.items()
        }
        try:
            for name in SCENARIOS[:-1]:
                if name in args.only:
                    results[name] = load_rounds(name, servers, args, files)
            if "binary" in args.only:
                for key in ("grpclib-echo", BASELINE):
                    if key in servers:
                        servers.pop(key).stop()
                results["binary"] = binary(servers["ours"], args, files)
        finally:
            for server in servers.values():
                server.stop()
    save(report(results, args), results, args, "grpc")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
