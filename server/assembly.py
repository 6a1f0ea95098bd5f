"""The server's parts assembled from the command line: each port's router, the gRPC services, and serving
the ports. `build` makes the whole server: one process (`--workers 1`, server/cli.py), and the engine
(which also answers what the workers forward to it, server/engine.py). `build_worker` makes a front-end
worker's (server/frontend.py): the front end alone (`install_front_end`, inference on every protocol,
declared there once for REST and gRPC), every other route and method forwarded."""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import gc
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpclib.const import Cardinality, Handler

from tensorgate.codec import purepython, v2_http
from tensorgate.server import grpc
from tensorgate.server.endpoints.customized import StreamingControl
from tensorgate.server.endpoints.generate import GenerateEndpoints
from tensorgate.server.endpoints.grps import GrpsEndpoints, GrpsPredict, install_customized
from tensorgate.server.endpoints.monitor import MonitorEndpoints
from tensorgate.server.endpoints.repository import RepositoryEndpoints
from tensorgate.server.endpoints.settings import SettingsEndpoints
from tensorgate.server.endpoints.tfserving import TFServingEndpoints, TFServingInference
from tensorgate.server.endpoints.v2 import V2Endpoints, V2Inference, error_response
from tensorgate.server.engine_client import EngineClient, Forwarder, InProcess
from tensorgate.server.grpc.inference import RawMessage
from tensorgate.server.grps import GrpsInference, GrpsStatus
from tensorgate.server.http.grpc_call import GrpcServices
from tensorgate.server.http.listener import Listener, Offline, TlsFiles, address_of, bind, tls_context
from tensorgate.server.metrics import metrics_router
from tensorgate.server.options_transport import http_settings
from tensorgate.server.router import Router
from tensorgate.server.tfserving import TFServing

if TYPE_CHECKING:
    from tensorgate.server.log_settings import LogControl
    from tensorgate.server.monitor import Monitor
    from tensorgate.server.repository import Repository
    from tensorgate.server.shared_memory import SharedMemory
    from tensorgate.server.tracing.frontend import Sampler
    from tensorgate.server.tracing.tracer import Tracer

# Where we listen is always said, whatever --log-level: with port 0 it is the only way to learn the port.
listen_log = logging.getLogger("tensorgate.listen")
listen_log.setLevel(logging.INFO)

PORTS = ("gRPC", "Metrics", "HTTP")  # bound and logged in this order: HTTP's line tells a waiting reader "up"


@dataclass
class Parts:
    routers: dict[str, Router]  # by port name; the gRPC port serves no REST route
    grpc_services: GrpcServices


def install_front_end(
    args: argparse.Namespace, engine: EngineClient, tracer: Sampler, router: Router
) -> list:
    """What a front end answers by itself, REST and gRPC alike: inference on every protocol, through
    `engine` (server/engine_client.py). Its routes go on `router`; its gRPC servicers are returned. This
    is all a front-end worker builds (`build_worker`); one process and the engine build the rest beside it."""
    grps, tf = GrpsInference(engine, args.grps_default_model), TFServing(engine)  # REST's and gRPC's
    V2Inference(engine, tracer, args.http_forward, args.http_max_input_size).install(router)
    GenerateEndpoints(engine, tracer, args.http_max_input_size).install(router)
    GrpsPredict(grps, streaming_control(args)).install(router)
    TFServingInference(tf).install(router)
    return grpc.front_end_services(engine, tracer, grps, tf, args.grpc_forward)


def build(
    args: argparse.Namespace,
    repository: Repository,
    shared_memory: SharedMemory,
    monitor: Monitor | None,
    logs: LogControl,
    tracer: Tracer,
) -> Parts:
    """Every port's routes and the gRPC services over `repository` (ValueError: a customized grps path
    that would take a built-in route's place): the front end, its inference through the repository's
    models in this process, and everything else."""
    engine = InProcess(repository, shared_memory)
    router = Router(fallback_errors=error_response, max_body_bytes=args.max_request_bytes)
    front_end = install_front_end(args, engine, tracer, router)
    V2Endpoints(repository, shared_memory).install(router)
    SettingsEndpoints(repository, logs, tracer).install(router)
    GrpsEndpoints(GrpsStatus(repository, args.grps_default_model)).install(router)
    MonitorEndpoints(monitor).install(router)
    TFServingEndpoints(TFServing(engine)).install(router)
    RepositoryEndpoints(repository).install(router)
    grps = GrpsInference(engine, args.grps_default_model)
    install_customized(router, grps, streaming_control(args), args.grps_customized_predict_http)  # last
    router.restrict(args.http_restrictions)
    routers = {"gRPC": Router(error_response, args.max_request_bytes), "HTTP": router}
    if args.allow_metrics:
        routers["Metrics"] = metrics_router(repository, monitor)
    services = grpc.services(
        front_end,
        engine,
        repository,
        args.grps_default_model,
        args.grpc_max_message_bytes,
        shared_memory,
        logs,
        tracer,
        args.grpc_restrictions,
    )
    return Parts(routers, services)


def build_worker(
    args: argparse.Namespace, engine: EngineClient, tracer: Sampler, forward: Forwarder
) -> Parts:
    """A front-end worker's ports: the front end, and every other route and gRPC method forwarded to the
    engine (`forward`), which answers it as the one server it is (404s and 405s too)."""
    routers = {
        name: Router(error_response, args.max_request_bytes, functools.partial(forward.http, name))
        for name in PORTS
    }
    front_end = install_front_end(args, engine, tracer, routers["HTTP"])
    routers["HTTP"].restrict(args.http_restrictions)

    def relay(path: str) -> Handler:
        return Handler(
            functools.partial(forward.grpc, path), Cardinality.STREAM_STREAM, RawMessage, RawMessage
        )

    services = GrpcServices(front_end, args.grpc_max_message_bytes, args.grpc_restrictions, relay)
    return Parts(routers, services)


def streaming_control(args: argparse.Namespace) -> StreamingControl:
    return StreamingControl(
        args.grps_streaming_ctrl_mode, args.grps_streaming_ctrl_key, args.grps_streaming_res_content_type
    )


class BindError(Exception):
    """A port that cannot listen where asked; the message is Triton's."""


def bind_ports(args: argparse.Namespace) -> dict[str, list[socket.socket]]:
    """The listening sockets of each port that is on (--allow-grpc, --allow-metrics, --allow-http), each
    on its own address (Triton's --grpc-address, --metrics-address, --http-address; else --host); with
    --workers, bound so that the workers may listen on the same ports (SO_REUSEPORT). With
    --engine-front-end false they are bound but do not listen: only the workers' sockets take connections."""
    http = args.http_address or args.host
    ports = {
        "gRPC": (args.allow_grpc, args.grpc_address or args.host, args.grpc_port),
        "Metrics": (args.allow_metrics, args.metrics_address or http, args.metrics_port),
        "HTTP": (args.allow_http, http, args.http_port),
    }
    sockets: dict[str, list[socket.socket]] = {}
    for name in PORTS:
        allowed, address, port = ports[name]
        if not allowed:
            continue
        try:
            sockets[name] = bind(address, port, args.workers > 1, listen=args.engine_front_end)
        except OSError as e:
            for bound in sockets.values():
                for sock in bound:
                    sock.close()
            why = "already in use" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror or e}"
            service = {"gRPC": "GRPC"}.get(name, name)  # Triton's words
            raise BindError(
                f"failed to start {service} service: Unavailable - Socket '{address}:{port}' {why}"
            ) from e
    return sockets


def request_path() -> str:
    """What this process runs the request path from, for the log (a build compiles every listed module:
    one of them tells)."""
    if purepython.is_compiled(v2_http):
        return "compiled (Cython)"
    if purepython.wanted():
        return "pure Python (TENSORGATE_PURE_PYTHON=1)"
    return "pure Python (no compiled build)"


def log_ports(sockets: dict[str, list[socket.socket]]) -> None:
    """Once the ports serve: what runs the request path, and where each port listens (HTTP's line last)."""
    listen_log.info("Request path: %s", request_path())
    for name, bound in sockets.items():
        for sock in bound:
            listen_log.info("%s listening on %s", name, address_of(sock))


async def serve_ports(
    args: argparse.Namespace,
    parts: Parts,
    sockets: dict[str, list[socket.socket]],
    shutdown_trigger: Callable[[], Awaitable[None]],
    offline: Offline,
    serving: Callable[[], None] = lambda: None,
) -> None:
    """Serves every port until `shutdown_trigger` returns, then drains them; `serving()` once every port
    accepts. gRPC is served on its port and, over HTTP/2, on HTTP's; it needs our transport: on
    hypercorn, the HTTP port serves REST only."""
    settings = http_settings(args)
    http_tls = TlsFiles(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs) if args.ssl_certfile else None
    tls_files = {"HTTP": http_tls, "gRPC": args.grpc_tls}

    async def serve_port(name: str) -> None:
        router = parts.routers[name]
        if name != "gRPC" and args.http_server == "hypercorn":
            from tensorgate.server.http.asgi import AsgiApp, serve_hypercorn

            app = AsgiApp(router, settings.max_request_bytes)
            files = tls_files.get(name)
            started(name)  # hypercorn accepts on the bound sockets from its first step
            await serve_hypercorn(app, sockets[name], shutdown_trigger, settings.graceful_timeout, files)
            return
        tls = tls_context(tls_files[name]) if tls_files.get(name) else None
        services = parts.grpc_services if name != "Metrics" else None
        listener = Listener(router, settings, sockets[name], tls, services, offline)
        await listener.start()
        started(name)
        await shutdown_trigger()
        await listener.shutdown()

    waiting = set(sockets)

    def started(name: str) -> None:
        waiting.discard(name)
        if not waiting:
            serving()

    await asyncio.gather(*(serve_port(name) for name in sockets))


def settle_memory() -> None:
    """Everything loaded so far lives as long as the process: keep the collector from rescanning it, and
    let the many short-lived objects of each request die young in fewer gen-0 passes (~7% faster)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
