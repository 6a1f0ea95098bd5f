"""gRPC over HTTP/2, sans-IO (grpc/grpc doc/PROTOCOL-HTTP2.md): the request's content-type, timeout and
metadata, length-prefixed messages cut from DATA payloads (the size checked at the 5-byte prefix, before
the message is buffered), message compression, and the status trailers. The call on a stream is
grpc_call.py. Statuses and errors are grpclib's (`Status`, `GRPCError`): the generated service bases
raise them, and grpclib stays what clients call us with.
"""

from __future__ import annotations

import base64
import zlib
from urllib.parse import quote, unquote_to_bytes

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from tensorgate.server.http.buffers import body_buffer

CONTENT_TYPE = b"application/grpc"
# Message encodings we read and write (grpc-encoding): zlib window bits of each.
ENCODINGS = {b"gzip": 31, b"deflate": 15}
ACCEPT_ENCODING = b"identity,deflate,gzip"
TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Bytes grpc-message may carry unencoded: printable ASCII but '%' (the spec's percent-encoding).
_UNRESERVED = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25)


def is_grpc(content_type: bytes | None) -> bool:
    """`application/grpc`, or with a subtype (`+proto`) or parameters."""
    if content_type is None or not content_type.startswith(CONTENT_TYPE):
        return False
    return len(content_type) == len(CONTENT_TYPE) or content_type[16:17] in (b"+", b";")


def content_subtype(content_type: bytes) -> bytes:
    """The subtype of a gRPC content-type: b"" for plain application/grpc, b"proto", b"json", ..."""
    return content_type.partition(b";")[0][17:].strip().lower()


def parse_timeout(value: bytes) -> float:
    """grpc-timeout (at most 8 digits and a unit) in seconds; ValueError when malformed."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in TIMEOUT_UNITS:
        raise ValueError(f"malformed grpc-timeout {value.decode('latin-1')!r}")
    return int(digits) * TIMEOUT_UNITS[unit]


def metadata(headers: dict[bytes, bytes]) -> dict[str, str | bytes]:
    """The call's custom metadata: every header but the reserved ones (pseudo, grpc-*, HTTP's own);
    `-bin` values base64-decoded (padded or not), as the spec says clients send them."""
    found: dict[str, str | bytes] = {}
    for name, value in headers.items():
        if name.startswith(b"grpc-") or name in (b"content-type", b"te", b"user-agent", b"content-length"):
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            parts = [part.strip() for part in value.split(b",")]
            found[key] = b"".join(base64.b64decode(p + b"=" * (-len(p) % 4), validate=True) for p in parts)
        else:
            found[key] = value.decode("latin-1")
    return found


def percent_encode(message: str) -> bytes:
    return quote(message, safe=_UNRESERVED).encode("ascii")


def percent_decode(value: bytes) -> str:
    return unquote_to_bytes(value).decode("utf-8", "replace")


def status_fields(status: Status, message: str | None) -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", str(status.value).encode())]
    if message:
        fields.append((b"grpc-message", percent_encode(message)))
    return fields


def prefix(compressed: bool, size: int) -> bytes:
    return (b"\x01" if compressed else b"\x00") + size.to_bytes(4, "big")


def too_large(what: str, size: int, limit: int) -> GRPCError:
    return GRPCError(
        Status.RESOURCE_EXHAUSTED,
        f"{what} message of {size} bytes is larger than the server's limit of {limit} bytes "
        "(--grpc-max-message-bytes)",
    )


COMPRESSION_LEVELS = ("none", "low", "medium", "high")
# grpc-core's ranking of the algorithms a level picks from, least compressing first
_RANKED = (b"gzip", b"deflate")


def encoding_for_level(level: str, accepted: bytes | None) -> bytes | None:
    """The encoding an answer gets at a compression level, as grpc-core picks it among those the client
    accepts (grpc-accept-encoding; without it, none): low the first of gzip and deflate, medium the middle
    one, high the last; None for none, or when the client accepts neither."""
    if level == "none" or accepted is None:
        return None
    offered = {name.strip() for name in accepted.split(b",")}
    ranked = [name for name in _RANKED if name in offered]
    if not ranked:
        return None
    return ranked[{"low": 0, "medium": len(ranked) // 2}.get(level, -1)]


def compress(encoding: bytes, data: bytes | memoryview) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, ENCODINGS[encoding])
    return packer.compress(data) + packer.flush()


def decompress(encoding: bytes | None, data: bytes | memoryview, limit: int) -> bytes:
    """A compressed message, inflated to at most `limit` bytes (a small message must not unpack into
    gigabytes): RESOURCE_EXHAUSTED past it, INTERNAL for bytes that do not inflate."""
    if encoding is None:
        raise GRPCError(Status.INTERNAL, "a compressed message, but the call named no grpc-encoding")
    unpacker = zlib.decompressobj(ENCODINGS[encoding])
    try:
        data = unpacker.decompress(data, limit + 1)
    except zlib.error as e:
        message = f"the message does not decompress with {encoding.decode()}: {e}"
        raise GRPCError(Status.INTERNAL, message) from None
    if len(data) > limit:
        raise too_large("received (decompressed)", len(data), limit)
    if not unpacker.eof:
        raise GRPCError(Status.INTERNAL, f"the message is a truncated {encoding.decode()} stream")
    return data


class MessageReader:
    """Cuts the DATA payloads of one call into its messages, (compressed, bytes) each. A message's size is
    checked when its prefix is read; one that spans frames is received into one buffer of its size."""

    __slots__ = ("max_bytes", "head", "body", "filled", "compressed")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.head = bytearray()  # a prefix cut by a frame's end
        self.body: memoryview | None = None  # the message being received
        self.filled = 0
        self.compressed = False

    @property
    def partial(self) -> bool:
        """A message has begun and not ended."""
        return bool(self.head) or self.body is not None

    def feed(self, data: memoryview, messages: list[tuple[bool, bytes | memoryview]]) -> None:
        """Appends the messages `data` completes to `messages`; raises GRPCError at a prefix that breaks
        the framing or the size limit (the messages before it are appended)."""
        while data:
            if self.body is not None:
                take = min(len(data), len(self.body) - self.filled)
                self.body[self.filled : self.filled + take] = data[:take]
                self.filled += take
                data = data[take:]
                if self.filled == len(self.body):
                    messages.append((self.compressed, self.body))
                    self.body = None
                continue
            if not self.head and len(data) >= 5:
                flag, size = data[0], int.from_bytes(data[1:5], "big")
                data = data[5:]
            else:
                take = 5 - len(self.head)
                self.head += data[:take]
                data = data[take:]
                if len(self.head) < 5:
                    break
                flag, size = self.head[0], int.from_bytes(self.head[1:5], "big")
                self.head.clear()
            if flag > 1:
                raise GRPCError(Status.INTERNAL, f"a message prefix with compressed flag {flag} (0 or 1)")
            if size > self.max_bytes:
                raise too_large("received", size, self.max_bytes)
            if len(data) >= size:
                messages.append((flag == 1, bytes(data[:size])))
                data = data[size:]
            else:
                self.body = body_buffer(size, data)
                self.filled = len(data)
                self.compressed = flag == 1
                data = data[len(data) :]
