"""`tensorgate serve`'s port flags: which ports open, where they listen, the server's name in its metadata,
gRPC's message size, the headers forwarded to the models, and what grps' endpoints route and stream."""

import argparse
from pathlib import Path

from tensorgate.server.endpoints.customized import CTRL_MODES
from tensorgate.server.options_values import boolean

GRPC_MAX_MESSAGE = (1 << 31) - 1  # protobuf cannot encode a larger message


def add_port_flags(serve: argparse.ArgumentParser) -> None:
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
            type=boolean,
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
        "--metrics-port",
        type=int,
        default=8002,
        help="Prometheus metrics port (GET /metrics); 0 picks a free one (default 8002)",
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


def add_grps_flags(serve: argparse.ArgumentParser) -> None:
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
