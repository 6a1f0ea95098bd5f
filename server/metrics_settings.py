"""The metrics page's settings, from the command line: `--metrics-config` (which latencies: counters,
the first-response histogram, the summaries and their quantiles and window), `--allow-cpu-metrics`,
`--allow-gpu-metrics` and `--metrics-interval-ms` (the polled gauges). Bad values as Triton takes them:
each logged, its default kept.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

log = logging.getLogger("tensorgate.metrics")

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))


@dataclass
class Settings:
    """What the metrics page serves, from --metrics-config, --allow-cpu-metrics, --allow-gpu-metrics
    and --metrics-interval-ms."""

    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    max_age_s: float = 60.0  # prometheus-cpp's summary window, which Triton keeps
    age_buckets: int = 5
    cpu: bool = False
    gpu: bool = False
    interval_s: float = 2.0


def settings_from(args: argparse.Namespace) -> Settings:
    """The Settings of a command line. Triton's way with bad values: each is logged, its default kept."""
    settings = Settings(
        cpu=args.allow_cpu_metrics,
        gpu=args.allow_gpu_metrics,
        interval_s=max(args.metrics_interval_ms, 1.0) / 1000,
    )
    for entry in args.metrics_config:
        setting, equals, value = entry.partition("=")
        if not equals:
            log.error("--metrics-config %s: expected <setting>=<value>", entry)
        elif setting in ("counter_latencies", "histogram_latencies", "summary_latencies"):
            # As Triton reads them: counters go only with "false", the others come only with "true".
            default = setting == "counter_latencies"
            setattr(settings, setting, value != "false" if default else value == "true")
        elif setting == "summary_quantiles":
            settings.quantiles = _quantiles(value) or settings.quantiles
        elif setting in ("summary_max_age", "summary_age_buckets"):
            try:
                number = float(value) if setting == "summary_max_age" else int(value)
            except ValueError:
                number = 0
            if number <= 0:
                log.error("--metrics-config %s: expected a positive number", entry)
            elif setting == "summary_max_age":
                settings.max_age_s = float(number)
            else:
                settings.age_buckets = int(number)
        else:
            log.warning("--metrics-config %s: unknown setting, ignored", entry)
    return settings


def _quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`0.5:0.05,0.9:0.01`, pairs Triton cannot read logged with its texts and left out."""
    pairs = []
    for pair in text.split(","):
        quantile, colon, error = pair.partition(":")
        if not colon:
            log.error(
                "Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", pair
            )
            continue
        try:
            pairs.append((float(quantile), float(error)))
        except ValueError as e:
            log.error("Invalid option: [%s]. Error: %s", pair, e)
    return tuple(pairs)


configured = Settings()  # the server's, set by configure() before the metrics port is built


def configure(args: argparse.Namespace) -> None:
    """Reads the command line's metrics settings, for `metrics_router` (server/engine.py)."""
    global configured
    configured = settings_from(args)
