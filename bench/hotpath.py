"""python -m bench.hotpath: server CPU per request on `simple`, the table of issue 37, side by side.

Servers, all up at once on 127.0.0.1, in rounds whose order alternates (A B C, C B A, ...):

    ours          `tensorgate serve` from this checkout (compiled where it is built; `--pure` runs it
                  with TENSORGATE_PURE_PYTHON=1 beside the compiled one, as `pure`)
    baseline      with `--baseline DIR`: the same from another checkout, as its tree is (a worktree without
                  `make compile` runs its .py files)
    triton        with `--triton KIT`: Triton 2.51 on its C++ backend (../shared/triton; setup.sh first)
    uvicorn-bare  with `--uvicorn`: uvicorn + httptools + uvloop answering fixed bytes (json-h1 only)
    ours-bare     with `--floor`: our own transport answering fixed bytes (bench.bare_app; gRPC's
                  requests too, over h2c, as a plain HTTP/2 answer without trailers): the floor under
                  every scenario, and how much of each goal the transport alone leaves to the rest

Scenarios (each a C load generator: a Python client costs as much CPU a request as the server):
- json-h1:   wrk -t1 -c16, POST /v2/models/simple/infer, the v2 JSON body;
- binary-h1: wrk -t1 -c16, the same inputs as binary tensor data (Inference-Header-Content-Length),
             the outputs asked for as binary data;
- grpc:      h2load -c8 -m4, ModelInfer with raw_input_contents;
- json-h2:   h2load -c8 -m4, the JSON body over h2c (Triton has no h2c: not driven there).

Features, each beside the baseline (`--features`; issue 37: none may get slower), wrk -t1 over HTTP/1.1:
- mlp:        the dynamic-batching MLP (pytorch), one binary FP32 row a request, 64 connections;
- ensemble:   the `classifier` ensemble (python -> onnxruntime -> python), v2 JSON, 8 connections;
- tfserving:  TF Serving's `:predict` on half_plus_two, 16 connections;
- grps:       grps' /grps/v1/infer/predict on `simple` (gtensors), 16 connections;
- binary-64mib: a 64 MiB FP32 tensor through identity_fp32 and back (bench.transport's `binary`: h2load
              --h1, `--binary-trips` one after the other): GB/s both ways, server CPU a trip.

Per server and scenario: requests/s over all rounds, and server CPU per request (every process of the
server, from /proc) as the median of the rounds; ratios are medians of the per-round ratios.

    python -m bench.hotpath [--baseline DIR] [--triton ../shared/triton] [--uvicorn] [--pure] [--floor]
"""

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import timeit
from collections.abc import Iterator

import numpy as np
import orjson

from bench.crosscheck import _lua_string
from bench.ensemble import BODIES as ENSEMBLE_BODIES
from bench.grpc_bench import grpc_body
from bench.grpc_load import infer_request as grpc_request
from bench.harness import HPT_TF_BODY, HPT_TF_PATH, JSON_BODY, JSON_PATH
from bench.procs import ServerProcess, checkout_env, serve_argv
from bench.soak import grps_tensors
from bench.transport import alternating_rounds, binary, measure, save, wrk
from bench.transport import binary_body as large_binary_body
from bench.workers import TRITON, Triton, prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ("json-h1", "binary-h1", "grpc", "json-h2")
FEATURES = ("mlp", "ensemble", "tfserving", "grps", "binary-64mib")
BASELINE, PURE, UVICORN, FLOOR = "baseline", "pure", "uvicorn-bare", "ours-bare"
TRITON_CPU_GOAL, UVICORN_RPS_GOAL = 0.65, 0.95  # issue 37: CPU <= 0.65x Triton's; req/s >= 0.95x uvicorn's
GOALS_US = {"json-h1": 26.0, "binary-h1": 26.0, "grpc": 30.0, "json-h2": 32.0}  # at most, µs a request


def binary_body() -> tuple[bytes, int]:
    """The `simple` request as binary tensor data: (body, its JSON header's length)."""
    inputs = [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
        for name in ("INPUT0", "INPUT1")
    ]
    header = orjson.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}})
    raw = b"".join(int(i).to_bytes(4, "little") for i in range(16)) + (1).to_bytes(4, "little") * 16
    return header + raw, len(header)


def mlp_body() -> tuple[bytes, int]:
    """One FP32 row for the MLP as binary data, its output asked for as binary: (body, header length)."""
    row = np.random.default_rng(0).standard_normal((1, 64), dtype=np.float32).tobytes()
    inputs = [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "parameters": {"binary_data_size": 256}}
    ]
    header = orjson.dumps(
        {"inputs": inputs, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    )
    return header + row, len(header)


def wrk_scenarios() -> dict[str, tuple[str, bytes, dict[str, str], int]]:
    """The scenarios wrk drives: name -> (path, body, headers, connections)."""
    json_headers = {"Content-Type": "application/json"}
    body, header_length = binary_body()
    mlp, mlp_header = mlp_body()
    ensemble = orjson.dumps({"inputs": [ENSEMBLE_BODIES["classifier"]]})
    return {
        "json-h1": (JSON_PATH, JSON_BODY, json_headers, 16),
        "binary-h1": (JSON_PATH, body, {"Content-Type": "application/octet-stream",
                                        "Inference-Header-Content-Length": str(header_length)}, 16),
        "mlp": ("/v2/models/mlp/infer", mlp, {"Inference-Header-Content-Length": str(mlp_header)}, 64),
        "ensemble": ("/v2/models/classifier/infer", ensemble, json_headers, 8),
        "tfserving": (HPT_TF_PATH, HPT_TF_BODY, json_headers, 16),
        "grps": ("/grps/v1/infer/predict", orjson.dumps(grps_tensors()), json_headers, 16),
    }  # fmt: skip


WRK = wrk_scenarios()


def write_files(directory: str) -> dict:
    files: dict = {"dir": directory, "json": os.path.join(directory, "body.json"),
                   "grpc": os.path.join(directory, "grpc")}  # fmt: skip
    with open(files["json"], "wb") as f:
        f.write(JSON_BODY)
    with open(files["grpc"], "wb") as f:
        f.write(grpc_body([bytes(grpc_request())]))
    for name, (_, body, headers, _) in WRK.items():
        files[name] = os.path.join(directory, f"{name}.lua")
        with open(files[name], "w") as f:
            f.write(f'wrk.method = "POST"\nwrk.body = {_lua_string(body)}\n')
            f.writelines(f'wrk.headers["{key}"] = "{value}"\n' for key, value in headers.items())
    return files


def drive(name: str, server, args, files):
    """The timed run of scenario `name` on `server`, after an untimed warm-up (json-h2 and grpc: as
    bench.workers drives them)."""
    if name not in WRK:
        return prepare(name, server, args, files)
    path, _, _, connections = WRK[name]
    wrk(server.port, files[name], 1, connections, path=path)
    return lambda: wrk(server.port, files[name], args.duration, connections, path=path)


def binary_trips(server, args, files) -> dict:
    """bench.transport's 64 MiB round trips in `measure`'s terms: a request is a trip (its own CPU clock
    starts after the checked warm-up trip)."""
    result = binary(server, False, args, files)
    if "error" in result:
        return {"requests": 0, "seconds": 0.0, "rps": 0.0, "cpu_us": float("nan"), "cores": 0.0,
                "note": result["error"]}  # fmt: skip
    seconds = result["mean_trip_s"] * args.binary_trips
    cpu = result["cpu_s_per_trip"]
    return {"requests": args.binary_trips, "seconds": seconds, "rps": args.binary_trips / seconds,
            "cpu_us": 1e6 * cpu, "cores": cpu * args.binary_trips / seconds,
            "note": f"{result['gb_s']:.2f} GB/s"}  # fmt: skip


def drives(name: str, key: str) -> bool:
    if key == UVICORN:
        return name == "json-h1"  # it answers fixed bytes to any request: the HTTP/1.1 ceiling
    if key == TRITON:
        return name in ("json-h1", "binary-h1", "grpc")  # the models of its kit
    if key == FLOOR:
        return name in SCENARIOS
    return True


def load_rounds(name: str, servers: dict, args, files) -> dict:
    def run(key: str) -> dict:
        if name == "binary-64mib":
            return binary_trips(servers[key], args, files)
        return measure(servers[key], drive(name, servers[key], args, files))

    return alternating_rounds(name, [key for key in servers if drives(name, key)], args.rounds, run)


def ratio(rounds: dict, key: str, other: str, field: str) -> float | None:
    """The median over rounds of `key`'s figure / `other`'s."""
    if key not in rounds or other not in rounds:
        return None
    pairs = zip(rounds[key], rounds[other], strict=True)
    return statistics.median(a[field] / b[field] for a, b in pairs if b[field])


def report(results: dict, args) -> str:
    servers = [
        key
        for key in ("ours", PURE, BASELINE, TRITON, UVICORN, FLOOR)
        if any(key in r for r in results.values())
    ]
    lines = [
        f"# The hot path, server CPU per request on `simple` ({args.machine})\n",
        f"`python -m bench.hotpath {' '.join(args.argv)}`: {args.rounds} alternating rounds of "
        f"{args.duration:g} s; CPU per request is every process of the server, the median of the rounds.\n",
        "| scenario | " + " | ".join(f"{key} req/s | {key} µs/req" for key in servers) + " |",
        "|---|" + "---|---|" * len(servers),
    ]
    for name, result in results.items():
        cells = []
        for key in servers:
            r = result.get(key)
            cells += [f"{r['rps']:,.0f}", f"{r['cpu_us']:.1f}"] if r else ["-", "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [f"{name} {key}: {', '.join(r['notes'])}" for name, result in results.items()
             for key, r in result.items() if key != "rounds" and r["notes"]]  # fmt: skip
    if notes:  # wrk's non-2xx answers and socket errors, h2load's failures, the binary trips' GB/s
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    lines += ["", "Ratios (medians of the per-round ratios):", ""]
    lines += ["| scenario | against | CPU/req ours / theirs | req/s ours / theirs |", "|---|---|---|---|"]
    for name, result in results.items():
        for other in (PURE, BASELINE, TRITON, UVICORN):
            cpu = ratio(result["rounds"], "ours", other, "cpu_us")
            rps = ratio(result["rounds"], "ours", other, "rps")
            if cpu is not None:
                lines.append(f"| {name} | {other} | {cpu:.3f}x | {rps:.3f}x |")
    lines += ["", "Goals of issue 37:", "", "| goal | measured | met |", "|---|---|---|"]
    for name, goal in GOALS_US.items():
        if name in results:
            cpu = results[name]["ours"]["cpu_us"]
            lines.append(f"| {name} <= {goal:g} µs/req | {cpu:.1f} | {'yes' if cpu <= goal else 'no'} |")
    for name in ("json-h1", "binary-h1", "grpc"):
        rounds = results.get(name, {}).get("rounds", {})
        cpu, rps = ratio(rounds, "ours", TRITON, "cpu_us"), ratio(rounds, "ours", TRITON, "rps")
        if cpu is not None:
            met = cpu <= 0.65 and rps >= 1.0
            lines.append(
                f"| {name} against Triton: CPU <= 0.65x, req/s >= 1.0x | {cpu:.2f}x, {rps:.2f}x | "
                f"{'yes' if met else 'no'} |"
            )
    rps = ratio(results.get("json-h1", {}).get("rounds", {}), "ours", UVICORN, "rps")
    if rps is not None:
        met = "yes" if rps >= 0.95 else "no"
        lines.append(f"| json-h1 req/s against a bare uvicorn app >= 0.95x | {rps:.2f}x | {met} |")
    if any(FLOOR in result for result in results.values()):
        lines += floor_report(results)
    return "\n".join(lines) + "\n"


def floor_report(results: dict) -> list[str]:
    """What the goals leave above our transport's own floor (fixed bytes, no routing, no inference), and
    what the C calls of a `simple` JSON request cost in one process (`c_floor_us`)."""
    lines = ["", "The floor: our transport answering fixed bytes (ours-bare), in the same rounds:", "",
             "| scenario | ours µs/req | ours-bare µs/req | ours - ours-bare | CPU goal µs/req | "
             "goal - ours-bare | ours-bare req/s | req/s goal |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in SCENARIOS:
        result = results.get(name, {})
        if FLOOR not in result:
            continue
        ours, bare = result["ours"], result[FLOOR]
        cpu_goal, rps_goal = GOALS_US[name], None
        if TRITON in result:
            cpu_goal = min(cpu_goal, TRITON_CPU_GOAL * result[TRITON]["cpu_us"])
            rps_goal = result[TRITON]["rps"]
        if UVICORN in result:
            rps_goal = max(rps_goal or 0.0, UVICORN_RPS_GOAL * result[UVICORN]["rps"])
        above = ours["cpu_us"] - bare["cpu_us"]
        lines.append(
            f"| {name} | {ours['cpu_us']:.1f} | {bare['cpu_us']:.1f} | {above:.1f} | {cpu_goal:.1f} | "
            f"{cpu_goal - bare['cpu_us']:.1f} | {bare['rps']:,.0f} | "
            + (f"{rps_goal:,.0f}" if rps_goal else "-")
            + " |"
        )
    lines += ["", "The C calls of a `simple` JSON request, in one process (orjson parse, two arrays, add "
              f"and subtract, two lists, orjson dump): {c_floor_us():.2f} µs."]  # fmt: skip
    return lines


def c_floor_us(calls: int = 100_000) -> float:
    """µs a call of what a `simple` JSON request cannot do without, whatever the server: the body parsed,
    the two input arrays made, the model's two ufuncs, the outputs as lists, the answer's JSON."""

    def infer() -> bytes:
        inputs = orjson.loads(JSON_BODY)["inputs"]
        a = np.array(inputs[0]["data"], dtype=np.int32).reshape(1, 16)
        b = np.array(inputs[1]["data"], dtype=np.int32).reshape(1, 16)
        outputs = [("OUTPUT0", a + b), ("OUTPUT1", a - b)]
        return orjson.dumps({"model_name": "simple", "model_version": "1", "outputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "data": out.ravel().tolist()}
            for name, out in outputs]})  # fmt: skip

    return min(timeit.repeat(infer, number=calls, repeat=3)) / calls * 1e6


@contextlib.contextmanager
def servers_beside(args: argparse.Namespace) -> Iterator[dict]:
    """Our server, and beside it those `args` ask for (pure, baseline, triton, uvicorn); all stopped after."""
    servers: dict = {}
    try:
        servers["ours"] = ServerProcess(serve_argv(), cwd=ROOT)
        if args.pure:
            servers[PURE] = ServerProcess(
                serve_argv(), cwd=ROOT, env={**os.environ, "TENSORGATE_PURE_PYTHON": "1"}
            )
        if args.baseline:
            baseline = os.path.abspath(args.baseline)
            servers[BASELINE] = ServerProcess(serve_argv(), cwd=baseline, env=checkout_env(baseline))
        if args.triton:
            servers[TRITON] = Triton(args.triton)
        if args.uvicorn:
            servers[UVICORN] = ServerProcess(
                [sys.executable, "-m", "bench.bare_app", "--server", "uvicorn"], cwd=ROOT
            )
        if args.floor:
            bare = servers[FLOOR] = ServerProcess(
                [sys.executable, "-m", "bench.bare_app", "--server", "tensorgate"], cwd=ROOT
            )
            bare.grpc_port = bare.port  # h2c on the one port
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=SCENARIOS + FEATURES, default=list(SCENARIOS))
    parser.add_argument("--features", action="store_true", help="also every feature scenario")
    parser.add_argument("--binary-mib", type=int, default=64)
    parser.add_argument("--binary-trips", type=int, default=10)
    parser.add_argument("--baseline", help="another checkout, as its tree is built: its server beside ours")
    parser.add_argument("--triton", help="the Triton kit (../shared/triton), set up with its setup.sh")
    parser.add_argument("--uvicorn", action="store_true", help="a bare uvicorn app beside (json-h1)")
    parser.add_argument("--pure", action="store_true", help="this checkout in pure Python beside")
    parser.add_argument("--floor", action="store_true", help="our transport answering fixed bytes beside")
    parser.add_argument("--machine", default="vm, 2 cores", help="what the report names the machine")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", default="hotpath", help="the results file: <date>-<name>.md")
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    if shutil.which("wrk") is None or shutil.which("h2load") is None:
        parser.error("needs wrk and h2load (apt-get install wrk nghttp2-client)")
    if args.features:
        args.only = [*args.only, *(name for name in FEATURES if name not in args.only)]
    results: dict = {}
    with tempfile.TemporaryDirectory() as directory, servers_beside(args) as servers:
        files = write_files(directory)
        if "binary-64mib" in args.only:
            files["binary"] = large_binary_body(args.binary_mib, directory)
        for name in args.only:
            results[name] = load_rounds(name, servers, args, files)
    save(report(results, args), results, args, args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
