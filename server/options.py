"""The command line: `tensorgate serve`'s flags, and the transport limits they set."""

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from tensorgate.batcher.rate_limiter import resource_flag
from tensorgate.server import log_settings, restricted
from tensorgate.server.backends.python import EXECUTION_MODES
from tensorgate.server.endpoints.customized import CTRL_MODES
from tensorgate.server.http.connection import HttpSettings
from tensorgate.server.repository import CONTROL_MODES

GRPC_MAX_MESSAGE = (1 << 31) - 1  # protobuf cannot encode a larger message


def build_parser() -> argparse.ArgumentParser:
    """`tensorgate serve`'s arguments (server/cli.py dispatches the subcommands)."""
    serve = argparse.ArgumentParser(prog="tensorgate serve", description="Serve a model repository.")
    serve.add_argument(
        "--model-repository",
        action="append",
        required=True,
        metavar="PATH|URL",
        help="a model repository: a directory, or s3://bucket/path (s3://host:port/bucket/path: an "
        "S3-compatible endpoint), gs://bucket/path, as://account/container/path (the cloud extra). "
        "Repeatable: the models of every repository are served together",
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    for port, fallback in (("http", "--host"), ("grpc", "--host"), ("metrics", "--http-address")):
        serve.add_argument(
            f"--{port}-address",
            default=None,
            metavar="ADDRESS",
            help=f"Triton's: the address the {port} port listens on (default {fallback})",
        )
    for port in ("http", "grpc"):
        serve.add_argument(
            f"--allow-{port}",
            type=_boolean,
            nargs="?",
            const=True,
            default=True,
            metavar="true|false",
            help=f"Triton's: open the {port} port (default true)",
        )
    serve.add_argument(
        "--id", default="tensorgate", help="the server's name in the v2 server metadata (default tensorgate)"
    )
    serve.add_argument(
        "--http-port", type=int, default=8000, help="HTTP port; 0 picks a free one (default 8000)"
    )
    serve.add_argument(
        "--grpc-port", type=int, default=8001, help="gRPC port; 0 picks a free one (default 8001)"
    )
    serve.add_argument(
        "--grpc-max-message-bytes",
        type=int,
        default=GRPC_MAX_MESSAGE,
        help="largest gRPC message received or sent, in bytes (default 2 GiB - 1, protobuf's limit)",
    )
    serve.add_argument(
        "--grps-default-model",
        default=None,
        help="grps: the model a request without `model` goes to (default: the only model, if one)",
    )
    serve.add_argument(
        "--grps-customized-predict-http",
        default=None,
        metavar="PATH",
        help="grps: serve customized HTTP on PATH, answered by a python model's handle_http (default: off)",
    )
    serve.add_argument(
        "--grps-streaming-ctrl-mode",
        choices=CTRL_MODES,
        default="query_param",
        help="grps: how a request asks for a streamed answer (default query_param: ?streaming=true)",
    )
    serve.add_argument(
        "--grps-streaming-ctrl-key",
        default="streaming",
        help="grps: the query parameter, header or JSON body key that asks for streaming (default streaming)",
    )
    serve.add_argument(
        "--grps-streaming-res-content-type",
        default="application/octet-stream",
        help="grps: the content type of streamed answers (default application/octet-stream)",
    )
    serve.add_argument(
        "--monitor-log",
        type=Path,
        default=None,
        metavar="PATH",
        help="grps: rewrite PATH every second with every monitor metric, as grps_monitor.log (default: off)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=1 << 30,
        help="largest request body accepted, in bytes (default 1 GiB); larger ones get 413",
    )
    serve.add_argument(
        "--http-max-input-size",
        type=_positive_int,
        default=1 << 26,
        metavar="BYTES",
        help="Triton's: the largest request JSON, and the most tensor bytes a JSON request's inputs may "
        "expand to, of REST infer and generate (default 64 MiB)",
    )
    serve.add_argument(
        "--http-server",
        choices=("tensorgate", "hypercorn"),
        default="tensorgate",
        help="the HTTP transport: tensorgate (our own, on httptools and our HTTP/2 frames) or hypercorn "
        "(the reference ASGI server, same endpoints); default tensorgate",
    )
    serve.add_argument("--ssl-certfile", default=None, help="serve HTTP over TLS with this certificate (PEM)")
    serve.add_argument("--ssl-keyfile", default=None, help="the private key of --ssl-certfile (PEM)")
    serve.add_argument(
        "--ssl-ca-certs",
        default=None,
        metavar="PEM",
        help="mutual TLS on the HTTP port: a client must present a certificate these CAs signed (needs "
        "--ssl-certfile)",
    )
    serve.add_argument(
        "--grpc-use-ssl",
        type=_boolean,
        default=False,
        metavar="true|false",
        help="serve the gRPC port over TLS with --grpc-server-cert and --grpc-server-key (default false: "
        "cleartext)",
    )
    serve.add_argument(
        "--grpc-use-ssl-mutual",
        type=_boolean,
        default=False,
        metavar="true|false",
        help="the gRPC port over mutual TLS: a client must present a certificate --grpc-root-cert signed "
        "(implies --grpc-use-ssl; default false)",
    )
    serve.add_argument("--grpc-server-cert", default=None, metavar="PEM", help="the gRPC port's certificate")
    serve.add_argument("--grpc-server-key", default=None, metavar="PEM", help="the gRPC port's private key")
    serve.add_argument(
        "--grpc-root-cert", default=None, metavar="PEM", help="with --grpc-use-ssl-mutual: the CAs whose "
        "certificates gRPC clients must present",
    )  # fmt: skip
    limits = HttpSettings()
    serve.add_argument(
        "--http-max-head-bytes",
        type=int,
        default=limits.max_head_bytes,
        help="largest request head (HTTP/1.1 line + headers, HTTP/2 header list); larger ones get 431 "
        f"(default {limits.max_head_bytes})",
    )
    serve.add_argument(
        "--http-head-timeout",
        type=float,
        default=limits.head_timeout,
        help="seconds a request head may take to arrive; then 408 and close "
        f"(default {limits.head_timeout:g})",
    )
    serve.add_argument(
        "--http-body-timeout",
        type=float,
        default=limits.body_timeout,
        help="seconds a request body may go without a byte arriving; then 408 (default "
        f"{limits.body_timeout:g})",
    )
    serve.add_argument(
        "--http-keep-alive-timeout",
        type=float,
        default=limits.keep_alive_timeout,
        help=f"seconds an idle connection is kept open (default {limits.keep_alive_timeout:g})",
    )
    serve.add_argument(
        "--http-max-connections",
        type=int,
        default=limits.max_connections,
        help="open connections per port in each serving process (each worker's with --workers); more are "
        "answered 503 and closed "
        f"(default {limits.max_connections})",
    )
    serve.add_argument(
        "--http2-max-concurrent-streams",
        type=int,
        default=limits.h2_max_concurrent_streams,
        help="HTTP/2 streams open at once per connection; more are refused (REFUSED_STREAM) "
        f"(default {limits.h2_max_concurrent_streams})",
    )
    serve.add_argument(
        "--http2-max-resets-per-second",
        type=int,
        default=limits.h2_max_resets_per_second,
        help="HTTP/2 streams a client may reset per second before GOAWAY ENHANCE_YOUR_CALM (rapid reset) "
        f"(default {limits.h2_max_resets_per_second})",
    )
    serve.add_argument(
        "--http2-max-control-frames-per-second",
        type=int,
        default=limits.h2_max_control_frames_per_second,
        help="HTTP/2 SETTINGS, PING, PRIORITY, WINDOW_UPDATE and empty DATA frames a client may send per "
        "second, beyond ten for each write of answer frames it was sent that second (a client reading "
        "answers sends some), before GOAWAY ENHANCE_YOUR_CALM "
        f"(default {limits.h2_max_control_frames_per_second})",
    )
    serve.add_argument(
        "--grpc-http2-min-recv-ping-interval-without-data",
        type=int,
        default=int(limits.h2_min_ping_interval * 1000),
        metavar="MS",
        help="HTTP/2 (gRPC) keepalive: milliseconds a client must leave between PINGs while no answer is "
        "sent; sooner is a strike (default %(default)s, grpc-core's and Triton's)",
    )
    serve.add_argument(
        "--grpc-http2-max-ping-strikes",
        type=int,
        default=limits.h2_max_ping_strikes,
        help="HTTP/2 (gRPC) keepalive: strikes allowed before GOAWAY ENHANCE_YOUR_CALM 'too_many_pings' "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--grpc-keepalive-time",
        type=_positive_int,
        default=7_200_000,
        metavar="MS",
        help="gRPC keepalive: milliseconds between the server's keepalive PINGs on a connection (default "
        "%(default)s, Triton's)",
    )
    serve.add_argument(
        "--grpc-keepalive-timeout",
        type=_positive_int,
        default=20_000,
        metavar="MS",
        help="gRPC keepalive: milliseconds a keepalive PING's ACK may take before the connection is closed "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--grpc-keepalive-permit-without-calls",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="true|false",
        help="gRPC keepalive: PINGs also on connections with no call in flight (default false)",
    )
    serve.add_argument(
        "--grpc-http2-max-pings-without-data",
        type=int,
        default=2,
        metavar="N",
        help="gRPC keepalive: PINGs the server sends with no answer frame between them; more wait for one "
        "(0: no limit; default %(default)s)",
    )
    serve.add_argument(
        "--grpc-max-connection-age",
        type=int,
        default=0,
        metavar="MS",
        help="milliseconds (+-10%% jitter) after which a gRPC connection gets a graceful GOAWAY: its calls "
        "finish, the client reconnects, and L4 load balancers rebalance (default 0: none)",
    )
    serve.add_argument(
        "--grpc-max-connection-age-grace",
        type=int,
        default=0,
        metavar="MS",
        help="milliseconds the calls in flight have after the maximum age before the connection is closed "
        "(default 0: as long as they take)",
    )
    serve.add_argument(
        "--grpc-infer-response-compression-level",
        type=str.lower,
        choices=("none", "low", "medium", "high"),
        default="none",
        help="compression of ModelInfer and ModelStreamInfer answers, among the encodings the client accepts "
        "(low gzip; medium and high deflate when accepted, as gRPC's core picks; default none)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=limits.graceful_timeout,
        help="seconds requests in flight have to finish once SIGTERM arrives (default "
        f"{limits.graceful_timeout:g})",
    )
    serve.add_argument(
        "--model-control-mode",
        type=str.lower,
        choices=CONTROL_MODES,
        default="none",
        help="none: load every model at start, refuse load/unload; explicit: load the --load-model ones, "
        "then obey the repository API; poll: follow the repository's changes (default none)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*' loads all)",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        help="poll mode: seconds between scans of the repository (default 15)",
    )
    serve.add_argument(
        "--python-execution-mode",
        type=str.lower,
        choices=EXECUTION_MODES,
        default="auto",
        help="where python models whose config sets no EXECUTION_MODE run their instances: process (each in "
        "a process of its own), thread (threads of the server), or auto: process for a model.py written for "
        "Triton's API (triton_python_backend_utils), as Triton runs it, thread for ours (default auto)",
    )
    serve.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=("off", "execution_count"),
        default="off",
        help="execution_count: a model instance whose instance_group gives a rate_limiter executes only "
        "when the resources it lists are free, instances taking turns by priority across models; off: "
        "rate_limiter configs are ignored (default off; docs/scheduling/rate-limiter.md)",
    )
    serve.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        type=resource_flag,
        metavar="NAME:COUNT[:DEVICE]",
        help="the count of a rate limiter resource, on DEVICE or else on every device (repeatable; names "
        "match case-insensitively). Without it, a resource's count is the largest any loaded instance asks "
        "for; with any, a resource not given has count 0",
    )
    serve.add_argument(
        "--strict-readiness",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="ready only when every loaded model is ready (default true); false: ready once serving",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        help="Prometheus metrics port (GET /metrics); 0 picks a free one (default 8002)",
    )
    serve.add_argument(
        "--allow-metrics",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="serve Prometheus metrics on --metrics-port (default true)",
    )
    serve.add_argument(
        "--allow-cpu-metrics",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="Triton's nv_cpu_utilization and nv_cpu_memory_* on /metrics, read from /proc (default true)",
    )
    serve.add_argument(
        "--allow-gpu-metrics",
        type=_boolean,
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
    serve.add_argument(
        "--allow-client-shm",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="true|false",
        help="let clients register system and CUDA shared-memory regions (default false: a client could "
        "make the server read or write any segment its user may open)",
    )
    serve.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="the response cache, Triton's flag: 'local,size=BYTES' keeps up to BYTES of answers of the "
        "models whose config says response_cache { enable: true } (default: no cache)",
    )
    serve.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="Triton's older form of --cache-config local,size=BYTES",
    )
    log_settings.add_arguments(serve, _boolean)
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
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N|auto",
        help="front-end processes serving the same ports, each on its own core: the engine (which also holds "
        "the models and their batchers) and N - 1 workers beside it; auto: one per CPU the process may "
        "use (its cgroup's CPU limit, rounded up, and its affinity) (default 1: one process)",
    )
    groups = ", ".join(restricted.GROUPS)
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="<apis>:<key>=<value>",
        help=f"Triton's restricted APIs (repeatable): the REST APIs of the comma-separated groups answer "
        f"only a request with the header <key> set to <value>, else 403. The groups: {groups}",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="<protocols>:<key>=<value>",
        help=f"the same for gRPC (repeatable): the methods of the groups need the metadata "
        f"{restricted.GRPC_KEY_PREFIX}<key> set to <value>, else UNAVAILABLE. The groups: {groups}",
    )
    serve.add_argument(
        "--model-config-name",
        default="",
        metavar="NAME",
        help="Triton's custom configs: each model loads <model>/configs/NAME.pbtxt where it has one, else "
        "its config.pbtxt (default: config.pbtxt)",
    )
    serve.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="Triton's: configs are used as written, not completed (each must name its backend or platform "
        "and its inputs and outputs); by default they are completed from the model files",
    )
    serve.add_argument(
        "--strict-model-config",
        type=_boolean,
        default=False,
        metavar="true|false",
        help="Triton's older name: true is --disable-auto-complete-config (default false)",
    )
    serve.add_argument(
        "--model-load-thread-count",
        type=_positive_int,
        default=4,
        metavar="N",
        help="models loading at once, at most, each in a thread of its own (default 4, as Triton's)",
    )
    serve.add_argument(
        "--model-load-retry-count",
        type=_not_negative(int),
        default=0,
        metavar="N",
        help="Triton's: a model version whose backend fails to load is tried again, up to N more times "
        "(default 0)",
    )
    serve.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]SETTING=VALUE",
        help="Triton's backend settings (repeatable): default-max-batch-size=N (default 4) is the "
        "max_batch_size auto-complete gives an ONNX model whose graph batches; with BACKEND, for that "
        "backend only. Other settings are accepted and ignored, with a warning",
    )
    serve.add_argument(
        "--model-namespacing",
        type=_boolean,
        default=False,
        metavar="true|false",
        help="Triton's: each --model-repository is a namespace, so a model name may be in several; a request "
        "naming such a name is refused as ambiguous, an ensemble's steps call the models of its own "
        "repository first (default false: a name in two repositories is served from neither)",
    )
    serve.add_argument(
        "--exit-on-error",
        type=_boolean,
        default=False,
        metavar="true|false",
        help="Triton's: true exits (status 1) when anything fails at startup: a model that does not load, a "
        "repository that cannot be read. Default false (Triton's is true): the server starts and serves "
        "the models that loaded, the others UNAVAILABLE with their reason",
    )
    serve.add_argument(
        "--exit-timeout-secs",
        type=float,
        dest="graceful_timeout",
        default=argparse.SUPPRESS,  # --graceful-timeout's default stands
        metavar="SECONDS",
        help="Triton's name for --graceful-timeout",
    )
    serve.add_argument(
        "--http-header-forward-pattern",
        default=None,
        metavar="REGEX",
        help="Triton's header forwarding: the headers of a REST infer request whose (lowercase) names this "
        "regular expression matches become string parameters of the request (default: none)",
    )
    serve.add_argument(
        "--grpc-header-forward-pattern",
        default=None,
        metavar="REGEX",
        help="the same for the metadata of gRPC ModelInfer and ModelStreamInfer calls (default: none)",
    )
    serve.add_argument(
        "--engine-front-end",
        type=_boolean,
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
        type=_not_negative(float),
        default=300.0,
        metavar="SECONDS",
        help="with --workers: how long a worker waits for the engine to answer a call (a stream: for its "
        "next message) before it answers the client 'unavailable' and cancels the call; a gRPC deadline "
        "ends a call sooner. 0: no limit (default 300)",
    )
    serve.add_argument(
        "--worker-max-calls",
        type=_not_negative(int),
        default=4096,
        metavar="N",
        help="with --workers: inference calls of one worker that may wait in the engine at once; past it "
        "the engine stops reading that worker's requests until half are answered, and the worker's next "
        "ones wait (default 4096; 0: no limit)",
    )
    serve.add_argument("--worker-of", help=argparse.SUPPRESS)  # set by the engine for each worker it starts
    return serve


def _arena_bytes(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {text!r}") from None
    if size < 1 << 20:
        raise argparse.ArgumentTypeError("must be at least 1048576 (1 MiB)")
    return size


def _not_negative(number: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value >= 0:  # NaN too
            raise argparse.ArgumentTypeError("must be 0 or more")
        return value

    return parse


def _positive_int(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return count


def _workers(text: str) -> int:
    if text == "auto":
        return available_cpus()
    try:
        return _positive_int(text)
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


def _boolean(text: str) -> bool:
    """A flag value as Triton's command line takes it: true/false, 1/0, yes/no, on/off."""
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def http_settings(args: argparse.Namespace) -> HttpSettings:
    settings = HttpSettings(
        max_request_bytes=args.max_request_bytes,
        max_head_bytes=args.http_max_head_bytes,
        head_timeout=args.http_head_timeout,
        body_timeout=args.http_body_timeout,
        keep_alive_timeout=args.http_keep_alive_timeout,
        max_connections=args.http_max_connections,
        h2_max_concurrent_streams=args.http2_max_concurrent_streams,
        h2_max_resets_per_second=args.http2_max_resets_per_second,
        h2_max_control_frames_per_second=args.http2_max_control_frames_per_second,
        h2_min_ping_interval=args.grpc_http2_min_recv_ping_interval_without_data / 1000,
        h2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        graceful_timeout=args.graceful_timeout,
    )
    # gRPC keepalive, age and compression (Triton's flags, in milliseconds) set after: a build of
    # server/http older than them still starts (its transport ignores them)
    settings.grpc_keepalive_time = args.grpc_keepalive_time / 1000
    settings.grpc_keepalive_timeout = args.grpc_keepalive_timeout / 1000
    settings.grpc_keepalive_permit_without_calls = args.grpc_keepalive_permit_without_calls
    settings.grpc_max_pings_without_data = args.grpc_http2_max_pings_without_data
    settings.grpc_max_connection_age = args.grpc_max_connection_age / 1000
    settings.grpc_max_connection_age_grace = args.grpc_max_connection_age_grace / 1000
    settings.grpc_infer_compression_level = args.grpc_infer_response_compression_level
    return settings
