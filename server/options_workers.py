"""`tensorgate serve`'s worker flags: how many front-end processes serve the ports (--workers, and the CPUs
`auto` counts), whether the engine is one of them, and what a worker and the engine share and wait for."""

import argparse
import math
import os
from pathlib import Path

from tensorgate.server.options_values import boolean, not_negative, positive_int


def add_worker_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N|auto",
        help="front-end processes serving the same ports, each on its own core: the engine (which also holds "
        "the models and their batchers) and N - 1 workers beside it; auto: one per CPU the process may "
        "use (its cgroup's CPU limit, rounded up, and its affinity) (default 1: one process)",
    )
    serve.add_argument(
        "--engine-front-end",
        type=boolean,
        default=True,
        metavar="true|false",
        help="with --workers N: whether the engine accepts connections beside its N - 1 workers (default "
        "true); false: only the workers accept them, every request crosses to the engine, and the engine's "
        "core is left to the models",
    )
    serve.add_argument(
        "--worker-arena-bytes",
        type=_arena_bytes,
        default=2 << 30,
        metavar="BYTES",
        help="with --workers: the shared memory each worker and the engine each have for the large tensors "
        "(64 KiB and up) they send each other, request bodies from 1 MiB included; a request that finds it "
        "full is refused (resource exhausted). Pages exist only once used (default 2147483648)",
    )
    serve.add_argument(
        "--worker-call-timeout",
        type=not_negative(float),
        default=300.0,
        metavar="SECONDS",
        help="with --workers: how long a worker waits for the engine to answer a call (a stream: for its "
        "next message) before it answers the client 'unavailable' and cancels the call; a gRPC deadline "
        "ends a call sooner. 0: no limit (default 300)",
    )
    serve.add_argument(
        "--worker-max-calls",
        type=not_negative(int),
        default=4096,
        metavar="N",
        help="with --workers: inference calls of one worker that may wait in the engine at once; past it "
        "the engine stops reading that worker's requests until half are answered, and the worker's next "
        "ones wait (default 4096; 0: no limit)",
    )
    serve.add_argument(
        "--worker-models",
        choices=("engine", "inline"),
        default="engine",
        help="with --workers: where inference runs. engine (the default): every model in the engine, where "
        "each worker's requests cross to; inline: a model that runs each request at once on the event loop "
        "(a plain numpy execute of our python API: no batcher, cache, stream, rate limit or device) also "
        "loads in every worker, which answers its requests without the hop. Its instances then keep no state "
        "in common, and each worker holds a copy of the model",
    )
    serve.add_argument("--worker-of", help=argparse.SUPPRESS)  # set by the engine for each worker it starts


def _arena_bytes(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {text!r}") from None
    if size < 1 << 20:
        raise argparse.ArgumentTypeError("must be at least 1048576 (1 MiB)")
    return size


def _workers(text: str) -> int:
    if text == "auto":
        return available_cpus()
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (or auto)") from None


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's CPU limit (a container's
    `resources.limits.cpu`, cgroup v2's cpu.max or v1's cfs quota), rounded up."""
    count = len(os.sched_getaffinity(0))
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return count
    if quota in ("max", "-1"):
        return count
    return max(1, min(count, math.ceil(int(quota) / int(period))))
