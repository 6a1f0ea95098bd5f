"""Triton's logging extension: the server's log settings, read and changed at runtime (GET/POST
/v2/logging, gRPC LogSettings), and how they are applied to Python's logging.

- log_info, log_warning, log_error: whether INFO, WARNING and ERROR (and CRITICAL) records are written;
- log_verbose_level: 0 writes no verbose record; 1 and more write DEBUG records (our verbose level 1);
- log_format: "default" (Triton's glog layout, `I1127 14:03:25.829575 3355 tensorgate.http] message`)
  or "ISO8601" (`2026-11-27T14:03:25Z I 3355 tensorgate.http] message`); the logger's name stands where
  Triton writes its source file and line. Every message is one line in both: its control characters are
  escaped, so no client's text quoted in a message can start a line of its own. Tracebacks follow on
  lines of their own;
- log_file: where records go ("" = standard error). Set with `--log-file` at start; as in Triton, the
  protocol may not change it (a client could otherwise make the server write any file it may open).

The lines saying where the server listens are written whatever the settings (with port 0 they are the
only way to learn the port), and with --log-file to standard error as well. `LogSettings` is a plain
dataclass: it can be sent between processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorgate.codec.errors import ErrorKind, InferError, invalid

FORMATS = ("default", "ISO8601")
BOOLEANS = ("log_info", "log_warning", "log_error")
MAX_VERBOSE = (1 << 32) - 1  # gRPC carries it as uint32
ALWAYS_WRITTEN = "tensorgate.listen"  # where the server listens: logged whatever the settings

# Control characters as escapes: \n, \r, \t, \x1b ...
_ESCAPES = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)}


@dataclass
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _letter(levelno: int) -> str:
    """Triton's one-letter level: E, W, I, or V for a verbose record."""
    if levelno >= logging.ERROR:
        return "E"
    if levelno >= logging.WARNING:
        return "W"
    return "I" if levelno >= logging.INFO else "V"


class TritonFormatter(logging.Formatter):
    """One of Triton's two layouts, every message on one line (its control characters escaped)."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().translate(_ESCAPES)
        seconds = record.created
        if self.layout == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
            line = f"{stamp} {_letter(record.levelno)} {self.pid} {record.name}] {message}"
        else:
            micros = int((seconds % 1) * 1_000_000)
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(seconds))
            line = f"{_letter(record.levelno)}{stamp}.{micros:06d} {self.pid} {record.name}] {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class LogControl(logging.Filter):
    """The server's one log handler, its format and what it lets through, changed at runtime."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings
        self.handler = self._open(settings.log_file)
        self.listen_handler: logging.Handler | None = None
        self.watchers: list[Callable[[LogSettings], None]] = []  # told of each change (the workers)

    @staticmethod
    def _open(path: str) -> logging.Handler:
        if not path:
            return logging.StreamHandler(sys.stderr)
        return logging.FileHandler(path, mode="a", encoding="utf-8")  # OSError: the caller says why

    def install(self) -> None:
        """Makes the handler the root logger's only one."""
        self.handler.addFilter(self)
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(self.handler)
        if self.settings.log_file:  # where the server listens goes to standard error too
            self.listen_handler = logging.StreamHandler(sys.stderr)
            logging.getLogger(ALWAYS_WRITTEN).addHandler(self.listen_handler)
        self._apply()

    def filter(self, record: logging.LogRecord) -> bool:
        settings, level = self.settings, record.levelno
        if level >= logging.ERROR:
            return settings.log_error
        if level >= logging.WARNING:
            return settings.log_warning
        if level >= logging.INFO:
            return settings.log_info or record.name == ALWAYS_WRITTEN
        return settings.log_verbose_level >= 1

    def update(self, changes: dict[str, Any]) -> LogSettings:
        """Applies `changes` (setting name -> value, as a client sent them), all or none: an InferError
        names the first that is wrong. Unknown names are ignored, as Triton ignores them."""
        if "log_file" in changes:
            raise InferError(
                ErrorKind.UNIMPLEMENTED, "log file location can not be updated through network protocol"
            )
        updated = dataclasses.replace(self.settings)
        for name in BOOLEANS:
            if name in changes:
                if type(changes[name]) is not bool:
                    raise invalid(f"expect boolean for '{name}'")
                setattr(updated, name, changes[name])
        if "log_verbose_level" in changes:
            level = changes["log_verbose_level"]
            if type(level) is not int or not 0 <= level <= MAX_VERBOSE:
                raise invalid(f"expect a non-negative integer for 'log_verbose_level', got {level!r}")
            updated.log_verbose_level = level
        if "log_format" in changes:
            layout = changes["log_format"]
            if layout not in FORMATS:
                raise invalid(f"invalid argument for log_format, got: {layout}")
            updated.log_format = layout
        self.settings = updated
        self._apply()
        for watcher in self.watchers:
            watcher(updated)
        return updated

    def _apply(self) -> None:
        self.handler.setFormatter(TritonFormatter(self.settings.log_format))
        if self.listen_handler is not None:
            self.listen_handler.setFormatter(TritonFormatter(self.settings.log_format))
        # Verbose records are made only when written: a debug call costs a level check otherwise.
        logging.getLogger().setLevel(logging.DEBUG if self.settings.log_verbose_level else logging.INFO)


# ------------------------------------------------------------------------------------------- flags


def add_arguments(parser: argparse.ArgumentParser, boolean: Any) -> None:
    """The log flags, Triton's names; `boolean` parses true|false."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe records written: debug is --log-verbose 1, warning turns --log-info off, "
        "error --log-warning too (default info)",
    )
    for name in ("info", "warning", "error"):
        parser.add_argument(
            f"--log-{name}",
            type=boolean,
            default=None,
            metavar="true|false",
            help=f"write {name.upper()} records (default true; overrides --log-level)",
        )
    parser.add_argument(
        "--log-verbose",
        type=int,
        default=None,
        metavar="LEVEL",
        help="verbose records up to this level (0: none; 1: DEBUG records); overrides --log-level",
    )
    parser.add_argument(
        "--log-format", choices=FORMATS, default="default", help="the log layout, Triton's (default default)"
    )
    parser.add_argument(
        "--log-file", default="", metavar="PATH", help="append the log to PATH (default: standard error)"
    )


def settings_from(args: argparse.Namespace) -> LogSettings:
    level = args.log_level
    settings = LogSettings(
        log_file=args.log_file,
        log_info=level in ("debug", "info"),
        log_warning=level != "error",
        log_verbose_level=1 if level == "debug" else 0,
        log_format=args.log_format,
    )
    for name in BOOLEANS:
        value = getattr(args, name)
        if value is not None:
            setattr(settings, name, value)
    if args.log_verbose is not None:
        if args.log_verbose < 0:
            raise ValueError("--log-verbose must be 0 or more")
        settings.log_verbose_level = args.log_verbose
    return settings
