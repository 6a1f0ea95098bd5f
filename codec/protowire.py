"""The protobuf wire format, as much of it as codec.v2_grpc needs to read ModelInferRequest and write
ModelInferResponse itself: varints (one at a time, and packed ones vectorized with numpy), field
iteration, and the writing of tags and length-delimited fields.
"""

import struct
from typing import Any

import numpy as np

VARINT, I64, LEN, I32 = 0, 1, 2, 5
DOUBLE = struct.Struct("<d")
I64_BIAS = 1 << 64


class Malformed(Exception):
    """The bytes are not a valid protobuf encoding; becomes an INVALID_ARGUMENT naming the message."""


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    try:
        byte = buf[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift = byte & 0x7F, 7
        while True:
            pos += 1
            byte = buf[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + 1
            shift += 7
            if shift >= 70:
                raise Malformed("a varint runs over 10 bytes")
    except IndexError:
        raise Malformed("a varint runs past the end") from None


_FIXED_WIDTH = {I64: 8, I32: 4}


def fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, value, value end) of each field in buf[pos:end]: for length-delimited
    fields `value` is the start of the payload, for varints the decoded integer, for fixed-width fields
    the start of their bytes. One-byte varints (tags, short lengths) are read inline: this is the hot loop
    of every ModelInferRequest."""
    out = []
    try:
        while pos < end:
            key = buf[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = varint(buf, pos)
            wire = key & 7
            if wire == LEN:
                length = buf[pos]
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = varint(buf, pos)
                stop = pos + length
                if stop > end:
                    raise Malformed("a field runs past the end of its message")
                out.append((key >> 3, LEN, pos, stop))
                pos = stop
            elif wire == VARINT:
                value, pos = varint(buf, pos)
                out.append((key >> 3, VARINT, value, pos))
            else:
                width = _FIXED_WIDTH.get(wire)
                if width is None:
                    raise Malformed(f"wire type {wire} is not used by proto3")
                start, pos = pos, pos + width
                if pos > end:
                    raise Malformed("a field runs past the end of its message")
                out.append((key >> 3, wire, start, pos))
    except IndexError:
        raise Malformed("a field runs past the end of its message") from None
    if pos != end:
        raise Malformed("a field runs past the end of its message")
    return out


def text(buf: bytes, start: int, stop: int) -> str:
    try:
        return str(buf[start:stop], "utf-8")
    except UnicodeDecodeError:
        raise Malformed("a string field is not valid UTF-8") from None


def signed64(value: int) -> int:
    return value - I64_BIAS if value >= 1 << 63 else value


def packed_varints(chunk: memoryview) -> np.ndarray:
    """Packed varints -> uint64 array, vectorized: one pass per byte position (at most 10), none per
    element."""
    raw = np.frombuffer(chunk, dtype=np.uint8)
    if not raw.size:
        return np.zeros(0, dtype=np.uint64)
    if raw[-1] & 0x80:
        raise Malformed("packed varints end inside a varint")
    last = raw < 0x80
    if last.all():  # every value below 128: one byte each
        return raw.astype(np.uint64)
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > 10:
        raise Malformed("a varint runs over 10 bytes")
    payload = (raw & 0x7F).astype(np.uint64)
    out = payload[starts]
    for k in range(1, longest):
        more = np.flatnonzero(lengths > k)
        out[more] |= payload[starts[more] + k] << np.uint64(7 * k)
    return out


def tag(field: int, wire: int) -> bytes:
    """The bytes that open a field."""
    return uvarint((field << 3) | wire)


SMALL = [bytes([i]) for i in range(128)]


def uvarint(value: int) -> bytes:
    if value < 128:
        return SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def len_field(tag: bytes, payload: bytes) -> bytes:
    return tag + uvarint(len(payload)) + payload


def str_field(tag: bytes, text: str) -> bytes:
    return len_field(tag, text.encode())


CACHE_MAX = 4096  # entries of a codec's cache of encoded or checked pieces; cleared when full


def remember(cache: dict, key: Any, value: Any) -> Any:
    """`cache[key] = value` in a cache bounded by CACHE_MAX; the value."""
    if len(cache) >= CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value
