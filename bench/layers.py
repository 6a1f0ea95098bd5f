"""python -m bench.layers: where a request's server CPU goes, layer by layer (issue 37's breakdown).

Runs the server (this checkout; `--pure`: also with TENSORGATE_PURE_PYTHON=1; `--baseline DIR`: also
another checkout's, as its tree is built), drives each scenario of bench.hotpath with its C load
generator, and samples the server meanwhile with `py-spy record --native` (native frames included,
so the event loop, the parsers in C, numpy and the socket calls are seen; py-spy names a Cython-compiled
function by its .py line). Each sample is given to the first layer that a frame names, looking from
the innermost frame outwards:

    transport   the event loop, socket reads, and what is not named below
    parse       HTTP/1.1 (httptools' callbacks), HTTP/2 frames and HPACK in, gRPC message framing
    route       the router, the endpoints, the gRPC service, the repository's lookup
    decode      codec/: body or message -> InferRequest
    model       the model version's checks, the scheduler, the statistics, the model itself
    encode      codec/: InferResponse -> body or message
    write       the answer's head, frames and the socket write

µs per request is each layer's share of the samples times the server's CPU per request in the same run
(py-spy's sampling slows the server a little: the shares are the finding, the µs their scale).

    python -m bench.layers [--only json-h1 grpc] [--seconds 8] [--pure] [--baseline DIR]
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

from bench.hotpath import ROOT, SCENARIOS, drive, servers_beside, write_files
from bench.procs import ServerProcess
from bench.transport import measure, save

LAYERS = ("transport", "parse", "route", "decode", "model", "encode", "write")
# the functions of the transport's files that write an answer (h1.py, h2.py, connection.py)
WRITE_FUNCTIONS = frozenset(
    ("_flush", "_send", "_write", "_head", "_wrote_whole", "_answer", "_write_stream", "_drained",
     "send_headers", "answer_now", "send_now", "flush", "_block_frames")
)  # fmt: skip
# (a path fragment of the frame, its layer); for codec/ the function's name decides between the two ways
FILES = (
    ("server/http/connection.py", "transport"),
    ("server/http/h1.py", "parse"),
    ("server/http/h2", "parse"),
    ("server/http/hpack_decode.py", "parse"),
    ("server/http/hpack_encode.py", "write"),
    ("server/http/grpc_wire.py", "parse"),
    ("server/http/grpc_call.py", "route"),
    ("server/http/eager.py", "route"),
    ("server/router.py", "route"),
    ("server/endpoints/", "route"),
    ("server/grpc/", "route"),
    ("server/repository.py", "route"),
    ("server/model.py", "model"),
    ("server/backends/", "model"),
    ("batcher/", "model"),
    ("model_repository/", "model"),
    ("codec/", "codec"),
    ("parser.c", "parse"),  # httptools
    ("llhttp", "parse"),
)
C_HELPERS = ("__Pyx", "__pyx", "Py", "_Py")
SKIPPED = ("codec/tensor.py", "codec/datatypes.py", "codec/errors.py")  # helpers: their caller decides


def compiled_module(mangled: str) -> str:
    """The file of a Cython function from its C name: `__pyx_gb_6server_4http_2h1_12H1Connection_...` ->
    `server/http/h1.py` (the module's parts, each after its length, as far as they name folders of ours
    and then a .py file; "" when they do not)."""
    rest, path = mangled.split("_", 4)[-1], ""
    while found := re.match(r"(\d+)", rest):
        digits, size = found.group(1), int(found.group(1))
        name, rest = rest[len(digits) : len(digits) + size], rest[len(digits) + size + 1 :]
        path = f"{path}/{name}" if path else name
        if os.path.isfile(os.path.join(ROOT, path + ".py")):
            return path + ".py"
        if not os.path.isdir(os.path.join(ROOT, path)):
            return ""
    return ""


def layer_of(frame: str) -> str | None:
    """The layer a frame `function (file:line)` names, or None (the frames outside it decide)."""
    function, _, where = frame.partition(" (")
    if function.startswith(("__pyx_gb_", "__pyx_pw_", "__pyx_pf_")):
        where, function = compiled_module(function), ""  # a compiled coroutine's body: its file only
    elif function.startswith(C_HELPERS):
        function = ""  # Cython's or CPython's inlined helper, named by its caller's line: its file only
    function = function.rpartition(".")[2]  # a Python frame says Class.method; a compiled one, method
    if any(part in where for part in SKIPPED):
        return None
    for part, layer in FILES:
        if part in where:
            if layer == "codec":
                if not function:
                    return None  # which way it codes is in the function's name
                encoding = any(word in function for word in ("encode", "output_json", "dumps", "answer"))
                return "encode" if encoding else "decode"
            if layer in ("parse", "transport"):
                if not function:
                    return None  # the transport's files both read and write: the function says which
                if function in WRITE_FUNCTIONS:
                    return "write"
            return layer
    if function in ("write", "writev", "sendmsg", "send") and "libc" in where:
        return "write"
    return None


def breakdown(raw: str) -> dict[str, float]:
    """py-spy's raw output (`frame;frame;... count` lines) -> the share of each layer, the server's main
    thread only (the worker threads of asyncio.to_thread sleep in it)."""
    counts: collections.Counter = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or "thread_run" in stack or "Thread._bootstrap" in stack:
            continue
        frames = stack.split(";")
        layer = next((found for f in reversed(frames) if (found := layer_of(f)) is not None), "transport")
        counts[layer] += int(count)
    total = sum(counts.values()) or 1
    return {layer: counts[layer] / total for layer in LAYERS} | {"samples": sum(counts.values())}


def profile(server: ServerProcess, key: str, name: str, args, files) -> dict:
    run = drive(name, server, args, files)
    with tempfile.NamedTemporaryFile(suffix=".txt", dir=args.keep, delete=not args.keep) as out:
        seconds = str(max(1, round(args.duration - 2)))
        spy = [shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"), "record",
               "--native", "-r", "250", "-f", "raw", "-d", seconds,
               "-p", str(server.pid), "-o", out.name]  # fmt: skip
        done: list = []
        sampler = threading.Timer(
            1.0, lambda: done.append(subprocess.run(spy, capture_output=True, text=True))
        )
        sampler.start()
        result = measure(server, run)
        sampler.join()
        with open(out.name) as f:
            shares = breakdown(f.read())
        if args.keep:
            os.replace(out.name, os.path.join(args.keep, f"{name}-{key}.txt"))
        if not shares["samples"]:
            raise RuntimeError(
                f"py-spy took no sample: {done[0].stderr[-500:] if done else 'it did not run'}"
            )
    return result | {"shares": shares}


def report(results: dict, args) -> str:
    lines = [
        f"# Server CPU per request, layer by layer ({args.machine})\n",
        f"`python -m bench.layers {' '.join(args.argv)}`: py-spy --native at 250 Hz (it stops the "
        f"server for each sample: the shares are the finding) during {args.duration:g} s of load; "
        "µs = share x the server's CPU per request in that run.\n",
        "| scenario | server | µs/req | " + " | ".join(LAYERS) + " | samples |",
        "|---|---|---|" + "---|" * len(LAYERS) + "---|",
    ]
    for name, per_server in results.items():
        for key, r in per_server.items():
            cpu, shares = r["cpu_us"], r["shares"]
            cells = [f"{cpu * shares[layer]:.1f} ({100 * shares[layer]:.0f}%)" for layer in LAYERS]
            lines.append(f"| {name} | {key} | {cpu:.1f} | " + " | ".join(cells) + f" | {shares['samples']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.layers", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per server and scenario")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--pure", action="store_true", help="also this checkout in pure Python")
    parser.add_argument("--baseline", help="also another checkout's server, as its tree is built")
    parser.add_argument("--machine", default="vm, 2 cores")
    parser.add_argument("--keep", help="a folder to keep py-spy's raw samples in (<scenario>-<server>.txt)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", default="layers", help="the results file: <date>-<name>.md")
    parser.set_defaults(triton=None, uvicorn=False)  # bench.hotpath's servers that are not sampled here
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    results: dict = {}
    with tempfile.TemporaryDirectory() as directory, servers_beside(args) as servers:
        files = write_files(directory)
        for name in args.only:  # one server at a time: the sampler and the load alone on the cores
            results[name] = {key: profile(server, key, name, args, files) for key, server in servers.items()}
    save(report(results, args), results, args, args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
