"""`tensorgate serve`'s transport flags and the limits they set: the HTTP server, request sizes, HTTP/1.1
and HTTP/2 limits, the gRPC port's connection management (keepalive, connection age, compression), the
graceful shutdown; http_settings() turns them into the transport's HttpSettings."""

import argparse

from tensorgate.server.http.connection import HttpSettings
from tensorgate.server.options_values import boolean, positive_int


def add_transport_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=1 << 30,
        help="largest request body accepted, in bytes (default 1 GiB); larger ones get 413",
    )
    serve.add_argument(
        "--http-max-input-size",
        type=positive_int,
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
        type=positive_int,
        default=7_200_000,
        metavar="MS",
        help="gRPC keepalive: milliseconds between the server's keepalive PINGs on a connection (default "
        "%(default)s, Triton's)",
    )
    serve.add_argument(
        "--grpc-keepalive-timeout",
        type=positive_int,
        default=20_000,
        metavar="MS",
        help="gRPC keepalive: milliseconds a keepalive PING's ACK may take before the connection is closed "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--grpc-keepalive-permit-without-calls",
        type=boolean,
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
        "--exit-timeout-secs",
        type=float,
        dest="graceful_timeout",
        default=argparse.SUPPRESS,  # --graceful-timeout's default stands
        metavar="SECONDS",
        help="Triton's name for --graceful-timeout",
    )


def http_settings(args: argparse.Namespace) -> HttpSettings:
    """The transport's limits the flags set (the gRPC ones given in milliseconds, as Triton's)."""
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
        grpc_keepalive_time=args.grpc_keepalive_time / 1000,
        grpc_keepalive_timeout=args.grpc_keepalive_timeout / 1000,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        grpc_max_connection_age=args.grpc_max_connection_age / 1000,
        grpc_max_connection_age_grace=args.grpc_max_connection_age_grace / 1000,
        grpc_infer_compression_level=args.grpc_infer_response_compression_level,
    )
