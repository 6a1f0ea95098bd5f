"""python -m bench: the transport ceiling and our server, side by side (see bench/README.md)."""

import argparse
import sys

from bench import crosscheck, report
from bench.harness import SCENARIOS, Options, run_all


def parse_args(argv: list[str] | None = None) -> tuple[Options, str]:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--url", help="drive a server already running here (e.g. http://127.0.0.1:8000)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--h2-connections", type=int, default=4, help="connections the HTTP/2 streams share")
    parser.add_argument("--only", nargs="+", action="extend", choices=SCENARIOS, metavar="NAME",
                        help=f"run only these scenarios: {', '.join(SCENARIOS)}")  # fmt: skip
    parser.add_argument("--out", default="bench/results", help="where the .md and .json results go")
    parser.add_argument("--cross-check", action="store_true", help="also run wrk / h2load where installed")
    parser.add_argument("--binary-mib", type=int, default=64, help="binary payload size, MiB")
    parser.add_argument("--rounds", type=int, default=10, help="timed binary round trips")
    parser.add_argument(
        "--ratio-rounds", type=int, default=5, help="rounds ceiling and JSON loads alternate in"
    )
    parser.add_argument("--model-repository", default="examples/model_repository")
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for the server")
    args = parser.parse_args(argv)
    if args.cross_check and not any(crosscheck.available().values()):
        parser.error("--cross-check needs wrk or h2load on PATH")
    opts = Options(
        url=args.url,
        duration=args.duration,
        warmup=args.warmup,
        concurrency=args.concurrency,
        h2_connections=args.h2_connections,
        only=args.only or list(SCENARIOS),
        cross_check=args.cross_check,
        binary_mib=args.binary_mib,
        rounds=args.rounds,
        ratio_rounds=max(1, args.ratio_rounds),
        model_repository=args.model_repository,
        server_args=args.server_arg,
    )
    return opts, args.out


def main(argv: list[str] | None = None) -> int:
    opts, out_dir = parse_args(argv)
    info = report.machine()
    if info["loadavg_1min"] > 0.5:
        print(
            f"warning: load average {info['loadavg_1min']:.2f}: other work shares these cores",
            file=sys.stderr,
        )
    results, log = run_all(opts)
    sys.stdout.write(report.render(results, opts, info, log))
    base = report.write(results, opts, info, log, out_dir)
    print(f"results: {base}.md, {base}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
