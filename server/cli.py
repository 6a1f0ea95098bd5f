"""`tensorgate serve`: load the model repository, then serve every port until SIGINT/SIGTERM: the engine
(server/engine.py), which with `--workers N` starts N - 1 front-end workers beside it (server/frontend.py)."""

import asyncio
import logging
import sys

from server.endpoints.customized import PATH_FORMAT
from server.engine import Engine
from server.options import build_parser

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
        else:
            runner.run(Engine(args).serve())
    return 0
