"""A stateless HPACK encoder for response headers (RFC 7541).

Every field is written without indexing (literal, or the static table's entry for a whole :status), so
the peer's dynamic table is never used: no encoder state to keep in step, the peer's
SETTINGS_HEADER_TABLE_SIZE does not matter, and the bytes of a field can be cached. Decoding requests
needs the dynamic table and is the `hpack` package's Decoder.
"""

STATUS_INDEXED = {200: 8, 204: 9, 206: 10, 304: 11, 400: 12, 404: 13, 500: 14}  # RFC 7541 Appendix A
NAME_INDEX = {  # static table entries whose name a response may use
    b":status": 8,
    b"allow": 22,
    b"cache-control": 24,
    b"content-encoding": 26,
    b"content-length": 28,
    b"content-type": 31,
    b"date": 33,
    b"location": 46,
    b"retry-after": 53,
    b"server": 54,
}
FIELDS_KEPT = 512
_fields: dict[tuple[bytes, bytes], bytes] = {}


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: `value` with a `prefix_bits`-bit prefix, `first` holding the bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: bytes) -> bytes:
    return integer(len(text), 7) + text  # no Huffman coding


def field(name: bytes, value: bytes) -> bytes:
    """One field as a literal without indexing (6.2.2), its name from the static table where it is."""
    key = (name, value)
    encoded = _fields.get(key)
    if encoded is None:
        index = NAME_INDEX.get(name)
        if index is not None:
            encoded = integer(index, 4) + _string(value)
        else:
            encoded = b"\x00" + _string(name) + _string(value)
        if len(_fields) >= FIELDS_KEPT:
            _fields.clear()
        _fields[key] = encoded
    return encoded


def status(code: int) -> bytes:
    index = STATUS_INDEXED.get(code)
    if index is not None:
        return bytes((0x80 | index,))  # indexed header field (6.1)
    return field(b":status", str(code).encode())


def encode(code: int | None, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The header block of a response: :status, then `headers` (lowercase names); trailers: no code."""
    fields = [field(name, value) for name, value in headers]
    return b"".join(fields if code is None else [status(code), *fields])
