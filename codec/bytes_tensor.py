"""BYTES tensors on the wire: each element is a 4-byte little-endian length followed by its bytes.

Shared by the binary tensor data extension and gRPC raw contents.
"""

import base64
import binascii
import struct

import numpy as np

from tensorgate.codec.errors import invalid

_LENGTH = struct.Struct("<I")


def decode_bytes(buffer: memoryview, count: int, what: str) -> np.ndarray:
    """`count` length-prefixed elements filling `buffer` exactly -> object array of bytes."""
    out = np.empty(count, dtype=object)
    offset, end = 0, len(buffer)
    for i in range(count):
        if offset + 4 > end:
            raise invalid(f"{what}: BYTES data holds fewer than the {count} elements its shape says")
        (length,) = _LENGTH.unpack_from(buffer, offset)
        offset += 4
        if offset + length > end:
            raise invalid(f"{what}: BYTES element {i} claims {length} bytes, past the end of its data")
        out[i] = bytes(buffer[offset : offset + length])
        offset += length
    if offset != end:
        raise invalid(f"{what}: BYTES data holds more than the {count} elements its shape says")
    return out


def encode_bytes(elements: np.ndarray) -> bytes:
    """Object/bytes/str array (any shape, row-major) -> length-prefixed bytes."""
    parts = []
    for element in elements.reshape(-1):
        # str, and numbers a model returned, go as their text, as the JSON answer has them
        raw = bytes(element) if isinstance(element, bytes | bytearray | memoryview) else str(element).encode()
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def b64decode(text: str, what: str) -> bytes:
    """Base64 as JSON codecs receive it: padding optional, anything else invalid (a 400 naming `what`)."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{what}: {text[:40]!r} is not valid base64") from None
