"""The Performance pages' plots, drawn at build time from `bench/results/*.json` (an MkDocs hook).

mkdocs.yml names this file under `hooks:`. On every build, `on_files` reads the results files below,
draws each plot as an SVG with matplotlib (its `Figure` class directly, so no GUI backend is involved) and
adds it to the build as the generated file `performance/plots/NAME.svg`. The pages link `plots/NAME.svg`;
nothing is written into docs/ and nothing generated is committed. The SVGs are deterministic: a fixed
`svg.hashsalt`, no date in their metadata, text kept as text.

A results file that is missing, is not JSON, or lacks a figure a plot reads fails the build with a
PluginError that names the plot and the file: no plot is drawn empty.

The plots (every results file is under bench/results/; all from the 2-core VM):

- `cpu-per-request.svg` (2026-11-29-hotpath.json, `python -m bench.hotpath`): server CPU per request on
  `simple` (the median of the rounds, every process of the server) for each protocol, for the compiled
  build, the same tree in pure Python, the commit before, Triton 2.51 on its C++ backend and uvicorn's bare
  app.
- `versus-triton.svg` (2026-11-29-hotpath.json and 2026-11-29-workers.json, `bench.hotpath` and
  `bench.workers`): ours / Triton 2.51 for server CPU per request and for requests/s, each the median of the
  per-round ratios, for one process (both runs) and for `--workers 2`.
- `throughput-concurrency.svg` (2026-11-25-batching.json and 2026-11-25-batching-onnx_mlp.json,
  `bench.batching`): requests/s against concurrency (1, 8, 64) for the example MLP and its ONNX twin, with
  dynamic batching on and off.
- `latency-concurrency.svg` (2026-11-25-batching.json): p50 and p99 latency against concurrency for the
  example MLP, dynamic batching on and off.
- `latency-percentiles.svg` (2026-11-27-perf-versus.json, `bench.perf_versus`): p50 and p99 latency of
  `simple` on our server as `tensorgate perf` and Triton's perf_analyzer measure it, closed loop at
  concurrency 16 and open loop at 4,000 requests/s, over HTTP and gRPC (medians of the rounds).
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

# The repository root: this file is docs/hooks/plots.py. Derived from the file, not from the config, so
# that a config elsewhere (a copy of the site in a temporary folder) still finds the results.
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OUT = "performance/plots"

STYLE: dict[Any, Any] = {  # matplotlib rcParams for every plot
    "svg.hashsalt": "tensorgate-docs",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#dddddd",
    "legend.frameon": False,
    "legend.fontsize": 8,
}
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]

Data = Any  # a results file as json.loads gives it


@dataclass(frozen=True)
class Plot:
    name: str
    sources: tuple[str, ...]  # file names under bench/results/, passed to draw in this order
    draw: Callable[..., Figure]


def number(value: object) -> float:
    """A plotted figure: a finite number, or the results file is malformed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def median_ratio(rounds: dict, key: str, other: str, field: str) -> float:
    """The median over rounds of `key`'s figure / `other`'s, as bench.hotpath and bench.workers count it."""
    pairs = list(zip(rounds[key], rounds[other], strict=True))
    ratios = [number(a[field]) / number(b[field]) for a, b in pairs if number(b[field])]
    if not ratios:
        raise ValueError(f"no rounds for {key} / {other}")
    return statistics.median(ratios)


def figure(width: float = 7.5, height: float = 3.4) -> Figure:
    """A white figure (legible on a dark page too) whose parts are laid out to fit."""
    return Figure(figsize=(width, height), facecolor="white", layout="constrained")


def grouped_bars(
    ax: Axes,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    fmt: str,
    colors: Sequence[str] = COLORS,
) -> None:
    """Bars for each series within each group, each labelled with its value; a None leaves its place empty."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        bars = ax.bar(xs, ys, width * 0.92, label=label, color=colors[i % len(colors)])
        ax.bar_label(bars, fmt=fmt, fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.grid(axis="x", visible=False)


# --- the plots --------------------------------------------------------------------------------------

HOTPATH_SCENARIOS = {
    "json-h1": "REST JSON\n(wrk -c16)",
    "binary-h1": "REST binary tensors\n(wrk -c16)",
    "grpc": "gRPC ModelInfer\n(h2load -c8 -m4)",
    "json-h2": "JSON over h2c\n(h2load -c8 -m4)",
}


def cpu_per_request(hotpath: Data) -> Figure:
    """Server CPU per request on `simple`, by protocol and server (2026-11-29-hotpath.json)."""
    everywhere, rest_and_grpc = list(HOTPATH_SCENARIOS), ["json-h1", "binary-h1", "grpc"]
    servers = {  # label: (the server's key in the file, the scenarios it was driven in)
        "ours, compiled": ("ours", everywhere),
        "ours, pure Python": ("pure", everywhere),
        "the commit before": ("baseline", everywhere),
        "Triton 2.51 (C++)": ("triton", rest_and_grpc),
        "uvicorn bare app (fixed bytes)": ("uvicorn-bare", ["json-h1"]),
    }
    results = hotpath["results"]
    series = {
        label: [number(results[s][key]["cpu_us"]) if s in driven else None for s in HOTPATH_SCENARIOS]
        for label, (key, driven) in servers.items()
    }
    fig = figure()
    ax = fig.add_subplot()
    grouped_bars(ax, list(HOTPATH_SCENARIOS.values()), series, "%.1f")
    ax.set_ylabel("server CPU per request (µs)")
    ax.set_title("simple on the 2-core VM, 2026-11-29: the median of 5 alternating rounds (lower is better)")
    fig.legend(ncols=3, loc="outside lower center")
    return fig


def versus_triton(hotpath: Data, workers: Data) -> Figure:
    """Ours / Triton's CPU per request and requests/s (2026-11-29-hotpath.json, 2026-11-29-workers.json)."""
    scenarios = {k: v for k, v in HOTPATH_SCENARIOS.items() if k != "json-h2"}  # Triton has no h2c
    hp, wk = hotpath["results"], workers["results"]

    def ratios(results: Data, key: str, field: str, driven: Sequence[str]) -> list[float | None]:
        return [
            median_ratio(results[s]["rounds"], key, "triton", field) if s in driven else None
            for s in scenarios
        ]

    fig = figure(height=3.2)
    for n, (field, title) in enumerate(
        [
            ("cpu_us", "server CPU per request, ours / Triton (lower: we cost less)"),
            ("rps", "requests/s, ours / Triton (higher: we answer more)"),
        ]
    ):
        ax = fig.add_subplot(1, 2, n + 1)
        series = {
            "one process (bench.hotpath run)": ratios(hp, "ours", field, list(scenarios)),
            "--workers 1 (bench.workers run)": ratios(wk, "w1", field, ["json-h1", "grpc"]),
            "--workers 2 (bench.workers run)": ratios(wk, "w2", field, ["json-h1", "grpc"]),
        }
        grouped_bars(ax, list(scenarios.values()), series, "%.2f")
        ax.axhline(1.0, color="#555555", linewidth=0.8)
        ax.set_ylim(0, 1.35)
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=7)
        if n == 0:
            ax.set_ylabel("ratio, median of the per-round ratios")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, ncols=3, loc="outside lower center")
    fig.suptitle("simple beside Triton 2.51 on its C++ backend, 2-core VM, 2026-11-29", fontsize=9)
    return fig


def batching_rows(rows: Data, batching: str) -> tuple[list[float], list[dict]]:
    """A bench.batching file's rows with batching "on" or "off", by concurrency, and those concurrencies."""
    chosen = sorted((r for r in rows if r["batching"] == batching), key=lambda r: number(r["concurrency"]))
    if len(chosen) < 2:
        raise ValueError(f"fewer than two concurrencies with batching {batching}")
    return [number(r["concurrency"]) for r in chosen], chosen


def concurrency_axis(ax: Axes, levels: list[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [f"{c:g}" for c in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight, one row each, binary tensors over HTTP/1.1)")


def throughput_concurrency(mlp: Data, onnx_mlp: Data) -> Figure:
    """Requests/s against concurrency, batching on and off (2026-11-25-batching*.json)."""
    fig = figure(height=3.4)
    ax = fig.add_subplot()
    levels: list[float] = []
    for rows, model, style in [(mlp, "MLP (TorchScript)", "-"), (onnx_mlp, "ONNX twin (onnxruntime)", "--")]:
        for batching, color in [("on", COLORS[0]), ("off", COLORS[1])]:
            xs, chosen = batching_rows(rows, batching)
            ys = [number(r["rps"]) for r in chosen]
            ax.plot(xs, ys, style, marker="o", color=color, label=f"{model}, dynamic batching {batching}")
            levels = sorted(set(levels) | set(xs))
    concurrency_axis(ax, levels)
    gains = []
    for rows, model in [(mlp, "MLP"), (onnx_mlp, "ONNX twin")]:
        xs, on = batching_rows(rows, "on")
        _, off = batching_rows(rows, "off")
        gains.append(f"{model} {number(on[-1]['rps']) / number(off[-1]['rps']):.2f}x")
    ax.text(
        0.98,
        0.45,
        f"batching on / off at {xs[-1]:g}:\n" + ", ".join(gains),
        transform=ax.transAxes,
        ha="right",
        fontsize=8,
    )
    ax.yaxis.set_major_formatter(lambda y, _: f"{y:,.0f}")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput against concurrency, example MLP, 2-core VM, 2026-11-25")
    ax.legend(loc="upper left")
    return fig


def latency_concurrency(mlp: Data) -> Figure:
    """p50 and p99 against concurrency, batching on and off, TorchScript MLP (2026-11-25-batching.json)."""
    fig = figure(height=3.4)
    ax = fig.add_subplot()
    levels: list[float] = []
    for batching, color in [("on", COLORS[0]), ("off", COLORS[1])]:
        xs, chosen = batching_rows(mlp, batching)
        for field, style in [("p50_ms", "-"), ("p99_ms", ":")]:
            ys = [number(r[field]) for r in chosen]
            label = f"{field[:3]}, dynamic batching {batching}"
            ax.plot(xs, ys, style, marker="o", color=color, label=label)
            for x, y in list(zip(xs, ys, strict=True))[1:]:  # at 1 in flight the four nearly meet
                ax.annotate(
                    f"{y:.2f}", (x, y), xytext=(4, 0), textcoords="offset points", fontsize=7, va="center"
                )
        levels = sorted(set(levels) | set(xs))
    concurrency_axis(ax, levels)
    ax.set_yscale("log")
    ticks = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200]
    low, high = ax.get_ylim()
    ax.set_yticks([t for t in ticks if low <= t <= high], [f"{t:g}" for t in ticks if low <= t <= high])
    ax.minorticks_off()
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("Latency percentiles against concurrency, example MLP (TorchScript), 2-core VM, 2026-11-25")
    ax.legend(loc="upper left")
    return fig


def latency_percentiles(perf_versus: Data) -> Figure:
    """p50 and p99 of `simple` by client, closed and open loop (2026-11-27-perf-versus.json)."""

    def medians(key: str) -> dict[str, float]:
        rounds = perf_versus[key]
        if not rounds:
            raise ValueError(f"no rounds for {key}")
        return {f: statistics.median(number(r[f]) for r in rounds) for f in ("rate", "p50_us", "p99_us")}

    fig = figure(height=3.4)
    for n, loop in enumerate(["closed", "open"]):
        ax = fig.add_subplot(1, 2, n + 1)
        groups = {"http": "HTTP (binary tensors)", "grpc": "gRPC ModelInfer"}
        series: dict[str, list[float | None]] = {}
        rates: list[float] = []
        for client in ["tensorgate perf", "perf_analyzer"]:
            figures = [medians(f"{proto} {loop}|{client}") for proto in groups]
            rates += [m["rate"] for m in figures]
            for p in ["p50", "p99"]:
                series[f"{client}, {p}"] = [m[f"{p}_us"] / 1000 for m in figures]
        grouped_bars(ax, list(groups.values()), series, "%.2f", ["#9ecae1", "#1f77b4", "#fdbe85", "#e6550d"])
        if loop == "closed":
            ax.set_title("closed loop, 16 requests in flight")
        else:
            ax.set_title(f"open loop, {statistics.median(rates):,.0f} requests/s")
        if n == 0:
            ax.set_ylabel("latency (ms), median of 3 rounds")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, ncols=4, loc="outside lower center")
    fig.suptitle("simple on our server, as two clients measure it, 2-core VM, 2026-11-27", fontsize=9)
    return fig


PLOTS = [
    Plot("cpu-per-request", ("2026-11-29-hotpath.json",), cpu_per_request),
    Plot("versus-triton", ("2026-11-29-hotpath.json", "2026-11-29-workers.json"), versus_triton),
    Plot(
        "throughput-concurrency",
        ("2026-11-25-batching.json", "2026-11-25-batching-onnx_mlp.json"),
        throughput_concurrency,
    ),
    Plot("latency-concurrency", ("2026-11-25-batching.json",), latency_concurrency),
    Plot("latency-percentiles", ("2026-11-27-perf-versus.json",), latency_percentiles),
]


# --- building them ----------------------------------------------------------------------------------


def load(plot: str, name: str) -> Data:
    path = RESULTS / name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PluginError(f"plots.py: {path} is missing; the plot {plot}.svg is drawn from it") from None
    except (OSError, ValueError) as exc:
        raise PluginError(f"plots.py: {path} cannot be read as JSON ({exc}); plot {plot}.svg") from None


def svg(plot: Plot) -> bytes:
    """The plot drawn from its results files, as SVG bytes (PluginError if a file lacks a figure)."""
    with matplotlib.rc_context(STYLE):
        data = [load(plot.name, name) for name in plot.sources]
        try:
            fig = plot.draw(*data)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
            files = ", ".join(f"bench/results/{name}" for name in plot.sources)
            raise PluginError(
                f"plots.py: cannot draw {plot.name}.svg from {files}: {type(exc).__name__}: {exc} "
                "(a figure missing or malformed there?)"
            ) from exc
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Every plot added to the build as performance/plots/NAME.svg."""
    for plot in PLOTS:
        files.append(File.generated(config, f"{OUT}/{plot.name}.svg", content=svg(plot)))
    return files


def on_serve(server: Any, config: MkDocsConfig, builder: Callable[..., Any]) -> Any:
    """`mkdocs serve` redraws the plots when a results file changes."""
    server.watch(str(RESULTS))
    return server


if __name__ == "__main__":  # python docs/hooks/plots.py DIR: the plots as files, to look at them
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for plot in PLOTS:
        (target / f"{plot.name}.svg").write_bytes(svg(plot))
        print(target / f"{plot.name}.svg")
