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
from server.http_v2 import V2Endpoints, error_response
from server.repository import Repository
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
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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

    repository = Repository(args.model_repository)
    await repository.load_all()
    # Everything loaded so far lives as long as the process: keep the collector from rescanning it, and
    # let the many short-lived objects of each request die young in fewer gen-0 passes (~7% faster).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)

    router = Router(fallback_errors=error_response)
    V2Endpoints(repository).install(router)
    app = App(router, args.max_request_bytes, on_shutdown=repository.unload_all)

    settings = grpc.GrpcSettings(args.grpc_max_message_bytes, args.grps_default_model)
    grpc_server = GrpcServer(grpc.services(repository, settings))
    await grpc_server.start(args.host, args.grpc_port, reuse_address=True)
    for sock in grpc_server._server.sockets:  # grpclib keeps the asyncio server it listens with there
        listen_log.info("gRPC listening on %s", repr_socket_addr(sock.family, sock.getsockname()))

    config = hypercorn_config(args.host, args.http_port, log_level=args.log_level)
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        listen_log.info("HTTP listening on %s", repr_socket_addr(sock.family, sock.getsockname()))

    async def shutdown_trigger() -> None:
        await stop.wait()
        grpc_server.close()  # gRPC first: the models unload once HTTP has drained, after this returns
        await grpc_server.wait_closed()

    await worker_serve(wrap_app(app, 0, "asgi"), config, sockets=sockets, shutdown_trigger=shutdown_trigger)
    log.info("shut down")
