"""Our HPACK decoder and encoder against the `hpack` package, the reference implementation beside them."""

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.server.http import hpack_encode
from tensorgate.server.http.hpack_decode import Decoder, HeaderListTooLarge, HpackError

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/v2/models/simple/infer"),
    (b":authority", b"127.0.0.1:8000"),
    (b"content-type", b"application/json"),
    (b"content-length", b"187"),
    (b"user-agent", b"tensorgate-test"),
]


def test_a_sequence_of_blocks_decodes_as_encoded_with_huffman_and_the_dynamic_table() -> None:
    encoder, decoder = hpack.Encoder(), Decoder(65536)
    for n in range(5):
        fields = [*REQUEST, (b"x-request", str(n).encode()), (b"secret", b"s3")]
        block = encoder.encode(fields, huffman=True)
        assert decoder.decode(block) == fields
    assert len(decoder.dynamic) > 0  # the encoder indexed fields, and later blocks referred to them


def test_an_all_indexed_block_is_decoded_from_the_cache_only_while_the_table_is_unchanged() -> None:
    encoder, decoder = hpack.Encoder(), Decoder(65536)
    decoder.decode(encoder.encode(REQUEST))
    again = encoder.encode(REQUEST)  # now every field is in the dynamic table: all indexed
    assert all(byte & 0x80 for byte in again)
    assert decoder.decode(again) == REQUEST
    assert decoder.decode(again) == REQUEST
    # A new field evicts nothing here but changes the table: the same bytes now mean other fields.
    decoder.decode(encoder.encode([(b"x-new", b"1")]))
    assert decoder.decode(bytes([0x80 | 62])) == [(b"x-new", b"1")]


def test_a_block_with_literals_not_indexed_is_read_again_with_the_table_as_it_is_then() -> None:
    # A literal without indexing (0x0_) or never indexed (0x1_) leaves the table as it was, so such a
    # block is kept decoded; its name given by index must follow the table when the table changes.
    encoder, decoder = hpack.Encoder(), Decoder(65536)
    decoder.decode(encoder.encode([(b"x-name", b"first")]))  # the dynamic table: [x-name: first]
    block = bytes([0x00 | 0, 3]) + b"x-a" + bytes([1]) + b"1"  # literal, new name, not indexed
    block += bytes([0x10 | 15, 62 - 15, 2]) + b"s3"  # never indexed, its name the dynamic entry 62
    block += bytes([0x80 | 62])  # the dynamic entry itself
    for _ in range(2):
        assert decoder.decode(block) == [(b"x-a", b"1"), (b"x-name", b"s3"), (b"x-name", b"first")]
    assert len(decoder.dynamic) == 1  # neither literal went into the table
    assert block in decoder.blocks  # kept decoded
    rest = 2000 - 127  # a 2000-byte value's length: 127 in its 7-bit prefix, the rest in two more bytes
    large = bytes([0x00 | 0, 3]) + b"x-b" + bytes([0x7F, rest & 0x7F | 0x80, rest >> 7]) + b"v" * 2000
    assert decoder.decode(large) == [(b"x-b", b"v" * 2000)]
    assert large not in decoder.blocks  # a connection's cache stays small
    decoder.decode(encoder.encode([(b"x-other", b"second")]))  # entry 62 is now x-other: second
    assert decoder.decode(block) == [(b"x-a", b"1"), (b"x-other", b"s3"), (b"x-other", b"second")]


def test_table_size_updates_evict_and_are_bounded_by_our_setting() -> None:
    encoder, decoder = hpack.Encoder(), Decoder(65536)
    decoder.decode(encoder.encode(REQUEST))
    encoder.header_table_size = 0
    block = encoder.encode([(b"a", b"b")])
    assert block[0] & 0xE0 == 0x20  # starts with a size update
    assert decoder.decode(block) == [(b"a", b"b")]
    assert not decoder.dynamic
    with pytest.raises(HpackError, match="SETTINGS_HEADER_TABLE_SIZE"):
        Decoder(65536).decode(b"\x3f\xe2\x1f")  # a size update to 4097


@pytest.mark.parametrize(
    "block",
    [b"\x80", b"\xff\xff\xff\xff\xff\xff", b"\xbe", b"\x00\x05ab", b"\x40\x81", b"\x82\x3f\xe1\x1f"],
    ids=["index-0", "endless-integer", "beyond-tables", "string-past-end", "truncated", "update-late"],
)
def test_malformed_blocks_are_hpack_errors(block: bytes) -> None:
    with pytest.raises(HpackError):
        Decoder(65536).decode(block)


def test_a_header_list_over_the_limit_stops_decoding() -> None:
    encoder = hpack.Encoder()
    big = (b"x-big", b"v" * 1000)
    first = encoder.encode([big])
    decoder = Decoder(4000)
    decoder.decode(first)
    bomb = encoder.encode([big] * 100)  # 100 one-byte references to the 1 KB entry
    assert len(bomb) < 200
    with pytest.raises(HeaderListTooLarge):
        decoder.decode(bomb)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=80)),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
)
def test_any_fields_round_trip(fields: list[tuple[bytes, bytes]], huffman: bool) -> None:
    fields = [(name.lower(), value) for name, value in fields]
    encoder, decoder = hpack.Encoder(), Decoder(1 << 20)
    for _ in range(2):
        assert decoder.decode(encoder.encode(fields, huffman=huffman)) == fields


@pytest.mark.parametrize("status", [200, 204, 400, 404, 413, 431, 500, 503])
def test_our_response_blocks_decode_with_the_reference_decoder(status: int) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"1234"), (b"x-custom", b"v")]
    block = hpack_encode.encode(status, headers)
    assert hpack.Decoder().decode(block, raw=True) == [(b":status", str(status).encode()), *headers]
    long_value = [(b"x-long", b"a" * 300)]  # lengths past the 7-bit prefix
    assert hpack.Decoder().decode(hpack_encode.encode(200, long_value), raw=True)[1:] == long_value
