"""Triton's model logger for python models (part of `pb_utils`, server/backends/pb_utils.py): `Logger`
writes a model's messages to the server's log (logger `tensorgate.model`), at a `LogLevel`.
"""

import logging

log = logging.getLogger("tensorgate.model")


class LogLevel:
    INFO, WARNING, ERROR, VERBOSE = range(4)


_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
           LogLevel.VERBOSE: logging.DEBUG}  # fmt: skip


class Logger:
    """Triton's model logger: messages go to the server's log (logger `tensorgate.model`)."""

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        log.log(_LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug("%s", message)
