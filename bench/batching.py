"""Dynamic batching on and off, side by side: the example MLP at several concurrencies, one server.

    python -m bench.batching [--model mlp|onnx_mlp] [--duration 5] [--warmup 1] [--concurrency 1 8 64]
                             [--out bench/results]

The server serves two copies of the model --model names from examples/model_repository (`mlp`, the
TorchScript MLP, by default; `onnx_mlp`, the same MLP in ONNX): `<model>` as bundled (dynamic_batching on,
max_queue_delay_microseconds 100) and `<model>_nobatch` (the same config without dynamic_batching, so every
request executes alone). Each request is one row (64 FP32, binary tensor data) over HTTP/1.1. For every
concurrency the two models are loaded in turn; the mean batch size comes from the server's statistics
(rows inferred / executions). The GPU run is the same command on a machine with CUDA (the config's
KIND_AUTO instance group then puts the model on the device).

After the table come the figures issue 5's GPU targets are checked with, read from the statistics of the
batched model: the execution time of its largest batch (compute_infer per execution), the p99 bound
(max_queue_delay + 3 x that time) at the highest concurrency, and the rate at which a batch's input
reaches the model (batch bytes / compute_input per execution: gathering into the pinned buffer and the
host-to-device copy together, so a lower bound of the copy's own rate) beside the pinned-memory copy
bandwidth torch measures on the same device (CUDA only).
"""

import argparse
import asyncio
import json
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from bench.bare_app import new_event_loop
from bench.h1client import run_h1
from bench.procs import ServerProcess
from bench.stats import Recorder, drive
from tensorgate.perf.h1wire import build_request

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "model_repository"
TITLES = {"mlp": "example MLP", "onnx_mlp": "example ONNX MLP (onnx_mlp)"}  # the --model choices


def model_names(model: str) -> dict[str, str]:
    return {"off": f"{model}_nobatch", "on": model}


@dataclass
class Row:
    concurrency: int
    batching: str
    rps: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    errors: int


def make_repository(directory: Path, model: str = "mlp") -> Path:
    source = EXAMPLES / model
    for name in model_names(model).values():
        shutil.copytree(source, directory / name)
        config = (source / "config.pbtxt").read_text().replace(f'name: "{model}"', f'name: "{name}"')
        if name == model_names(model)["off"]:
            config = "\n".join(line for line in config.splitlines() if "dynamic_batching" not in line)
        (directory / name / "config.pbtxt").write_text(config + "\n")
    return directory


def infer_request(host: str, port: int, model: str) -> bytes:
    row = np.random.default_rng(0).standard_normal((1, 64), dtype=np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 256},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return build_request("POST", f"/v2/models/{model}/infer", f"{host}:{port}", header + row, headers)


def model_stats(base_url: str, model: str) -> dict:
    (stats,) = httpx.get(f"{base_url}/v2/models/{model}/stats").json()["model_stats"]
    return stats


def counts(base_url: str, model: str) -> tuple[int, int]:
    stats = model_stats(base_url, model)
    return stats["inference_count"], stats["execution_count"]


def largest_batch(stats: dict) -> tuple[int, float, float]:
    """The largest batch size executed, and its mean compute_input and compute_infer times in ms."""
    batch = max(stats["batch_stats"], key=lambda b: b["batch_size"])

    def mean_ms(phase: dict) -> float:
        return phase["ns"] / max(1, phase["count"]) / 1e6

    return batch["batch_size"], mean_ms(batch["compute_input"]), mean_ms(batch["compute_infer"])


def pinned_copy_gbps() -> float | None:
    """Host-to-device bandwidth from pinned memory (64 MiB, best of 5), or None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    device = torch.empty_like(host, device="cuda")
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return host.numel() / best / 1e9


def gpu_figures(rows: list[Row], stats: dict, delay_ms: float) -> list[str]:
    size, input_ms, infer_ms = largest_batch(stats)
    top = max(r.concurrency for r in rows)
    p99 = next(r.p99_ms for r in rows if r.concurrency == top and r.batching == "on")
    bound = delay_ms + 3 * infer_ms
    lines = [
        "",
        f"- largest batch: {size} rows; compute_input {input_ms:.3f} ms, compute_infer {infer_ms:.3f} ms",
        f"- p99 at concurrency {top}: {p99:.2f} ms; bound max_queue_delay + 3 x full batch = {bound:.2f} ms"
        f" ({'within' if p99 <= bound else 'over'})",
    ]
    pinned = pinned_copy_gbps()
    batch_gbps = size * 64 * 4 / (input_ms / 1e3) / 1e9 if input_ms > 0 else float("nan")
    if pinned is None:
        lines.append(f"- batch input staging: {batch_gbps:.2f} GB/s (no CUDA: no pinned-copy bandwidth)")
    else:
        lines.append(
            f"- batch input staging: {batch_gbps:.2f} GB/s = {batch_gbps / pinned:.0%} of the pinned-memory "
            f"copy bandwidth ({pinned:.1f} GB/s)"
        )
    return lines


async def measure(host: str, port: int, model: str, concurrency: int, opts: argparse.Namespace) -> Row:
    base_url = f"http://{host}:{port}"
    before: list[tuple[int, int]] = []

    async def read_counts() -> None:  # at the end of the warmup, in a thread: the load goes on meanwhile
        before.append(await asyncio.to_thread(counts, base_url, model))

    rec = Recorder()
    load = asyncio.create_task(run_h1(host, port, infer_request(host, port, model), concurrency, rec))
    label = f"{model} c{concurrency}"
    summary, _ = await drive(label, rec, load, opts.warmup, opts.duration, warmed=read_counts)
    rows, executions = counts(base_url, model)
    rows_before, executions_before = before[0]
    mean_batch = (rows - rows_before) / max(1, executions - executions_before)
    batching = "on" if model == opts.model else "off"
    return Row(concurrency, batching, summary.rps, summary.p50_ms, summary.p99_ms, mean_batch, summary.errors)


def render(rows: list[Row], device: str, extra: list[str], model: str = "mlp") -> str:
    lines = [
        f"# Dynamic batching on/off, {TITLES[model]}, {time.strftime('%Y-%m-%d')}, {device}",
        "",
        "| concurrency | batching | requests/s | p50 ms | p99 ms | mean batch | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.concurrency} | {r.batching} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} "
            f"| {r.mean_batch:.1f} | {r.errors} |"
        )
    lines.append("")
    for c in sorted({r.concurrency for r in rows}):
        on = next(r for r in rows if r.concurrency == c and r.batching == "on")
        off = next(r for r in rows if r.concurrency == c and r.batching == "off")
        lines.append(f"- concurrency {c}: batching on / off = {on.rps / max(off.rps, 1e-9):.2f}x requests/s")
    return "\n".join(lines + extra) + "\n"


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"CPU ({platform.machine()}, {platform.node()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--model", choices=list(TITLES), default="mlp", help="example model (default mlp)")
    parser.add_argument("--out", default="", help="folder for <date>-batching[-<model> if not mlp].md/.json")
    opts = parser.parse_args(argv)
    models = model_names(opts.model)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = make_repository(Path(tmp), opts.model)
        argv_server = [
            sys.executable,
            "-m",
            "tensorgate.server",
            "serve",
            "--model-repository",
            str(repository),
        ]
        argv_server += ["--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
        with (
            ServerProcess(argv_server, cwd=str(ROOT)) as server,
            asyncio.Runner(loop_factory=new_event_loop) as runner,
        ):
            for concurrency in opts.concurrency:
                for model in models.values():
                    rows.append(runner.run(measure(server.host, server.port, model, concurrency, opts)))
            base_url = f"http://{server.host}:{server.port}"
            stats = model_stats(base_url, models["on"])
            config = httpx.get(f"{base_url}/v2/models/{models['on']}/config").json()
    delay_ms = config["dynamic_batching"].get("max_queue_delay_microseconds", 0) / 1000
    report = render(rows, device_name(), gpu_figures(rows, stats, delay_ms), opts.model)
    print(report)
    if opts.out:
        out = Path(opts.out)
        out.mkdir(parents=True, exist_ok=True)
        suffix = "" if opts.model == "mlp" else f"-{opts.model}"  # mlp keeps the name its old results have
        stem = out / f"{time.strftime('%Y-%m-%d')}-batching{suffix}"
        stem.with_suffix(".md").write_text(report)
        stem.with_suffix(".json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
