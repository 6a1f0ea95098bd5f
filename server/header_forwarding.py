"""Triton's header forwarding: `--http-header-forward-pattern` and `--grpc-header-forward-pattern`.

An inference request's headers (REST) or metadata (gRPC) whose names the pattern matches anywhere (a
search, as Triton's RE2::PartialMatch) become string parameters of the request, which the model reads as
it reads any parameter. HTTP/1.1's header names arrive lowercased, as HTTP/2's always are. A name that is
one of the parameters Triton reserves, or starts with `triton_`, fails the request with Triton's text.
"""

import re
from collections.abc import Iterable

from tensorgate.codec.errors import invalid

RESERVED = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)


def compiled(pattern: str | None) -> re.Pattern | None:
    """The flag's pattern, compiled (ValueError naming it when it is not a regular expression)."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"header forward pattern {pattern!r} is not a regular expression: {e}") from None


def forwarded(pattern: re.Pattern, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The parameters the matching headers make; an INVALID_ARGUMENT for a reserved name."""
    found = {}
    for name, value in headers:
        if pattern.search(name):
            if name in RESERVED or name.startswith("triton_"):
                raise invalid(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            found[name] = value
    return found


def from_headers(pattern: re.Pattern, headers: dict[bytes, bytes]) -> dict[str, str]:
    """A REST request's forwarded headers."""
    return forwarded(pattern, ((n.decode("latin-1"), v.decode("latin-1")) for n, v in headers.items()))


def from_metadata(pattern: re.Pattern, metadata: dict[str, str | bytes]) -> dict[str, str]:
    """A gRPC call's forwarded metadata (binary, `-bin`, values are not text: not forwarded)."""
    return forwarded(pattern, ((n, v) for n, v in metadata.items() if isinstance(v, str)))
