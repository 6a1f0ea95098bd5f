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

from tensorgate.server import header_forwarding, log_settings, restricted
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
