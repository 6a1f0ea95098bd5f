"""python -m bench.soak: valid traffic on every protocol for minutes, with hostile traffic beside it, and
a check that nothing was lost (issue 18).

    python -m bench.soak --minutes 10 [--rate 80] [--out bench/results]

Two servers on copies of the example models: one in explicit mode, whose models are reloaded through
the repository API while they serve, and one in poll mode, whose repository changes under it (a model's
code rewritten, a spare model's version folders added and removed). Against both, at a steady rate:

- valid traffic, every answer checked for its values: v2 REST JSON (simple) and binary (identity_fp32),
  gRPC ModelInfer and ModelStreamInfer (grpclib), TF Serving predict (half_plus_two), grps REST predict
  and grps gRPC Predict (simple), grps REST streaming (token_stream);
- malformed traffic: the fuzzers' seed corpora (fuzz/corpus) and mutations of them replayed as request
  bodies over raw sockets, and raw garbage on the HTTP and gRPC ports;
- clients that vanish mid-request (a head or a body cut short), mid-stream (a grps stream closed after
  its first message) and mid-answer, and slow readers of a large answer.

It reports the valid requests sent and failed (must be 0) and answers checked, p50/p99 latency per
protocol over the run, and each server's RSS and open file descriptors at start, middle and end. It
exits non-zero on a failed valid request, more open descriptors at the end than at the start (after the
clients have gone), or RSS growth past the bound it prints.
"""

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import httpx
import numpy as np
from grpclib.client import Channel

import tensorgate.proto.grps.protos.v1 as gpb
import tensorgate.proto.inference as pb
from bench.procs import ServerProcess, memory_kib

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
MODELS = ("simple", "identity_fp32", "half_plus_two", "token_stream")
RSS_BOUND_MIB = 64  # growth allowed over the run, beyond 10% of the starting RSS
A = list(range(16))
B = [1] * 16
SLICES = 5  # latency is reported per fifth of the run
WARMUP = 8.0  # s of traffic before the starting RSS and descriptors are read
QUIET = 3.0  # s without clients before a probe that is compared (lingering closes over, poller settled)


class Tally:
    def __init__(self, started: float, seconds: float) -> None:
        self.started, self.seconds = started, seconds
        self.sent: dict[str, int] = {}
        self.failed: dict[str, list[str]] = {}
        self.latency: dict[str, list[tuple[float, float]]] = {}
        self.hostile = 0

    def record(self, protocol: str, began: float, problem: str) -> None:
        self.sent[protocol] = self.sent.get(protocol, 0) + 1
        if problem:
            self.failed.setdefault(protocol, []).append(problem)
        else:
            self.latency.setdefault(protocol, []).append((began - self.started, time.monotonic() - began))


# ------------------------------------------------------------------------------------------ valid


def v2_body() -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B},
        ]
    }


SUMS = [a + b for a, b in zip(A, B, strict=True)]


async def v2_json(client: httpx.AsyncClient, channel: Channel) -> str:
    doc = (await client.post("/v2/models/simple/infer", json=v2_body())).json()
    got = {o["name"]: o["data"] for o in doc.get("outputs", [])}
    return "" if got.get("OUTPUT0") == SUMS else f"v2 json answered {str(doc)[:200]}"


async def v2_binary(client: httpx.AsyncClient, channel: Channel) -> str:
    values = np.arange(4096, dtype="<f4")
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4096],
                        "parameters": {"binary_data_size": values.nbytes}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    response = await client.post(
        "/v2/models/identity_fp32/infer",
        content=header + values.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    length = int(response.headers.get("inference-header-content-length", -1))
    ok = response.status_code == 200 and response.content[length:] == values.tobytes()
    return "" if ok else f"v2 binary answered {response.status_code} {response.content[:120]!r}"


def infer_request() -> pb.ModelInferRequest:
    inputs = [pb.ModelInferRequestInferInputTensor(n, "INT32", [1, 16]) for n in ("INPUT0", "INPUT1")]
    raw = [np.array(A, "<i4").tobytes(), np.array(B, "<i4").tobytes()]
    return pb.ModelInferRequest(model_name="simple", inputs=inputs, raw_input_contents=raw)


async def grpc_unary(client: httpx.AsyncClient, channel: Channel) -> str:
    response = await pb.GrpcInferenceServiceStub(channel).model_infer(infer_request(), timeout=20)
    got = np.frombuffer(response.raw_output_contents[0], "<i4").tolist()
    return "" if got == SUMS else f"gRPC ModelInfer answered {got}"


async def grpc_stream(client: httpx.AsyncClient, channel: Channel) -> str:
    stub = pb.GrpcInferenceServiceStub(channel)
    answers = [m async for m in stub.model_stream_infer([infer_request()] * 5, timeout=20)]
    got = [np.frombuffer(m.infer_response.raw_output_contents[0], "<i4").tolist() for m in answers]
    return "" if got == [SUMS] * 5 else f"ModelStreamInfer answered {answers[:1]}"


async def tfserving(client: httpx.AsyncClient, channel: Channel) -> str:
    doc = (await client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0, 5.0]})).json()
    return "" if doc.get("predictions") == [2.5, 3.0, 4.5] else f"TF Serving answered {doc}"


def grps_tensors() -> dict:
    tensors = [
        {"name": "INPUT0", "dtype": "DT_INT32", "shape": [1, 16], "flat_int32": A},
        {"name": "INPUT1", "dtype": "DT_INT32", "shape": [1, 16], "flat_int32": B},
    ]
    return {"model": "simple", "gtensors": {"tensors": tensors}}


async def grps_rest(client: httpx.AsyncClient, channel: Channel) -> str:
    doc = (await client.post("/grps/v1/infer/predict", json=grps_tensors())).json()
    tensors = {t["name"]: t for t in doc.get("gtensors", {}).get("tensors", [])}
    ok = tensors.get("OUTPUT0", {}).get("flat_int32") == SUMS
    return "" if ok else f"grps REST answered {str(doc)[:200]}"


async def grps_grpc(client: httpx.AsyncClient, channel: Channel) -> str:
    tensors = [
        gpb.GenericTensor(name=n, dtype=gpb.DataType.DT_INT32, shape=[1, 16], flat_int32=v)
        for n, v in (("INPUT0", A), ("INPUT1", B))
    ]
    message = gpb.GrpsMessage(model="simple", gtensors=gpb.GenericTensorData(tensors=tensors))
    answer = await gpb.GrpsServiceStub(channel).predict(message, timeout=20)
    got = {t.name: list(t.flat_int32) for t in answer.gtensors.tensors}
    return "" if got.get("OUTPUT0") == SUMS else f"grps gRPC answered {answer.status}"


async def grps_streaming(client: httpx.AsyncClient, channel: Channel) -> str:
    body = {"model": "token_stream", "str_data": "a b c"}
    async with client.stream("POST", "/grps/v1/infer/predict", json=body, params={"streaming": "true"}) as r:
        lines = [json.loads(line) async for line in r.aiter_lines() if line]
    got = [line.get("str_data") for line in lines]
    return "" if got == ["a", "b", "c"] else f"grps streaming answered {lines}"


VALID = {
    "v2-json": v2_json,
    "v2-binary": v2_binary,
    "grpc-unary": grpc_unary,
    "grpc-stream": grpc_stream,
    "tfserving": tfserving,
    "grps-rest": grps_rest,
    "grps-grpc": grps_grpc,
    "grps-streaming": grps_streaming,
}


async def valid_worker(name: str, server: ServerProcess, tally: Tally, interval: float, until: float) -> None:
    call = VALID[name]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as client:
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            while time.monotonic() < until:
                began = time.monotonic()
                try:
                    problem = await call(client, channel)
                except Exception as e:  # a transport error is a failed valid request too
                    problem = f"{type(e).__name__}: {e}"
                tally.record(name, began, problem)
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))
        finally:
            channel.close()


# ---------------------------------------------------------------------------------------- hostile

PATHS = {
    "v2_json": "/v2/models/simple/infer",
    "tfserving_predict": "/v1/models/half_plus_two:predict",
    "grps_json": "/grps/v1/infer/predict",
    "repository_load": "/v2/repository/models/simple/load",
    "config_json": "/v2/repository/models/spare/load",
    "shared_memory": "/v2/systemsharedmemory/region/r/register",
}


def corpora() -> list[tuple[str, bytes]]:
    items = []
    for name, path in PATHS.items():
        directory = ROOT / "fuzz" / "corpus" / name
        for file in sorted(directory.iterdir()) if directory.is_dir() else ():
            items.append((path, file.read_bytes()))
    return items


def mutate(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        if data and rng.random() < 0.7:
            data[rng.randrange(len(data))] = rng.randrange(256)
        else:
            data[rng.randrange(len(data) + 1) : 0] = bytes([rng.randrange(256)])
    return bytes(data)


async def raw_exchange(port: int, payload: bytes, read: bool = True) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        if read:
            await asyncio.wait_for(reader.read(65536), 5)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def hostile_worker(
    server: ServerProcess, tally: Tally, interval: float, until: float, seed: int
) -> None:
    rng = random.Random(seed)
    seeds = corpora()
    while time.monotonic() < until:
        kind = rng.randrange(6)
        if kind <= 1:  # a corpus body, mutated or not, as a POST
            path, body = rng.choice(seeds)
            body = mutate(body, rng) if kind == 1 else body
            head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            await raw_exchange(server.port, head.encode() + body)
        elif kind == 2:  # garbage on either port
            port = rng.choice((server.port, server.grpc_port))
            await raw_exchange(port, rng.randbytes(rng.randrange(1, 400)))
        elif kind == 3:  # a head cut short, then gone
            await raw_exchange(
                server.port, b"POST /v2/models/simple/infer HTTP/1.1\r\ncontent-le", read=False
            )
        elif kind == 4:  # a body cut short, then gone
            head = b'POST /v2/models/simple/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{"inp'
            await raw_exchange(server.port, head, read=False)
        else:  # a grps stream left after its first message, and a large answer read slowly, then dropped
            await vanish_mid_stream(server)
        tally.hostile += 1
        await asyncio.sleep(interval)


async def vanish_mid_stream(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
        body = {"model": "token_stream", "str_data": "one two three four five"}
        async with client.stream(
            "POST", "/grps/v1/infer/predict", json=body, params={"streaming": "true"}
        ) as r:
            async for _ in r.aiter_raw():
                break  # gone after the first message
        values = np.zeros(1 << 20, dtype="<f4")  # a 4 MiB answer, read 64 KiB at a time then dropped
        header = json.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [values.size],
                         "parameters": {"binary_data_size": values.nbytes}}],
             "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
        ).encode()  # fmt: skip
        request = client.build_request(
            "POST",
            "/v2/models/identity_fp32/infer",
            content=header + values.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        response = await client.send(request, stream=True)
        async for _ in response.aiter_raw(65536):
            await asyncio.sleep(0.05)
            break
        await response.aclose()


# ----------------------------------------------------------------------------------- model churn


async def reloads(server: ServerProcess, until: float, period: float) -> int:
    """Explicit mode: `simple` reloaded, `spare` unloaded and loaded, through the repository API."""
    done = 0
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as client:
        while time.monotonic() < until:
            await asyncio.sleep(period)
            for path in ("/v2/repository/models/simple/load", "/v2/repository/models/spare/unload",
                         "/v2/repository/models/spare/load"):  # fmt: skip
                response = await client.post(path)
                if response.status_code != 200:
                    raise RuntimeError(f"{path}: {response.status_code} {response.text}")
            done += 1
    return done


async def repository_changes(repository: Path, until: float, period: float) -> int:
    """Poll mode: simple's model.py rewritten (a reload), spare's version 2 added and removed."""
    done = 0
    model = repository / "simple" / "1" / "model.py"
    spare_v2 = repository / "spare" / "2"
    while time.monotonic() < until:
        await asyncio.sleep(period)
        model.write_text(model.read_text())  # new mtime: the poller reloads it
        if spare_v2.exists():
            shutil.rmtree(spare_v2)
        else:
            shutil.copytree(repository / "spare" / "1", spare_v2)
        done += 1
    return done


# ----------------------------------------------------------------------------------------- probes


def probe(server: ServerProcess) -> dict:
    return {
        "rss_mib": round(memory_kib(server.proc.pid)["VmRSS"] / 1024, 1),
        "fds": len(os.listdir(f"/proc/{server.proc.pid}/fd")),
    }


def make_repository(base: Path) -> Path:
    for name in MODELS:
        shutil.copytree(EXAMPLES / name, base / name)
    spare = base / "spare"
    shutil.copytree(EXAMPLES / "simple", spare)
    config = spare / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple"', 'name: "spare"'))
    text = config.read_text()
    if "version_policy" not in text:
        config.write_text(text + "\nversion_policy: { all { } }\n")
    return base


async def soak(args: argparse.Namespace, servers: dict[str, ServerProcess], repos: dict[str, Path]) -> dict:
    """A warm-up (everything runs a few times: lazily made thread pools and a reload's first imports are
    not growth), a quiet moment for the starting probes, the run itself, and the end probes once every
    client has gone."""
    seconds = args.minutes * 60
    interval = len(VALID) * len(servers) / args.rate
    probes: dict[str, dict] = {name: {} for name in servers}

    def read(moment: str) -> None:
        for name, server in servers.items():
            probes[name][moment] = probe(server)

    async def run(tally: Tally, until: float, middle: float | None) -> list:
        async def halfway() -> None:
            if middle is not None:
                await asyncio.sleep(middle)
                read("middle")

        work = [valid_worker(p, server, tally, interval, until) for server in servers.values() for p in VALID]
        work += [
            hostile_worker(server, tally, args.hostile_interval, until, i)
            for i, server in enumerate(servers.values())
        ]
        churn = [
            reloads(servers["explicit"], until, args.churn_seconds),
            repository_changes(repos["poll"], until, args.churn_seconds),
        ]
        return (await asyncio.gather(*work, *churn, halfway()))[len(work) : len(work) + 2]

    warmup_start = time.monotonic()
    warm = Tally(warmup_start, WARMUP)
    await run(warm, warmup_start + WARMUP, None)
    await asyncio.sleep(QUIET)
    read("start")
    started = time.monotonic()
    tally = Tally(started, seconds)
    reloaded, changed = await run(tally, started + seconds, seconds / 2)
    await asyncio.sleep(QUIET)
    read("end")
    for protocol, count in warm.sent.items():  # the warm-up's requests count as sent, and failed if so
        tally.sent[protocol] = tally.sent.get(protocol, 0) + count
        tally.failed.setdefault(protocol, []).extend(warm.failed.get(protocol, []))
    tally.hostile += warm.hostile
    tally.failed = {protocol: problems for protocol, problems in tally.failed.items() if problems}
    return {"tally": tally, "probes": probes, "reloads": reloaded, "changes": changed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=80.0, help="valid requests/s over both servers")
    parser.add_argument(
        "--hostile-interval", type=float, default=0.05, help="s between hostile acts, per server"
    )
    parser.add_argument(
        "--churn-seconds", type=float, default=5.0, help="s between reloads / repository changes"
    )
    parser.add_argument("--out", default=None, help="write the report there (default: print only)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as directory:
        repos = {name: make_repository(Path(directory) / name) for name in ("explicit", "poll")}
        base = [sys.executable, "-m", "tensorgate.server", "serve", "--host", "127.0.0.1", "--http-port", "0",
                "--grpc-port", "0", "--metrics-port", "0", "--log-level", "warning"]  # fmt: skip
        modes = {
            "explicit": ["--model-control-mode", "explicit", "--load-model", "*"],
            "poll": ["--model-control-mode", "poll", "--repository-poll-secs", "1"],
        }
        argvs = {name: [*base, "--model-repository", str(repos[name]), *mode] for name, mode in modes.items()}
        servers = {name: ServerProcess(argv, cwd=str(ROOT)) for name, argv in argvs.items()}
        try:
            outcome = asyncio.run(soak(args, servers, repos))
        finally:
            statuses = {name: server.stop() for name, server in servers.items()}
    text, ok = report(args, outcome, statuses)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"{date.today()}-soak.md")
        with open(path, "w") as f:
            f.write(text)
        print(f"report: {path}", file=sys.stderr)
    return 0 if ok else 1


def report(args: argparse.Namespace, outcome: dict, statuses: dict) -> tuple[str, bool]:
    tally: Tally = outcome["tally"]
    sent, failed = sum(tally.sent.values()), sum(len(v) for v in tally.failed.values())
    lines = [
        f"# Soak, {date.today()} ({platform.node() or 'this machine'}, {os.cpu_count()} cores)",
        "",
        f"`python -m bench.soak --minutes {args.minutes:g} --rate {args.rate:g}`: two servers (explicit "
        f"mode with reloads through the repository API, {outcome['reloads']} rounds; poll mode with its "
        f"repository changing, {outcome['changes']} rounds), valid traffic on every protocol with its "
        f"answers checked, and {tally.hostile:,} hostile acts beside it (fuzz corpora and mutations over raw "
        "sockets, garbage on both ports, heads and bodies cut short, a grps stream and a 4 MiB answer "
        "abandoned).",
        "",
        f"Valid requests: {sent:,} sent, {failed} failed.",
        "",
        "| protocol | sent | failed | "
        + " | ".join(f"p50/p99 ms, fifth {i + 1}" for i in range(SLICES))
        + " |",
        "|---|---|---|" + "---|" * SLICES,
    ]
    for protocol in VALID:
        points = tally.latency.get(protocol, [])
        cells = []
        for i in range(SLICES):
            chunk = [
                lat * 1e3
                for t, lat in points
                if i * tally.seconds / SLICES <= t < (i + 1) * tally.seconds / SLICES
            ]
            cells.append(f"{statistics.median(chunk):.1f} / {np.percentile(chunk, 99):.1f}" if chunk else "-")
        counts = f"{tally.sent.get(protocol, 0):,} | {len(tally.failed.get(protocol, []))}"
        lines.append(f"| {protocol} | {counts} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| server | RSS start / middle / end (MiB) | open fds start / middle / end | exit |",
        "|---|---|---|---|",
    ]
    ok = failed == 0
    problems = []
    for name, probes in outcome["probes"].items():
        start, middle, end = probes["start"], probes.get("middle", probes["start"]), probes["end"]
        bound = start["rss_mib"] * 1.1 + RSS_BOUND_MIB
        lines.append(
            f"| {name} | {start['rss_mib']} / {middle['rss_mib']} / {end['rss_mib']} (bound {bound:.0f}) | "
            f"{start['fds']} / {middle['fds']} / {end['fds']} | {statuses[name]} |"
        )
        if end["fds"] > start["fds"]:
            problems.append(f"{name}: open fds grew from {start['fds']} to {end['fds']}")
        if end["rss_mib"] > bound:
            problems.append(f"{name}: RSS grew past {bound:.0f} MiB")
        if statuses[name] != 0:
            problems.append(f"{name}: exited {statuses[name]}")
    for protocol, problems_seen in tally.failed.items():
        problems.append(f"{protocol}: {len(problems_seen)} failed, first: {problems_seen[0]}")
    ok = ok and not problems
    lines += ["", "Verdict: " + ("nothing lost." if ok else "; ".join(problems)), ""]
    return "\n".join(lines), ok


if __name__ == "__main__":
    raise SystemExit(main())
