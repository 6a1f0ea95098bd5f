"""The one error type. Every protocol derives its own status from `InferError.kind` in one place."""

import re
from enum import Enum
from typing import Any


class ErrorKind(Enum):
    INVALID_ARGUMENT = "invalid argument"
    NOT_FOUND = "not found"
    UNAVAILABLE = "unavailable"
    UNIMPLEMENTED = "unimplemented"
    RESOURCE_EXHAUSTED = "resource exhausted"
    INTERNAL = "internal"


class InferError(Exception):
    """An error a client is meant to read: a kind (-> protocol status) and a message naming what failed."""

    fixed_http_status: int | None = None  # an HTTP-level error's own status, whatever the protocol

    def __init__(self, kind: ErrorKind, message: str) -> None:
        # Never empty: Triton's C++ clients take an error with an empty message for a success.
        message = message or f"{kind.value} error (no message given)"
        super().__init__(message)
        self.kind = kind
        self.message = message


def invalid(message: str) -> InferError:
    return InferError(ErrorKind.INVALID_ARGUMENT, message)


HTTP_STATUS = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.UNIMPLEMENTED: 501,
    ErrorKind.RESOURCE_EXHAUSTED: 413,
    ErrorKind.INTERNAL: 500,
}


def http_status(error: InferError, table: dict[ErrorKind, int] = HTTP_STATUS) -> int:
    """The HTTP status answering `error`: its own, else its kind's in `table` (a protocol's)."""
    return error.fixed_http_status or table[error.kind]


def describe(value: Any) -> str:
    """A JSON value as an error message shows it: its type and the start of its text."""
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


# What std::stol reads (Triton parses a requested version with it): spaces, a sign, then base-10 digits;
# whatever follows the digits is ignored.
_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
INT64_MAX = (1 << 63) - 1


def parse_version(text: str) -> str:
    """A requested model version as Triton reads it (GetModelVersionFromString): "" (the newest ready
    one) stays "", a number comes back in decimal; anything else is refused with Triton's text."""
    if not text:
        return ""
    found = _STOL.match(text)
    if found is None or not -INT64_MAX - 1 <= int(found[1]) <= INT64_MAX:
        raise invalid(
            f"failed to get model version from specified version string '{text}' (details: stol), "
            "version should be an integral value > 0"
        )
    version = int(found[1])
    if version < 0:
        raise invalid(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return str(version)
