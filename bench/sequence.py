"""Stateful models under load (issue 28's figures): the sequence batcher's two strategies.

    python -m bench.sequence [--sequences 64] [--steps 100] [--rounds 3] [--direct-sequences 16]
                             [--out bench/results]

One server (`python -m tensorgate.server serve`) serves three models:
- `sequence_accumulator` (examples/model_repository: onnxruntime, implicit state, the oldest strategy,
  max_batch_size 64, max_queue_delay_microseconds 1000): each answer is its sequence's running total;
- `direct8`, `direct1` and `direct8_full`: one python model (implicit state, READY) whose every
  execution takes a fixed 2 ms whatever its batch (an `await asyncio.sleep`, standing in for a device
  step of fixed cost), with the direct strategy and 8 batch slots (max_batch_size 8) or 1.

`oldest-grpc` / `oldest-rest`: `--sequences` sequences of `--steps` requests each run at once, each
sending its next request when the last is answered (a client keeping its stream, or its keep-alive
connection, to itself): gRPC ModelStreamInfer on raw HTTP/2 frames, one stream per sequence on 4
connections; REST on raw HTTP/1.1, one connection per sequence. Requests are built before the clock
starts and every answer is checked against the running total. Reported: requests/s (all requests over
the wall time of the round), p50 / p99 latency, the server's CPU per request, and the mean batch size
(inference_count / execution_count from the statistics extension over the round). `direct8-grpc` /
`direct1-grpc`: `--direct-sequences` sequences the same way on the direct models: with one slot, they
run one after another from the backlog. `direct8-full-grpc`: 8 slots again, with
`minimum_slot_utilization: 1.0` and `max_queue_delay_microseconds: 3000`: a batch waits for every slot
(or 3 ms), so sequences whose requests come back while another batch executes join the next one instead
of forming a batch of their own.

Goals (issue 28): mean batch >= 8 at 64 live sequences; direct with 8 slots >= 4x the requests/s of one
slot. The report goes to bench/results/<date>-sequence.md and .json.
"""

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import hpack
import httpx
import numpy as np
import orjson

import tensorgate.proto.inference as pb
from bench.bare_app import new_event_loop
from bench.grpc_load import STREAM_PATH
from bench.grpc_pingpong import answer_frames
from bench.procs import ServerProcess, cpu_clock, serve_argv
from tensorgate.perf.h1wire import build_request, parse_head
from tensorgate.perf.h2frames import (
    DATA,
    END_HEADERS,
    HEADERS,
    PREFACE,
    SETTINGS,
    WINDOW,
    WINDOW_UPDATE,
    frame,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "model_repository"
CONNECTIONS = 4  # HTTP/2 connections the gRPC streams are spread over
SCENARIOS = ["oldest-grpc", "oldest-rest", "direct8-grpc", "direct1-grpc", "direct8-full-grpc"]
DIRECT_MODEL = """
import asyncio


class Model:
    async def execute(self, inputs):
        await asyncio.sleep(0.002)  # a fixed cost per execution, whatever the batch
        total = inputs["STATE_IN"] + inputs["INPUT"] * inputs["READY"]
        return {"OUTPUT": total, "STATE_OUT": total}
"""
DIRECT_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {slots}
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  direct {{ {direct} }}
  control_input [ {{ name: "READY"
                     control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }} ]
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


def make_repository(directory: Path) -> Path:
    shutil.copytree(EXAMPLES / "sequence_accumulator", directory / "sequence_accumulator")
    for name, slots, direct in (
        ("direct8", 8, ""),
        ("direct1", 1, ""),
        ("direct8_full", 8, "max_queue_delay_microseconds: 3000 minimum_slot_utilization: 1.0"),
    ):
        (directory / name / "1").mkdir(parents=True)
        config = DIRECT_CONFIG.format(name=name, slots=slots, direct=direct)
        (directory / name / "config.pbtxt").write_text(config)
        (directory / name / "1" / "model.py").write_text(DIRECT_MODEL)
    return directory


@dataclass
class Plan:
    """The sequences of one run: their IDs, the values each sends, and the answers each must get."""

    model: str
    ids: list[int]
    values: list[list[int]]

    @classmethod
    def draw(cls, model: str, sequences: int, steps: int, first_id: int, seed: int) -> "Plan":
        rng = np.random.default_rng(seed)
        values = rng.integers(-1000, 1000, (sequences, steps)).tolist()
        return cls(model, list(range(first_id, first_id + sequences)), values)

    def flags(self, step: int) -> tuple[bool, bool]:
        return step == 0, step == len(self.values[0]) - 1

    def expected(self) -> list[list[int]]:
        return [np.cumsum(v).tolist() for v in self.values]


def grpc_message(model: str, sequence_id: int, value: int, start: bool, end: bool) -> bytes:
    parameters = {
        "sequence_id": pb.InferParameter(int64_param=sequence_id),
        "sequence_start": pb.InferParameter(bool_param=start),
        "sequence_end": pb.InferParameter(bool_param=end),
    }
    tensor = pb.ModelInferRequestInferInputTensor(name="INPUT", datatype="INT32", shape=[1, 1])
    raw = np.array([[value]], "<i4").tobytes()
    request = bytes(pb.ModelInferRequest(model_name=model, inputs=[tensor], parameters=parameters,
                                         raw_input_contents=[raw]))  # fmt: skip
    return b"\x00" + len(request).to_bytes(4, "big") + request


class _Streams(asyncio.Protocol):
    """ModelStreamInfer streams on one HTTP/2 connection, one sequence each: a stream sends its next
    request when its last is answered. An answer's value is its last 4 bytes (raw_output_contents, the
    last field of the answer; one INT32 output)."""

    def __init__(self, port: int, frames: dict[int, list[bytes]], run: "_Run") -> None:
        self.port, self.frames, self.run = port, frames, run
        self.step = dict.fromkeys(frames, 0)
        self.pending = dict.fromkeys(frames, b"")
        self.sent_at = dict.fromkeys(frames, 0.0)
        self.buffer = b""
        self.unacked = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        encoder = hpack.Encoder()
        out = [PREFACE, frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + WINDOW.to_bytes(4, "big")),
               frame(WINDOW_UPDATE, 0, 0, (WINDOW - 65535).to_bytes(4, "big"))]  # fmt: skip
        now = time.perf_counter()
        for stream, frames in self.frames.items():
            fields = [(":method", "POST"), (":scheme", "http"), (":path", STREAM_PATH),
                      (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/grpc"),
                      ("te", "trailers")]  # fmt: skip
            out += [frame(HEADERS, END_HEADERS, stream, encoder.encode(fields)), frames[0]]
            self.sent_at[stream] = now
        transport.write(b"".join(out))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        answer_frames(self, data)

    def ended(self, stream: int) -> None:
        self.run.fail(f"stream {stream} ended early")

    def _answers(self, stream: int, payload: bytes) -> list[bytes]:
        data = self.pending[stream] + payload
        sends = []
        while len(data) >= 5:
            size = int.from_bytes(data[1:5], "big")
            if len(data) < 5 + size:
                break
            message, data = data[5 : 5 + size], data[5 + size :]
            now = time.perf_counter()
            step = self.step[stream]
            value = int.from_bytes(message[-4:], "little", signed=True) if message[:1] != b"\x0a" else None
            self.run.answer(stream, step, value, now - self.sent_at[stream], message)
            self.step[stream] = step = step + 1
            if step < len(self.frames[stream]):
                self.sent_at[stream] = now
                sends.append(self.frames[stream][step])
        self.pending[stream] = data
        return sends


class _Rest(asyncio.Protocol):
    """One sequence over one HTTP/1.1 keep-alive connection, a request at a time."""

    def __init__(self, requests: list[bytes], index: int, run: "_Run") -> None:
        self.requests, self.index, self.run = requests, index, run
        self.step, self.buffer, self.sent_at = 0, b"", 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.sent_at = time.perf_counter()
        transport.write(self.requests[0])  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        status, length = parse_head(self.buffer[: head_end + 4])
        end = head_end + 4 + (length or 0)
        if len(self.buffer) < end:
            return
        body, self.buffer = self.buffer[head_end + 4 : end], self.buffer[end:]
        now = time.perf_counter()
        value = orjson.loads(body)["outputs"][0]["data"][0] if status == 200 else None
        self.run.answer(self.index, self.step, value, now - self.sent_at, body)
        self.step += 1
        if self.step < len(self.requests):
            self.sent_at = now
            self.transport.write(self.requests[self.step])  # type: ignore[attr-defined]


class _Run:
    """One run's answers: checked against the running totals; done when every sequence has its last."""

    def __init__(self, plan: Plan, keys: list[int]) -> None:
        self.expected = dict(zip(keys, plan.expected(), strict=True))
        self.remaining = len(keys) * len(plan.values[0])
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.done = asyncio.get_running_loop().create_future()

    def answer(self, key: int, step: int, value: int | None, latency: float, raw: bytes) -> None:
        self.latencies.append(latency)
        if value != self.expected[key][step]:
            want = self.expected[key][step]
            self.fail(f"sequence {key} step {step}: got {value} ({raw[:200]!r}), expected {want}")
        self.remaining -= 1
        if not self.remaining and not self.done.done():
            self.done.set_result(None)

    def fail(self, why: str) -> None:
        self.errors.append(why)
        if len(self.errors) > 20 and not self.done.done():
            self.done.set_exception(RuntimeError("; ".join(self.errors[:5])))


async def drive(port: int, plan: Plan, transport: str) -> tuple[float, _Run]:
    """Runs every sequence of `plan` at once; returns the wall time and the run's record."""
    loop = asyncio.get_running_loop()
    if transport == "grpc":
        streams: list[dict[int, list[bytes]]] = [{} for _ in range(CONNECTIONS)]
        keys = []
        for i, (sequence_id, values) in enumerate(zip(plan.ids, plan.values, strict=True)):
            stream = 1 + 2 * (i // CONNECTIONS)
            streams[i % CONNECTIONS][stream] = [
                frame(DATA, 0, stream, grpc_message(plan.model, sequence_id, v, *plan.flags(s)))
                for s, v in enumerate(values)
            ]
            keys.append((i % CONNECTIONS, stream))
        run = _Run(plan, list(range(len(keys))))
        index = {key: n for n, key in enumerate(keys)}
        connections = []
        started = time.perf_counter()
        for c, frames in enumerate(streams):
            if frames:
                protocol = _Streams(port, frames, _Keyed(run, c, index))
                connections.append(await loop.create_connection(lambda p=protocol: p, "127.0.0.1", port))
    else:
        run = _Run(plan, list(range(len(plan.ids))))
        path = f"/v2/models/{plan.model}/infer"
        requests = []
        for sequence_id, values in zip(plan.ids, plan.values, strict=True):
            requests.append([
                build_request("POST", path, "127.0.0.1", orjson.dumps({
                    "parameters": dict(zip(("sequence_start", "sequence_end"), plan.flags(s), strict=True),
                                       sequence_id=sequence_id),
                    "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [v]}],
                }))
                for s, v in enumerate(values)
            ])  # fmt: skip
        connections = []
        started = time.perf_counter()
        for i, sequence in enumerate(requests):
            connections.append(
                await loop.create_connection(lambda s=sequence, i=i: _Rest(s, i, run), "127.0.0.1", port)
            )
    await asyncio.wait_for(run.done, 600)
    elapsed = time.perf_counter() - started
    for transport_, _ in connections:
        transport_.close()
    return elapsed, run


class _Keyed:
    """Maps (connection, stream) to the sequence's index for _Run."""

    def __init__(self, run: _Run, connection: int, index: dict) -> None:
        self.run, self.connection, self.index = run, connection, index

    def answer(self, stream: int, step: int, value: int | None, latency: float, raw: bytes) -> None:
        self.run.answer(self.index[(self.connection, stream)], step, value, latency, raw)

    def fail(self, why: str) -> None:
        self.run.fail(why)


@dataclass
class Row:
    scenario: str
    round: int
    sequences: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # server CPU per request
    mean_batch: float  # inference_count / execution_count over the run
    per_execution: float  # requests answered / execution_count (a direct batch's empty slots left out)
    errors: int


def statistics(base_url: str, model: str) -> tuple[int, int]:
    stats = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def measure(server: ServerProcess, scenario: str, plan: Plan, transport: str, round_: int) -> Row:
    base_url = f"http://127.0.0.1:{server.port}"
    port = server.grpc_port if transport == "grpc" else server.port
    before, cpu = statistics(base_url, plan.model), cpu_clock(server.pid)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        seconds, run = runner.run(drive(port, plan, transport))
    cpu = cpu_clock(server.pid) - cpu
    after = statistics(base_url, plan.model)
    requests = len(run.latencies)
    latencies = np.array(run.latencies) * 1000
    executions = after[1] - before[1]
    return Row(
        scenario, round_, len(plan.ids), requests, seconds, requests / seconds,
        float(np.percentile(latencies, 50)), float(np.percentile(latencies, 99)), cpu / requests * 1e6,
        (after[0] - before[0]) / executions if executions else 0.0,
        requests / executions if executions else 0.0, len(run.errors),
    )  # fmt: skip


def render(rows: list[Row], args: argparse.Namespace, info: dict) -> str:
    lines = [
        f"# Sequence batcher: {info['date']}",
        "",
        f"`python -m bench.sequence --sequences {args.sequences} --steps {args.steps} --rounds {args.rounds} "
        f"--direct-sequences {args.direct_sequences}` on {info['machine']} (python {info['python']}). "
        "The client runs on the same machine as the server (raw frames, a few µs of CPU a request); "
        "the machine is shared with other work, so figures move from round to round.",
        "",
        "| scenario | round | sequences | requests | req/s | p50 ms | p99 ms | server CPU µs/req "
        "| mean batch | requests / execution | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.round} | {r.sequences} | {r.requests} | {r.rps:,.0f} | {r.p50_ms:.2f} | "
            f"{r.p99_ms:.2f} | {r.cpu_us:.0f} | {r.mean_batch:.1f} | {r.per_execution:.1f} | {r.errors} |"
        )
    medians = {}
    for scenario in dict.fromkeys(r.scenario for r in rows):
        mine = [r for r in rows if r.scenario == scenario]
        medians[scenario] = {
            "rps": float(np.median([r.rps for r in mine])),
            "p99_ms": float(np.median([r.p99_ms for r in mine])),
            "mean_batch": float(np.median([r.mean_batch for r in mine])),
        }
    lines += [
        "",
        "Medians of the rounds:",
        "",
        "| scenario | req/s | p99 ms | mean batch |",
        "| --- | --- | --- | --- |",
    ]
    for scenario, m in medians.items():
        lines.append(f"| {scenario} | {m['rps']:,.0f} | {m['p99_ms']:.2f} | {m['mean_batch']:.1f} |")

    def ratio_of(scenario: str) -> float | None:
        eights = [r for r in rows if r.scenario == scenario]
        ones = [r for r in rows if r.scenario == "direct1-grpc"]
        if not eights or len(eights) != len(ones):
            return None
        return float(np.median([d8.rps / d1.rps for d8, d1 in zip(eights, ones, strict=True)]))

    lines += [
        "",
        "| goal (issue 28) | measured | met |",
        "| --- | --- | --- |",
    ]
    for scenario in ("oldest-grpc", "oldest-rest"):
        if scenario in medians:
            batch = medians[scenario]["mean_batch"]
            lines.append(f"| mean batch >= 8 at {args.sequences} live sequences, {scenario} | {batch:.1f} | "
                         f"{'yes' if batch >= 8 else 'no'} |")  # fmt: skip
    ratios = {}
    settings = {"direct8-grpc": "default settings", "direct8-full-grpc": "minimum_slot_utilization 1.0"}
    for scenario, how in settings.items():
        ratio = ratio_of(scenario)
        if ratio is not None:
            ratios[scenario] = ratio
            lines.append(f"| direct, 8 slots >= 4x the req/s of 1 slot ({how}) | {ratio:.1f}x (median of "
                         f"per-round ratios) | {'yes' if ratio >= 4 else 'no'} |")  # fmt: skip
    info["medians"], info["direct_ratios"] = medians, ratios
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sequence", description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64, help="live sequences of the oldest runs")
    parser.add_argument("--steps", type=int, default=100, help="requests per sequence")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--direct-sequences", type=int, default=16, help="live sequences of the direct runs")
    parser.add_argument("--out", default=None, help="write <date>-sequence.md and .json here")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=SCENARIOS, help="these scenarios")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = make_repository(Path(tmp))
        with ServerProcess(serve_argv(str(repository))) as server:
            scenarios = [
                ("oldest-grpc", "sequence_accumulator", "grpc", args.sequences),
                ("oldest-rest", "sequence_accumulator", "rest", args.sequences),
                ("direct8-grpc", "direct8", "grpc", args.direct_sequences),
                ("direct1-grpc", "direct1", "grpc", args.direct_sequences),
                ("direct8-full-grpc", "direct8_full", "grpc", args.direct_sequences),
            ]
            scenarios = [s for s in scenarios if s[0] in args.only]
            warmup = Plan.draw("sequence_accumulator", 8, 10, 1, 0)
            measure(server, "warmup", warmup, "grpc", 0)
            measure(server, "warmup", warmup, "rest", 0)
            first_id = 1000
            for round_ in range(1, args.rounds + 1):
                order = scenarios if round_ % 2 else scenarios[::-1]
                for scenario, model, transport, sequences in order:
                    plan = Plan.draw(model, sequences, args.steps, first_id, round_)
                    first_id += sequences
                    row = measure(server, scenario, plan, transport, round_)
                    rows.append(row)
                    print(json.dumps(asdict(row)), flush=True)
    rows.sort(key=lambda r: ([s[0] for s in scenarios].index(r.scenario), r.round))
    info = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({len(os.sched_getaffinity(0))} cores)",
        "python": platform.python_version(),
    }
    report = render(rows, args, info)
    print(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{info['date']}-sequence.md").write_text(report)
        doc = {"rows": [asdict(r) for r in rows], **info, "args": vars(args)}
        (out / f"{info['date']}-sequence.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
