"""What `tensorgate perf` shows: a progress bar while it runs (tqdm, on stderr), then a markdown table on
stdout; CSV and a throughput/latency plot (matplotlib, an optional extra) on request. The JSON is
Result.to_json (perf/run.py), one object per level and server."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from tensorgate.perf.run import Result


def progress(total: int, enabled: bool) -> Any:  # noqa: ANN401
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="level", file=sys.stderr, dynamic_ncols=True, leave=False)


def _ms(us: float) -> str:
    return "-" if us != us else f"{us / 1000:.3f}"  # noqa: PLR0124 (NaN)


def markdown(results: list[Result], args: argparse.Namespace) -> str:
    lines = [
        f"# tensorgate perf: model '{args.model}', {args.protocol or 'default protocol'}",
        "",
        "| server | load | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors "
        "| client CPU µs/req | server queue / compute µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        doc = r.to_json()
        latency = doc["latency_us"]
        errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "0"
        server = "-"
        if r.server and "queue_us" in r.server:
            server = f"{r.server['queue_us']} / {r.server.get('compute_infer_us', 0)}"
        stable = "" if r.stable else " (unstable)"
        times = " | ".join(_ms(latency[k]) for k in ("p50", "p90", "p99", "p999", "max"))
        lines.append(
            f"| {r.target} | {r.level.label}{stable} | {r.requests_per_s:,.0f} | {times} | {errors} "
            f"| {doc['client_cpu_us_per_request']} | {server} |"
        )
    if args.compare:
        lines += [
            "",
            f"Ratios, {args.compare} / {args.url}:",
            "",
            "| load | req/s | p50 | p99 |",
            "|---|---|---|---|",
        ]
        half = len(results) // 2
        for a, b in zip(results[:half], results[half:], strict=True):
            la, lb = a.histogram.summary(), b.histogram.summary()
            lines.append(
                f"| {a.level.label} | {b.requests_per_s / max(a.requests_per_s, 1e-9):.2f}x | "
                f"{lb['p50'] / la['p50']:.2f}x | {lb['p99'] / la['p99']:.2f}x |"
            )
    return "\n".join(lines)


FIELDS = (
    "target",
    "concurrency",
    "request_rate",
    "requests_per_s",
    "requests",
    "errors",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "client_cpu_us_per_request",
    "server_queue_us",
    "server_compute_infer_us",
)


def write_csv(results: list[Result], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        for r in results:
            doc = r.to_json()
            latency = doc["latency_us"]
            writer.writerow(
                {
                    "target": r.target,
                    "concurrency": doc.get("concurrency", ""),
                    "request_rate": doc.get("request_rate", ""),
                    "requests_per_s": doc["requests_per_s"],
                    "requests": doc["requests"],
                    "errors": doc["errors"],
                    **{f"{k}_us": latency[k] for k in ("p50", "p90", "p99", "p999", "max")},
                    "client_cpu_us_per_request": doc["client_cpu_us_per_request"],
                    "server_queue_us": r.server.get("queue_us", ""),
                    "server_compute_infer_us": r.server.get("compute_infer_us", ""),
                }
            )


def plot(results: list[Result], path: Path) -> str:
    """Throughput (x) against p99 latency (y), a line a server: '' once written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'tensorgate[plot]')"
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for target in dict.fromkeys(r.target for r in results):
        mine = [r for r in results if r.target == target]
        xs = [r.requests_per_s for r in mine]
        ys = [r.histogram.percentile(99) / 1000 for r in mine]
        axes.plot(xs, ys, marker="o", label=target)
        for r, x, y in zip(mine, xs, ys, strict=True):
            axes.annotate(
                r.level.label.split()[-1], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    axes.set_xlabel("requests/s")
    axes.set_ylabel("p99 latency, ms")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return ""
