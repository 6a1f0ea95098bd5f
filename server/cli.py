"""`tensorgate serve`: load the model repository, then serve every port until SIGINT/SIGTERM: in one
process, or (`--workers N`) as an engine with N front-end workers (server/engine.py, server/frontend.py)."""

import argparse
import asyncio
import logging
import signal
import sys

from server import assembly
from server.endpoints.customized import PATH_FORMAT
from server.http.listener import Offline, raise_fd_limit
from server.monitor import Monitor
from server.options import build_parser
from server.repository import Repository
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the engine starts its workers with
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.error("Wildcard model name '*' must be the ONLY --load-model if specified at all")
    if args.model_control_mode == "poll" and args.repository_poll_secs <= 0:
        parser.error("--model-control-mode poll needs --repository-poll-secs > 0")
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
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
        if args.worker_of is not None:
            from server import frontend

            runner.run(frontend.serve(args))
        elif args.workers > 1:
            from server.engine import Engine

            runner.run(Engine(args).serve())
        else:
            runner.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    """One process: the repository, the models and every port (`--workers 1`)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    repository = Repository(args.model_repository, args.model_control_mode, args.strict_readiness)
    await repository.start(args.load_model)
    assembly.settle_memory()
    shared_memory = SharedMemory(args.allow_client_shm)
    monitor = Monitor(repository, args.monitor_log, repository.app_monitor)  # what models record, sampled
    try:
        parts = assembly.build(args, repository, shared_memory, monitor)
    except ValueError as e:
        log.error("%s", e)
        await repository.unload_all()
        raise SystemExit(2) from None
    raise_fd_limit()
    sockets = assembly.bind_ports(args)
    monitor.start()
    poller = None
    if args.model_control_mode == "poll":
        poller = asyncio.create_task(repository.poll_forever(args.repository_poll_secs, stop))

    async def shutdown_trigger() -> None:
        await stop.wait()
        if poller is not None:
            await poller  # returns once a poll under way is done
        parts.grpc_services.begin_shutdown()  # open streams end; every port then drains

    offline = Offline()  # every port's connections leave at their next idle moment while offline
    repository.online_watchers.append(lambda online: offline.set(not online))
    await assembly.serve_ports(
        args, parts, sockets, shutdown_trigger, offline, lambda: assembly.log_ports(sockets)
    )
    monitor.stop()
    await repository.unload_all()
    log.info("shut down")
