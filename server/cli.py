"""`tensorgate serve`: load the model repository, then serve HTTP until SIGINT/SIGTERM."""

import argparse
import asyncio
import gc
import logging
import signal
from pathlib import Path

from grpclib.server import Server as GrpcServer
from hypercorn.asyncio.run import worker_serve
from hypercorn.utils import repr_socket_addr, wrap_app

from server import grpc
from server.app import App
from server.http_config import hypercorn_config
from server.http_grps import GrpsEndpoints
from server.http_repository import RepositoryEndpoints
from server.http_tfserving import TFServingEndpoints
from server.http_v2 import V2Endpoints, error_response
from server.metrics import MetricsServer
from server.repository import CONTROL_MODES, Repository
from server.router import Router

log = logging.getLogger("tensorgate")
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
        "--max-request-bytes",
        type=int,
        default=1 << 30,
        help="largest request body accepted, in bytes (default 1 GiB); larger ones get 413",
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
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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

    repository = Repository(args.model_repository, args.model_control_mode, args.strict_readiness)
    await repository.start(args.load_model)
    # Everything loaded so far lives as long as the process: keep the collector from rescanning it, and
    # let the many short-lived objects of each request die young in fewer gen-0 passes (~7% faster).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)

    router = Router(fallback_errors=error_response)
    V2Endpoints(repository).install(router)
    GrpsEndpoints(repository, args.grps_default_model).install(router)
    TFServingEndpoints(repository).install(router)
    RepositoryEndpoints(repository).install(router)
    app = App(router, args.max_request_bytes, on_shutdown=repository.unload_all)

    grpc_services = grpc.services(repository, args.grps_default_model)
    grpc_server = GrpcServer(grpc_services, codec=grpc.MessageSizeCodec(args.grpc_max_message_bytes))
    await grpc_server.start(args.host, args.grpc_port, reuse_address=True)
    for sock in grpc_server._server.sockets:  # grpclib keeps the asyncio server it listens with there
        listen_log.info("gRPC listening on %s", repr_socket_addr(sock.family, sock.getsockname()))

    metrics = None
    if args.allow_metrics:
        metrics = MetricsServer(repository, args.host, args.metrics_port, args.log_level)
        for address in metrics.addresses:  # logged before HTTP's line, which tells a waiting reader "up"
            listen_log.info("Metrics listening on %s", address)

    config = hypercorn_config(args.host, args.http_port, log_level=args.log_level)
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        listen_log.info("HTTP listening on %s", repr_socket_addr(sock.family, sock.getsockname()))

    poller = None
    if args.model_control_mode == "poll":
        poller = asyncio.create_task(repository.poll_forever(args.repository_poll_secs, stop))

    async def shutdown_trigger() -> None:
        await stop.wait()
        if poller is not None:
            await poller  # returns once a poll under way is done; models unload after HTTP drains
        # gRPC first: the models unload once HTTP has drained, after this returns.
        await grpc.drain(grpc_server, grpc_services, config.graceful_timeout)

    serving = [
        worker_serve(wrap_app(app, 0, "asgi"), config, sockets=sockets, shutdown_trigger=shutdown_trigger)
    ]
    if metrics is not None:
        serving.append(metrics.serve(stop.wait))
    await asyncio.gather(*serving)
    log.info("shut down")
