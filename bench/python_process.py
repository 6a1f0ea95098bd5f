"""The cost of a python model's instance in a process of its own (server/backends/process.py) against the
in-thread mode, per batch, without HTTP: `python -m bench.python_process [--calls N]`; and over REST
(`--rest`: a real server, wrk -t1 -c8 POSTing each model's JSON infer, `--rounds` rounds of `--duration`
s, the model order reversed every other round).

For `simple` written as a Triton python model (one request per batch) it runs N batches one after the
other through each mode's backend, the thread mode's in a worker thread as the server runs it, and prints
the wall time and the CPU time (server and instance process together) per batch; the difference of the
CPU times is the hop's cost. Then a ~1 ms pure-Python model
with 1 and 2 instances, batches two at a time: batches per second (process mode uses the second core).
Then the shared-memory paths: `simple` on `--large-mib` MiB inputs and outputs, and a batch of eight
512 KiB requests gathered before it is copied into the instance's Region, or in it (RegionStaging).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import uvloop

from tensorgate.batcher.scheduler import Job
from tensorgate.batcher.threads import Threads
from tensorgate.codec.tensor import InferRequest
from tensorgate.server.backends import load_backend

SIMPLE_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""
# ~1 ms of pure-Python work per request, as the figure asks (holds the GIL throughout): 24000
# loops take 1.0 ms with the server's interpreter on the 2-core VM (pyenv 3.11.7), 0.78 ms with Debian's
BUSY_PY = SIMPLE_PY.replace(
    "            a = pb_utils", "            sum(i * i for i in range(LOOPS))\n            a = pb_utils", 1
)


def config(name: str, mode: str, count: int, elements: int = 16) -> dict:
    tensor = {"data_type": "TYPE_INT32", "dims": [elements]}
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
        "output": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
        "instance_group": [{"count": count, "kind": "KIND_CPU"}],
        # mode "": the config as Triton's (no EXECUTION_MODE): a Triton-API model then runs in processes
        "parameters": {"EXECUTION_MODE": {"string_value": mode}} if mode else {},
    }


def cpu_seconds(pids: list[int]) -> float:
    """This process's CPU time and that of `pids` (its instance processes, still running)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def job(elements: int = 16) -> Job:
    a = np.arange(elements, dtype=np.int32).reshape(1, elements)
    request = InferRequest("m", "", None, [], None, {})
    return Job({"INPUT0": a, "INPUT1": a}, 1, request=request)


async def run(backend, calls: int, parallel: int, elements: int = 16) -> None:  # noqa: ANN001
    async def one() -> None:
        result = backend.execute([job(elements)])
        if asyncio.iscoroutine(result):
            await result

    for _ in range(calls // parallel):
        await asyncio.gather(*(one() for _ in range(parallel)))


def measure(
    root: Path, code: str, mode: str, count: int, calls: int, parallel: int, elements: int = 16
) -> tuple[float, float]:
    """(wall µs, CPU µs) per batch; `elements`: INT32 elements of each input and output."""
    name = f"m_{mode}_{count}_{elements}_{abs(hash(code)) % 1000}"
    version = root / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(code)
    backend = load_backend(version, config(name, mode, count, elements), 1)
    try:
        pids = children(os.getpid())  # the instance processes, in process mode
        # As the server runs a blocking execute: in a worker thread. (Triton's API in thread mode runs
        # its own threads, and its execute is a coroutine: awaited as it is.)
        if mode == "thread" and not backend.is_async:
            threads = Threads(count, "execute")
            execute = backend.execute

            async def threaded(jobs: list[Job]) -> list:
                return await threads.submit(execute, jobs)

            backend.execute = threaded  # type: ignore[method-assign]

        async def timed() -> tuple[float, float]:
            await run(backend, min(calls, 200), parallel, elements)  # warm
            cpu, wall = cpu_seconds(pids), time.perf_counter()
            await run(backend, calls, parallel, elements)
            return time.perf_counter() - wall, cpu_seconds(pids) - cpu

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the server's loop
            wall, cpu = runner.run(timed())
        return wall / calls * 1e6, cpu / calls * 1e6
    finally:
        backend.close()


def gathering(root: Path, calls: int, parts: int = 8, part_kib: int = 512) -> None:
    """A batch of `parts` requests of `part_kib` KiB FP32 each to a process model of our API, alternating:
    gathered first and then copied into the instance's Region (what HostStaging gave), or handed over as
    channel.Rows, gathered into the Region as it is written (RegionStaging)."""
    from tensorgate.server.backends import channel

    version = root / "gathering" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(
        "class Model:\n    def execute(self, inputs):\n        return {'Y': inputs['X'][:, :1]}\n"
    )
    tensor = {"data_type": "TYPE_FP32", "dims": [-1]}
    config = {
        "name": "gathering",
        "backend": "python",
        "max_batch_size": parts,
        "input": [{"name": "X", **tensor}],
        "output": [{"name": "Y", **tensor}],
        "parameters": {"EXECUTION_MODE": {"string_value": "process"}},
    }
    backend = load_backend(version, config, 1)
    rows = [np.random.rand(1, part_kib * 256).astype(np.float32) for _ in range(parts)]
    try:
        pids = children(os.getpid())

        async def run_as(how: str, count: int) -> None:
            for _ in range(count):
                batch = np.concatenate(rows) if how == "gathered" else channel.rows(rows)
                await backend.execute({"X": batch})

        async def timed(how: str) -> tuple[float, float]:
            await run_as(how, min(calls, 50))
            cpu, wall = cpu_seconds(pids), time.perf_counter()
            await run_as(how, calls)
            return time.perf_counter() - wall, cpu_seconds(pids) - cpu

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for how in ("gathered", "rows", "gathered", "rows"):
                wall, cpu = (seconds / calls * 1e6 for seconds in runner.run(timed(how)))
                print(f"  {how:8s} {wall:7.1f} µs wall, {cpu:7.1f} µs CPU per batch")
    finally:
        backend.close()


TRITON_PORTS = ("18975", "18976", "18977")  # HTTP, gRPC, metrics
TRITON_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""  # noqa: E501


def rest(loops: int, rounds: int, duration: float, triton: str) -> None:
    """req/s and server CPU µs per request (the server's process tree: its instance processes, or Triton's
    stubs), over REST; `triton`: the kit of ../shared/triton (set up), to run the busy model files on
    Triton 2.51's python backend too, and ours in process mode once more with the interpreter Triton's stub
    runs (a venv of it as EXECUTION_ENV_PATH: Debian's build runs the model's own loop ~1.3x faster than
    a build without PGO, which is a difference of interpreters, not of servers)."""
    import subprocess
    import sys

    from bench.crosscheck import run_wrk
    from bench.procs import ServerProcess, serve_argv

    busy = BUSY_PY.replace("LOOPS", str(loops))
    models = {  # name: (code, mode, count), `max_batch_size 0` as the figure asks
        "busy_thread_1": (busy, "thread", 1),
        "busy_thread_2": (busy, "thread", 2),
        "busy_default_1": (busy, "", 1),  # Triton's config unchanged: processes, the default for its API
        "busy_default_2": (busy, "", 2),
        "simple_thread": (SIMPLE_PY, "thread", 1),
        "simple_default": (SIMPLE_PY, "", 1),
    }
    stub_python = triton_interpreter() if triton else None
    if stub_python:
        models["busy_default_1_as_triton"] = (busy, "", 1)
        models["busy_default_2_as_triton"] = (busy, "", 2)
    body = json.dumps(
        {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                    for n in ("INPUT0", "INPUT1")]}
    ).encode()  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        repository = Path(root) / "models"
        for name, (code, mode, count) in models.items():
            (repository / name / "1").mkdir(parents=True)
            (repository / name / "1" / "model.py").write_text(code)
            cfg = config(name, mode, count)
            cfg["max_batch_size"] = 0
            if name.endswith("_as_triton"):
                venv = Path(root) / "triton-python"
                if not venv.exists():
                    subprocess.run([stub_python, "-m", "venv", "--without-pip", str(venv)], check=True)
                cfg["parameters"]["EXECUTION_ENV_PATH"] = {"string_value": str(venv)}
            for entry in cfg["input"] + cfg["output"]:
                entry["dims"] = [1, 16]
            (repository / name / "config.json").write_text(json.dumps(cfg))
        server = ServerProcess(
            serve_argv(str(repository)), cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        )
        targets = {name: (server.port, server.proc.pid) for name in models}
        triton_pid = None
        if triton:
            triton_repo = Path(root) / "triton"
            for name, count in (("triton_busy_1", 1), ("triton_busy_2", 2)):
                (triton_repo / name / "1").mkdir(parents=True)
                (triton_repo / name / "1" / "model.py").write_text(busy)
                (triton_repo / name / "config.pbtxt").write_text(TRITON_CONFIG.format(name=name, count=count))
            started = subprocess.run(
                [f"{triton}/start.sh", "python", *TRITON_PORTS, f"--model-repository={triton_repo}"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            triton_pid = int(started.stdout.split()[-1])
            port = int(TRITON_PORTS[0])
            targets.update({"triton_busy_1": (port, triton_pid), "triton_busy_2": (port, triton_pid)})
        try:
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
            for number in range(rounds):
                order = list(targets) if number % 2 == 0 else list(reversed(targets))
                for name in order:
                    port, pid = targets[name]
                    pids = [pid, *children(pid)]
                    before = cpu_of(pids)
                    url = f"http://127.0.0.1:{port}/v2/models/{name}/infer"
                    rate, note = run_wrk(url, body, "application/json", 8, duration)
                    used = cpu_of(pids) - before
                    results[name].append((rate, used / max(1.0, rate * duration) * 1e6))
                    if note:
                        print(f"  {name}: {note}", file=sys.stderr)
            print(f"REST, wrk -t1 -c8, {rounds} rounds of {duration:g} s, alternating (median):")
            for name, runs in results.items():
                rates = sorted(r for r, _ in runs)
                cpus = sorted(c for _, c in runs)
                rate, cpu = rates[len(rates) // 2], cpus[len(cpus) // 2]
                each = [round(r) for r, _ in runs]
                print(f"  {name:24s} {rate:8.0f} req/s {cpu:6.0f} µs CPU/req  rounds {each}")
        finally:
            server.stop()
            if triton_pid is not None:
                os.kill(triton_pid, 15)
                subprocess.run(["tail", f"--pid={triton_pid}", "-f", "/dev/null"], check=False, timeout=60)


def triton_interpreter() -> str | None:
    """The python Triton's stub runs: the base interpreter of the kit's venv ($TRITON_HOME/venv)."""
    cfg = Path(os.environ.get("TRITON_HOME", "/tmp/triton251")) / "venv" / "pyvenv.cfg"
    if not cfg.exists():
        return None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "executable":
            return value.strip()
    return None


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def cpu_of(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--loops", type=int, default=24000, help="the busy model's loop: ~1 ms")
    parser.add_argument("--large-mib", type=float, default=4.0, help="each input and output of the large run")
    parser.add_argument("--rest", action="store_true", help="over REST against a real server (wrk)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3)
    parser.add_argument("--triton", default="", help="with --rest: the Triton kit folder (../shared/triton)")
    args = parser.parse_args()
    if args.rest:
        rest(args.loops, args.rounds, args.duration, args.triton)
        return
    with tempfile.TemporaryDirectory() as root:
        print("simple, one batch at a time:")
        for mode in ("thread", "process", "thread", "process"):
            wall, cpu = measure(Path(root), SIMPLE_PY, mode, 1, args.calls, 1)
            print(f"  {mode:8s} {wall:7.1f} µs wall, {cpu:7.1f} µs CPU per batch")
        busy = BUSY_PY.replace("LOOPS", str(args.loops))
        print("~1 ms pure-Python model, batches two at a time:")
        for mode, count in (("thread", 1), ("thread", 2), ("process", 1), ("process", 2)):
            wall, _ = measure(Path(root), busy, mode, count, args.calls // 10, 2)
            print(f"  {mode:8s} count {count}: {1e6 / wall:7.0f} batches/s ({wall:6.0f} µs each)")
        elements = int(args.large_mib * (1 << 20)) // 4
        print(f"simple on {args.large_mib:g} MiB inputs and outputs (the Region both ways), one at a time:")
        for _ in range(2):
            wall, cpu = measure(Path(root), SIMPLE_PY, "process", 1, args.calls // 40, 1, elements)
            print(f"  process  {wall:7.1f} µs wall, {cpu:7.1f} µs CPU per batch")
        print("a batch of 8 requests of 512 KiB to our API in a process, gathered first or in the Region:")
        gathering(Path(root), args.calls // 40)


if __name__ == "__main__":
    main()
