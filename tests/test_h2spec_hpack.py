"""h2spec's `hpack` server cases (github.com/summerwind/h2spec, hpack/) on raw frames, judged as h2spec
judges them (see test_h2spec_generic.py); the `h2` fixture (conftest.py) is a connection to the shared
server, h2spec's handshake done.

Each case sends a request's header block (h2spec's CommonHeaders, by the connection's encoder) with h2spec's
own bad bytes after it (before it for 6.3), in one HEADERS frame with END_STREAM and END_HEADERS; the
verdict is always VerifyConnectionError(COMPRESSION_ERROR): a GOAWAY with COMPRESSION_ERROR, or the
connection closed.
"""

from __future__ import annotations

import pytest
from h2_wire import (
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    S_HEADER_TABLE_SIZE,
    H2Wire,
    frame,
)
from server_log import no_traceback_in_the_server_log  # noqa: F401  (autouse: a Traceback fails)

pytestmark = pytest.mark.ours


def _send_after_common_headers(h2: H2Wire, rep: bytes) -> None:
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, h2.block() + rep))


# ------------------------------------------------------------------------------ 2.3.3 Index Address Space


def test_hpack_2_3_3_1_indexed_field_with_invalid_index(h2: H2Wire) -> None:
    _send_after_common_headers(h2, b"\xc6")  # indexed field, index 70: past both tables
    h2.expect_connection_error(COMPRESSION_ERROR)


def test_hpack_2_3_3_2_literal_field_with_invalid_index(h2: H2Wire) -> None:
    _send_after_common_headers(h2, b"\x7f\x07\x00")  # incremental indexing, name index 70, empty value
    h2.expect_connection_error(COMPRESSION_ERROR)


# ------------------------------------------------------------------------------ 4.2 Maximum Table Size


def test_hpack_4_2_1_table_size_update_at_the_end_of_a_block(h2: H2Wire) -> None:
    _send_after_common_headers(h2, b"\x21")  # dynamic table size update to 1, after the fields
    h2.expect_connection_error(COMPRESSION_ERROR)


# ------------------------------------------------------------------------------ 5.2 String Literal


def test_hpack_5_2_1_huffman_padding_longer_than_7_bits(h2: H2Wire) -> None:
    # without indexing, new name: x-test: test, with one more octet of padding (all ones) at the end
    _send_after_common_headers(h2, b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff")
    h2.expect_connection_error(COMPRESSION_ERROR)


def test_hpack_5_2_2_huffman_padded_by_zero(h2: H2Wire) -> None:
    # without indexing, new name: x-test: test, padded with zeros (not the EOS code's first bits)
    _send_after_common_headers(h2, b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90")
    h2.expect_connection_error(COMPRESSION_ERROR)


def test_hpack_5_2_3_huffman_string_containing_eos(h2: H2Wire) -> None:
    # without indexing, new name: x-test: tes{EOS}t
    _send_after_common_headers(h2, b"\x00\x85\xf2\xb2\x4a\x84\xff\x87\x49\x51\xff\xff\xff\xfa\x7f")
    h2.expect_connection_error(COMPRESSION_ERROR)


# ------------------------------------------------------------------------------ 6.1 Indexed Header Field


def test_hpack_6_1_1_indexed_field_with_index_0(h2: H2Wire) -> None:
    _send_after_common_headers(h2, b"\x80")
    h2.expect_connection_error(COMPRESSION_ERROR)


# ------------------------------------------------------------------------------ 6.3 Dynamic Table Size Update


def table_size_update(size: int) -> bytes:
    """h2spec's own encoding of a dynamic table size update (from golang.org/x/net/http2)."""
    if size < 31:
        return bytes([0x20 | size])
    out = [31]
    size -= 31
    while size >= 128:
        out.append(0x80 | (size & 0x7F))
        size >>= 7
    out.append(size)
    out[0] |= 0x20
    return bytes(out)


def test_table_size_update_encoding() -> None:
    """The encoder above against RFC 7541 C.1.2's integer 1337 (5-bit prefix) and a 1-byte value."""
    assert table_size_update(1337) == bytes([0x3F, 0x9A, 0x0A])
    assert table_size_update(1) == b"\x21"


def test_hpack_6_3_1_table_size_update_above_settings_header_table_size(h2: H2Wire) -> None:
    """One more than the server's SETTINGS_HEADER_TABLE_SIZE (4096 when it sends none), before the fields."""
    limit = h2.server_settings.get(S_HEADER_TABLE_SIZE, 4096)
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, table_size_update(limit + 1) + h2.block()))
    h2.expect_connection_error(COMPRESSION_ERROR)
