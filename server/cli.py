"""`tensorgate serve`: load the model repository, then serve HTTP until SIGINT/SIGTERM."""

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from server import grpc
from server.endpoints.customized import CTRL_MODES, PATH_FORMAT, StreamingControl
from server.endpoints.grps import GrpsEndpoints
from server.endpoints.monitor import MonitorEndpoints
from server.endpoints.repository import RepositoryEndpoints
from server.endpoints.tfserving import TFServingEndpoints
from server.endpoints.v2 import V2Endpoints, error_response
from server.http.grpc_call import GrpcServices
from server.http.listener import (
    HttpSettings,
    Listener,
    Offline,
    address_of,
    bind,
    raise_fd_limit,
    tls_context,
)
from server.metrics import metrics_router
from server.monitor import Monitor
from server.repository import CONTROL_MODES, Repository
from server.response_cache import CacheConfigError, ResponseCache, parse_cache_config
from server.router import Router
from server.shared_memory import SharedMemory

log = logging.getLogger("tensorgate")

# Control characters as escapes: \n, \r, \t, \x1b ...
_ESCAPES = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)}


class OneLineFormatter(logging.Formatter):
    """A log message is one line: its control characters (a client's text quoted in an error's reason)
    are escaped, so no client can start a line of its own. Tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = record.message.translate(_ESCAPES)
        return super().formatMessage(record)


# Where we listen is always said, whatever --log-level: with port 0 it is the only way to learn the port.
listen_log = logging.getLogger("tensorgate.listen")
listen_log.setLevel(logging.INFO)
GRPC_MAX_MESSAGE = (1 << 31) - 1  # protobuf cannot encode a larger message


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorgate", description="A multi-protocol model server.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository")
    serve.add_argument("--model-repository", type=Path, required=True, help="the model repository directory")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
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
        "--http-server",
        choices=("tensorgate", "hypercorn"),
        default="tensorgate",
        help="the HTTP transport: tensorgate (our own, on httptools and our HTTP/2 frames) or hypercorn "
        "(the reference ASGI server, same endpoints); default tensorgate",
    )
    serve.add_argument("--ssl-certfile", default=None, help="serve HTTP over TLS with this certificate (PEM)")
    serve.add_argument("--ssl-keyfile", default=None, help="the private key of --ssl-certfile (PEM)")
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
        help="open connections per port; more are answered 503 and closed "
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
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info"
    )
    return parser


def _boolean(text: str) -> bool:
    """A flag value as Triton's command line takes it: true/false, 1/0, yes/no, on/off."""
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.error("Wildcard model name '*' must be the ONLY --load-model if specified at all")
    if args.model_control_mode == "poll" and args.repository_poll_secs <= 0:
        parser.error("--model-control-mode poll needs --repository-poll-secs > 0")
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
    try:
        args.cache_size = parse_cache_config(args.cache_config, args.response_cache_byte_size)
    except CacheConfigError as e:
        parser.error(str(e))
    path = args.grps_customized_predict_http
    if path is not None and not PATH_FORMAT.match(path):
        parser.error(f"--grps-customized-predict-http {path!r} must match {PATH_FORMAT.pattern}")
    # Nothing the server imports writes bytecode: a model's helper modules would otherwise leave a
    # __pycache__ in the model repository (model.py itself is compiled from source, see backends/python).
    sys.dont_write_bytecode = True
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    if not args.model_repository.is_dir():
        log.error("model repository %s is not a directory", args.model_repository)
        return 2
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    cache = ResponseCache(args.cache_size) if args.cache_size else None
    repository = Repository(
        args.model_repository, args.model_control_mode, args.strict_readiness, response_cache=cache
    )
    await repository.start(args.load_model)
    # Everything loaded so far lives as long as the process: keep the collector from rescanning it, and
    # let the many short-lived objects of each request die young in fewer gen-0 passes (~7% faster).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)

    router = Router(fallback_errors=error_response, max_body_bytes=args.max_request_bytes)
    shared_memory = SharedMemory(args.allow_client_shm)
    V2Endpoints(repository, shared_memory).install(router)
    streaming = StreamingControl(
        args.grps_streaming_ctrl_mode, args.grps_streaming_ctrl_key, args.grps_streaming_res_content_type
    )
    grps_endpoints = GrpsEndpoints(
        repository, args.grps_default_model, streaming, args.grps_customized_predict_http
    )
    grps_endpoints.install(router)
    monitor = Monitor(repository, args.monitor_log, repository.app_monitor)  # what models record, sampled
    MonitorEndpoints(monitor).install(router)
    TFServingEndpoints(repository).install(router)
    RepositoryEndpoints(repository).install(router)
    try:
        grps_endpoints.install_customized(router)  # last: it must not take a built-in route's place
    except ValueError as e:
        log.error("%s", e)
        await repository.unload_all()
        raise SystemExit(2) from None
    settings = http_settings(args)

    grpc_services = grpc.services(
        repository, args.grps_default_model, args.grpc_max_message_bytes, shared_memory
    )

    raise_fd_limit()
    # (name, router, sockets, gRPC services): gRPC is served on its port and, over HTTP/2, on HTTP's.
    ports = [
        (
            "gRPC",
            Router(error_response, args.max_request_bytes),
            bind(args.host, args.grpc_port),
            grpc_services,
        )
    ]
    if args.allow_metrics:  # logged before HTTP's line, which tells a waiting reader "up"
        ports.append(
            ("Metrics", metrics_router(repository, monitor), bind(args.host, args.metrics_port), None)
        )
    ports.append(("HTTP", router, bind(args.host, args.http_port), grpc_services))
    for name, _, sockets, _ in ports:
        for sock in sockets:
            listen_log.info("%s listening on %s", name, address_of(sock))

    monitor.start()
    poller = None
    if args.model_control_mode == "poll":
        poller = asyncio.create_task(repository.poll_forever(args.repository_poll_secs, stop))

    async def shutdown_trigger() -> None:
        await stop.wait()
        if poller is not None:
            await poller  # returns once a poll under way is done
        grpc_services.begin_shutdown()  # open streams end; every port then drains

    tls_files = (args.ssl_certfile, args.ssl_keyfile) if args.ssl_certfile else None
    offline = Offline()  # every port's connections leave at their next idle moment while offline
    repository.online_watchers.append(lambda online: offline.set(not online))
    await asyncio.gather(
        *(
            serve_port(
                "tensorgate" if name == "gRPC" else args.http_server,
                port_router,
                sockets,
                settings,
                tls_files if name == "HTTP" else None,
                shutdown_trigger,
                services,
                offline,
            )
            for name, port_router, sockets, services in ports
        )
    )
    monitor.stop()
    await repository.unload_all()
    log.info("shut down")


def http_settings(args: argparse.Namespace) -> HttpSettings:
    return HttpSettings(
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


async def serve_port(
    transport: str,
    router: Router,
    sockets: list,
    settings: HttpSettings,
    tls_files: tuple[str, str] | None,
    shutdown_trigger,
    grpc_services: GrpcServices | None = None,
    offline: Offline | None = None,
) -> None:
    """Serves one port with the chosen transport until `shutdown_trigger` returns, then drains it. gRPC
    needs ours: on hypercorn, the HTTP port serves REST only."""
    if transport == "hypercorn":
        from server.http.asgi import AsgiApp, serve_hypercorn

        app = AsgiApp(router, settings.max_request_bytes)
        await serve_hypercorn(app, sockets, shutdown_trigger, settings.graceful_timeout, tls_files)
        return
    tls = tls_context(*tls_files) if tls_files else None
    listener = Listener(router, settings, sockets, tls, grpc_services, offline)
    await listener.start()
    await shutdown_trigger()
    await listener.shutdown()
