"""`tensorgate serve`'s observability flags: the Prometheus metrics (whether they are served, which
families, how often they are read, Triton's metrics settings), the log (server/log_settings.py's flags) and
the trace. The metrics port itself is a port flag (options_ports.py)."""

import argparse

from tensorgate.server import log_settings
from tensorgate.server.options_values import boolean


def add_observability_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--allow-metrics",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="serve Prometheus metrics on --metrics-port (default true)",
    )
    serve.add_argument(
        "--allow-cpu-metrics",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="Triton's nv_cpu_utilization and nv_cpu_memory_* on /metrics, read from /proc (default true)",
    )
    serve.add_argument(
        "--allow-gpu-metrics",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="Triton's nv_gpu_* and nv_energy_consumption on /metrics, read through NVML (the gpu extra's "
        "nvidia-ml-py); absent without a GPU (default true)",
    )
    serve.add_argument(
        "--metrics-interval-ms",
        type=float,
        default=2000.0,
        metavar="MS",
        help="how often the CPU, GPU and pinned memory metrics are read again (default 2000)",
    )
    serve.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="Triton's metrics settings (repeatable): counter_latencies, histogram_latencies, "
        "summary_latencies (true|false), summary_quantiles (q:error,...), summary_max_age (ms), "
        "summary_age_buckets (docs/operations/metrics.md)",
    )
    log_settings.add_arguments(serve, boolean)
    serve.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings (repeatable): rate=N (default 1000), level=TIMESTAMPS|TENSORS|OFF "
        "(default OFF), count=N (default -1), mode=triton|opentelemetry, triton,file=PATH, "
        "triton,log-frequency=N, opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
        "opentelemetry,bsp_max_queue_size=N, opentelemetry,bsp_schedule_delay=MS, "
        "opentelemetry,bsp_max_export_batch_size=N",
    )
