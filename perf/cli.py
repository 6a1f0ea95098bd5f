"""`tensorgate perf URL --model NAME` (also `python -m tensorgate.perf`): a load generator for any KServe v2,
Triton, TF Serving or grps server. See perf/__init__.py and docs/tools/perf.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

from tensorgate.perf import report
from tensorgate.perf.h1wire import dechunk
from tensorgate.perf.hdr import Histogram
from tensorgate.perf.load import Load, Target
from tensorgate.perf.model import (
    ModelSpec,
    PerfError,
    from_file,
    generated,
    parse_shapes,
    request_shapes,
    spec_from_tfserving,
    spec_from_v2_grpc,
    spec_from_v2_rest,
)
from tensorgate.perf.protocols import GRPC, PROTOCOLS, Answer, Checker, encode, outputs_of
from tensorgate.perf.run import Level, Result, Windows, cores, run_level, start_runners


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorgate perf",
        description="Load-test a model on a KServe v2 / Triton, TF Serving or grps server.",
        epilog="Example: tensorgate perf http://127.0.0.1:8000 -m simple --concurrency 1,8,64 --json o.json",
    )
    parser.add_argument("url", help="the server: http://HOST:PORT (gRPC: grpc://HOST:PORT or HOST:PORT)")
    parser.add_argument("-m", "--model", required=True, help="the model's name")
    parser.add_argument(
        "-x", "--model-version", default="", help="its version (default: the server's choice)"
    )
    parser.add_argument(
        "-i", "--protocol", choices=PROTOCOLS, help="default: grpc for grpc:// URLs, else rest"
    )
    load = parser.add_argument_group("load")
    load.add_argument(
        "--concurrency",
        help="closed loop: requests in flight, e.g. 16, 1,8,64 or 1:64:8 "
        "(start:end:step, as perf_analyzer's --concurrency-range)",
    )
    load.add_argument("--concurrency-range", dest="concurrency", help=argparse.SUPPRESS)
    load.add_argument("--request-rate", help="open loop: requests/s, e.g. 500 or 100,1000 or 100:1000:300")
    load.add_argument("--request-rate-range", dest="request_rate", help=argparse.SUPPRESS)
    load.add_argument("--request-distribution", choices=("constant", "poisson"), default="constant")
    load.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="seconds measured per level in one window (default: stability windows)",
    )
    load.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each level")
    load.add_argument("-p", "--measurement-interval", type=float, default=5000, help="window, ms")
    load.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    load.add_argument("-r", "--max-trials", type=int, default=10, help="windows at most per level")
    load.add_argument("--workers", type=int, default=1, help="load processes (0: one per core)")
    load.add_argument("--connections", type=int, default=4, help="HTTP/2 and gRPC: connections per process")
    load.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open loop over HTTP/1.1 and gRPC streams: connections per process at most",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--input-data", default="random", help="random, zero, or a perf_analyzer JSON file")
    data.add_argument(
        "--shape", action="append", default=[], help="NAME:DIMS for a dynamic input, e.g. IN:3,224"
    )
    data.add_argument("-b", "--batch-size", type=int, default=1)
    data.add_argument("--input-sets", type=int, default=1, help="distinct random requests to cycle through")
    data.add_argument(
        "--verify",
        action="store_true",
        help="compare every answer with a reference run's answer to the same request",
    )
    out = parser.add_argument_group("reports")
    out.add_argument(
        "--compare", metavar="URL2", help="the same plan against a second server, rounds alternating"
    )
    out.add_argument(
        "--rounds", type=int, default=1, help="rounds of the whole plan (alternating with --compare)"
    )
    out.add_argument("--json", type=Path, help="write the levels as a JSON list here")
    out.add_argument("--csv", type=Path, help="write the levels as CSV here")
    out.add_argument("--plot", type=Path, help="throughput against p99 latency, PNG (needs matplotlib)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument("--no-server-stats", action="store_true", help="do not read the server's statistics")
    return parser


def parse_levels(text: str | None, kind: type) -> list:
    if not text:
        return []
    if ":" in text:
        parts = text.split(":")
        start, end = kind(parts[0]), kind(parts[1])
        step = kind(parts[2]) if len(parts) > 2 else kind(1)
        if step <= 0 or end < start:
            raise PerfError(f"{text!r}: start:end:step with end >= start and step > 0")
        values, value = [], start
        while value <= end:
            values.append(value)
            value += step
        return values
    values = [kind(v) for v in text.split(",") if v.strip()]
    if any(v <= 0 for v in values):
        raise PerfError(f"{text!r}: values above 0")
    return values


def endpoint(url: str, protocol: str | None) -> tuple[str, int, str, str]:
    """host, port, protocol, and the HTTP base URL (for metadata and statistics over REST)."""
    if "://" not in url:
        url = ("grpc://" if protocol in GRPC else "http://") + url
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "grpc") or not parsed.hostname:
        raise PerfError(f"{url}: give http://HOST:PORT or grpc://HOST:PORT")
    if protocol is None:
        protocol = "grpc" if parsed.scheme == "grpc" else "rest"
    port = parsed.port or (8001 if protocol in GRPC else 8000)
    host = parsed.hostname
    return host, port, protocol, f"http://{host}:{port}"


async def describe(host: str, port: int, base: str, protocol: str, model: str, version: str) -> ModelSpec:
    if protocol in GRPC:
        return await spec_from_v2_grpc(host, port, model, version)
    if protocol == "tfserving":
        return await asyncio.to_thread(spec_from_tfserving, base, model, version)
    return await asyncio.to_thread(spec_from_v2_rest, base, model, version)


def stats_reader(host: str, port: int, base: str, protocol: str, spec: ModelSpec) -> Any:  # noqa: ANN401
    """An async function reading the model's cumulative statistics, or None where the server has none."""
    version = f"/versions/{spec.version}" if spec.version else ""
    if protocol in GRPC:
        from grpclib.client import Channel

        import tensorgate.proto.inference as pb

        async def read_grpc() -> dict | None:
            channel = Channel(host, port)
            try:
                stub = pb.GrpcInferenceServiceStub(channel)
                answer = await stub.model_statistics(
                    pb.ModelStatisticsRequest(spec.name, spec.version), timeout=5
                )
            except Exception:  # noqa: BLE001 (no statistics extension)
                return None
            finally:
                channel.close()
            total = Counter()
            for entry in answer.model_stats:
                stats = entry.inference_stats
                total.update(
                    success_count=stats.success.count,
                    fail_count=stats.fail.count,
                    queue=stats.queue.ns,
                    compute_input=stats.compute_input.ns,
                    compute_infer=stats.compute_infer.ns,
                    compute_output=stats.compute_output.ns,
                )
            return dict(total)

        return read_grpc

    host_header = f"{host}:{port}"
    path = f"/v2/models/{spec.name}{version}/stats"

    async def read_rest() -> dict | None:
        """On the event loop, not in a thread: a thread would wait for the GIL while the load runs, and
        read the statistics tens of ms after the window's edge."""
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode())
            raw = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            head, _, body = raw.partition(b"\r\n\r\n")
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                return None
            if b"chunked" in head.lower():
                body = dechunk(body)
            doc = json.loads(body)
        except (OSError, ValueError, TimeoutError):
            return None
        total = Counter()
        for entry in doc.get("model_stats", []):
            stats = entry.get("inference_stats", {})
            total.update(
                success_count=stats.get("success", {}).get("count", 0),
                fail_count=stats.get("fail", {}).get("count", 0),
                **{
                    k: stats.get(k, {}).get("ns", 0)
                    for k in ("queue", "compute_input", "compute_infer", "compute_output")
                },
            )
        return dict(total)

    return read_rest


class _References(Checker):
    """The reference run: each request's answer kept, as --verify compares the load's answers with."""

    def __init__(self, protocol: str, spec: ModelSpec) -> None:
        super().__init__(protocol, spec)
        self.answers: dict[int, Any] = {}

    def __call__(self, index: int, answer: Answer) -> str:
        kind = super().__call__(index, answer)
        if not kind and index not in self.answers:
            self.answers[index] = outputs_of(self.protocol, answer)
        return kind


async def reference_run(host: str, port: int, protocol: str, spec: ModelSpec, wires: list) -> list:
    checker = _References(protocol, spec)
    load = Load(Target(host, port, protocol, wires, checker, connections=1))
    await load.start_closed(1)
    try:
        for _ in range(600):
            if len(checker.answers) == len(wires) or load.answered >= 2 * len(wires) + 10:
                break
            await asyncio.sleep(0.01)
    finally:
        await load.stop()
    if len(checker.answers) < len(wires):
        why = "; ".join(f"{k}: {v}" for k, v in checker.examples.items()) or "no answer in 6 s"
        raise PerfError(f"--verify: the reference run did not get every answer ({why})")
    return [checker.answers[i] for i in range(len(wires))]


async def prepare(args: argparse.Namespace, url: str) -> tuple[Target, Any]:
    host, port, protocol, base = endpoint(url, args.protocol)
    spec = await describe(host, port, base, protocol, args.model, args.model_version)
    shapes = request_shapes(spec, parse_shapes(args.shape), args.batch_size)
    validations: list = []
    if args.input_data in ("random", "zero"):
        inputs = generated(spec, shapes, args.input_data, max(1, args.input_sets))
    else:
        inputs, validations = from_file(spec, Path(args.input_data), shapes)
    wires = [encode(protocol, spec, arrays) for arrays in inputs]
    references = None
    if args.verify:
        references = await reference_run(host, port, protocol, spec, wires)
    elif any(v is not None for v in validations):
        references = validations
    checker = Checker(protocol, spec, references)
    target = Target(host, port, protocol, wires, checker, args.connections, args.max_connections)
    stats = None if args.no_server_stats else stats_reader(host, port, base, protocol, spec)
    return target, stats


def merge(results: list[Result]) -> Result:
    """Rounds of one level against one server, as one."""
    first = results[0]
    histogram = Histogram()
    errors: Counter = Counter()
    for r in results:
        histogram.add(r.histogram)
        errors.update(r.errors)
    merged = Result(
        first.level,
        first.target,
        sum(r.seconds for r in results),
        sum(r.ok for r in results),
        errors,
        histogram,
        sum(r.client_cpu for r in results),
        all(r.stable for r in results),
        sum(r.windows for r in results),
        sum(r.delayed for r in results),
    )
    merged.sent = sum(r.sent for r in results)
    merged.answered = sum(r.answered for r in results)
    merged.failed = dict(sum((Counter(r.failed) for r in results), Counter()))
    servers = [r.server for r in results if r.server]
    if servers:
        count = sum(s["requests"] for s in servers)
        merged.server = {"requests": count, "failures": sum(s["failures"] for s in servers)}
        for key in ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us"):
            if count and all(key in s for s in servers):
                merged.server[key] = round(sum(s[key] * s["requests"] for s in servers) / count, 1)
    return merged


async def main_async(args: argparse.Namespace) -> list[Result]:
    levels = [Level(concurrency=c) for c in parse_levels(args.concurrency, int)]
    poisson = args.request_distribution == "poisson"
    levels += [Level(rate=r, poisson=poisson) for r in parse_levels(args.request_rate, float)]
    if not levels:
        levels = [Level(concurrency=1)]
    windows = Windows(
        args.duration,
        args.warmup,
        args.measurement_interval / 1000,
        args.stability_percentage,
        args.max_trials,
    )
    workers = args.workers or cores()
    urls = [args.url] + ([args.compare] if args.compare else [])
    prepared = [await prepare(args, url) for url in urls]
    runners = [start_runners(target, workers) for target, _ in prepared]
    progress = report.progress(len(levels) * len(urls) * args.rounds, not args.no_progress)
    runs: dict[tuple[int, int], list[Result]] = {}
    try:
        for round_number in range(args.rounds):
            for level_number, level in enumerate(levels):
                order = list(range(len(urls)))
                if round_number % 2:
                    order.reverse()
                for which in order:
                    _, stats = prepared[which]
                    label = urls[which]
                    if progress is not None:
                        progress.set_description(f"{level.label} on {label}")
                    result = await run_level(runners[which], level, windows, label, stats, progress)
                    runs.setdefault((which, level_number), []).append(result)
                    if progress is not None:
                        progress.update(1)
    finally:
        if progress is not None:
            progress.close()
        for group in runners:
            for runner in group:
                runner.close()
    results = [merge(runs[(which, n)]) for which in range(len(urls)) for n in range(len(levels))]
    for (target, _), url in zip(prepared, urls, strict=True):
        if target.checker.examples:
            for kind, example in target.checker.examples.items():
                print(f"{url}: {kind}: {example}", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.concurrency and args.request_rate:
        parser.error("--concurrency (closed loop) or --request-rate (open loop), not both")
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    try:
        with runner:
            results = runner.run(main_async(args))
    except PerfError as e:
        print(f"tensorgate perf: {e}", file=sys.stderr)
        return 2
    except (ConnectionError, RuntimeError) as e:
        print(f"tensorgate perf: {e}", file=sys.stderr)
        return 1
    print(report.markdown(results, args))
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")
    if args.csv:
        report.write_csv(results, args.csv)
    if args.plot:
        problem = report.plot(results, args.plot)
        if problem:
            print(f"tensorgate perf: --plot: {problem}", file=sys.stderr)
            return 1
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
