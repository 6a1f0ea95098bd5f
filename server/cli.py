"""The `tensorgate` command and its subcommands, dispatched from one table (COMMANDS).

`tensorgate serve`: load the model repository, then serve every port until SIGINT/SIGTERM: the engine
(server/engine.py), which with `--workers N` starts N - 1 front-end workers beside it (server/frontend.py).
`tensorgate perf`: the load generator (perf/)."""

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tensorgate.server import backends, header_forwarding, identity, log_settings, restricted
from tensorgate.server.cloud_repository import is_cloud, unusable
from tensorgate.server.endpoints.customized import PATH_FORMAT
from tensorgate.server.engine import Engine
from tensorgate.server.http.listener import TlsFiles
from tensorgate.server.log_settings import LogControl
from tensorgate.server.options import build_parser
from tensorgate.server.repository import StartupError
from tensorgate.server.response_cache import CacheConfigError, parse_cache_config
from tensorgate.server.tracing import config as trace_config
from tensorgate.server.tracing.settings import OPENTELEMETRY
from tensorgate.server.tracing.tracer import Tracer

log = logging.getLogger("tensorgate")


def make_tracer(entries: list[str]) -> Tracer:
    """The tracer --trace-config asks for; ValueError says what is wrong (OpenTelemetry's packages
    missing among it)."""
    setting, otel = trace_config.parse(entries)
    exporter = None
    if setting.mode == OPENTELEMETRY:
        from tensorgate.server.tracing.otel import OtelExporter

        exporter = OtelExporter(otel)
    return Tracer(setting, otel, exporter)


READ_BACKEND_SETTING = "default-max-batch-size"  # the one --backend-config setting a backend here reads


def parse_backend_config(entries: list[str]) -> dict[str, dict[str, str]]:
    """--backend-config's `[<backend>,]<setting>=<value>` entries by backend ("": every backend's), as
    Triton parses them; ValueError with Triton's text for a malformed one."""
    settings: dict[str, dict[str, str]] = {}
    for entry in entries:
        backend, comma, rest = entry.partition(",")
        if not comma:
            backend, rest = "", entry
        elif not backend:
            raise ValueError(
                "No backend specified. --backend-config option format is <backend name>,<setting>=<value> "
                f"or <setting>=<value>. Got {entry}"
            )
        setting, _, value = rest.partition("=")
        if not setting or not value:
            raise ValueError(
                f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {entry}"
            )
        if setting == READ_BACKEND_SETTING and not value.isdigit():
            raise ValueError(f"--backend-config {entry}: {setting} must be a number >= 0")
        settings.setdefault(backend, {})[setting] = value
    return settings


def port_collision(args: argparse.Namespace) -> str | None:
    """Two open ports on the same address and port, in Triton's words (0 picks a free port: never one)."""
    http = args.http_address or args.host
    ports = [
        ("HTTP", args.allow_http, http, args.http_port),
        ("GRPC", args.allow_grpc, args.grpc_address or args.host, args.grpc_port),
        ("metrics", args.allow_metrics, args.metrics_address or http, args.metrics_port),
    ]
    open_ports = [(name, address, port) for name, allowed, address, port in ports if allowed and port]
    for i, (name, address, port) in enumerate(open_ports):
        for other, other_address, other_port in open_ports[i + 1 :]:
            if (address, port) == (other_address, other_port):
                return (
                    f"The server cannot listen to {name} requests and {other} requests at the same address "
                    f"and port {address}:{port}"
                )
    return None


def serve(arguments: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(arguments)
    args.argv = ["serve", *arguments]  # what the engine starts its workers with
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.error("Wildcard model name '*' must be the ONLY --load-model if specified at all")
    if args.model_control_mode == "poll" and args.repository_poll_secs <= 0:
        parser.error("--model-control-mode poll needs --repository-poll-secs > 0")
    if not args.engine_front_end and args.workers < 2:
        parser.error("--engine-front-end false needs --workers 2 or more: someone must accept connections")
    try:
        args.http_restrictions = restricted.parse(args.http_restricted_api, "http-restricted-api", "", "api")
        args.grpc_restrictions = restricted.parse(
            args.grpc_restricted_protocol, "grpc-restricted-protocol", restricted.GRPC_KEY_PREFIX, "protocol"
        )
        args.http_forward = header_forwarding.compiled(args.http_header_forward_pattern)
        args.grpc_forward = header_forwarding.compiled(args.grpc_header_forward_pattern)
    except ValueError as e:
        parser.error(str(e))
    try:
        backends.backend_config = parse_backend_config(args.backend_config)
    except ValueError as e:
        parser.error(str(e))
    backends.load_retries = args.model_load_retry_count
    identity.name = args.id
    collision = port_collision(args)
    if collision:
        parser.error(collision)
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
    if args.ssl_ca_certs is not None and args.ssl_certfile is None:
        parser.error("--ssl-ca-certs (mutual TLS) needs --ssl-certfile and --ssl-keyfile")
    args.grpc_tls = None
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        if args.grpc_server_cert is None or args.grpc_server_key is None:
            parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        if args.grpc_use_ssl_mutual and args.grpc_root_cert is None:
            parser.error(
                "--grpc-use-ssl-mutual needs --grpc-root-cert (the CAs of the clients' certificates)"
            )
        mutual = args.grpc_root_cert if args.grpc_use_ssl_mutual else None
        args.grpc_tls = TlsFiles(args.grpc_server_cert, args.grpc_server_key, mutual)
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
    try:
        log_control = LogControl(log_settings.settings_from(args))
    except ValueError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"cannot open --log-file {args.log_file}: {e.strerror}")
    log_control.install()
    if args.worker_of is None:
        for backend, settings in backends.backend_config.items():
            for setting in settings.keys() - {READ_BACKEND_SETTING}:
                log.warning(
                    "--backend-config %s%s: no backend here reads it; ignored",
                    backend and backend + ",",
                    setting,
                )
    try:
        tracer = make_tracer(args.trace_config)
    except ValueError as e:
        parser.error(str(e))
    for location in args.model_repository:
        if is_cloud(location):
            why = unusable(location)
            if why:
                parser.error(why)
        elif not Path(location).is_dir():
            log.error("model repository %s is not a directory", location)
            return 2
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        if args.worker_of is not None:
            from tensorgate.server import frontend

            runner.run(frontend.serve(args, log_control))
        else:
            try:
                runner.run(Engine(args, log_control, tracer).serve())
            except StartupError as e:  # --exit-on-error true; Triton's words
                log.error("error: creating server: Internal - %s", e)
                return 1
    return 0


def perf(arguments: list[str]) -> int:
    from tensorgate.perf.cli import main as run_perf  # the load generator's clients load only for it

    return run_perf(arguments)


class Command(NamedTuple):
    help: str
    run: Callable[[list[str]], int]  # with the arguments after the subcommand's name


COMMANDS = {
    "serve": Command("serve a model repository (tensorgate serve --help)", serve),
    "perf": Command(
        "load-test a model on any KServe v2, TF Serving or grps server (tensorgate perf --help)", perf
    ),
}


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="tensorgate", description="A multi-protocol model server.")
    names = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, command in COMMANDS.items():
        names.add_parser(name, help=command.help, add_help=False)
    chosen = parser.parse_args(arguments[:1]).command  # --help, or an unknown name, ends here
    return COMMANDS[chosen].run(arguments[1:])
