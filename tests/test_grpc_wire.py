"""server/http/grpc_wire.py without a server: gRPC's framing, headers and compression as bytes."""

import gzip
import zlib

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.server.http.grpc_wire import (
    MessageReader,
    compress,
    content_subtype,
    decompress,
    is_grpc,
    metadata,
    parse_timeout,
    percent_decode,
    percent_encode,
    prefix,
)


def test_content_types() -> None:
    assert is_grpc(b"application/grpc") and is_grpc(b"application/grpc+proto")
    assert is_grpc(b"application/grpc;charset=utf-8")
    assert not is_grpc(b"application/grpcx") and not is_grpc(b"application/json") and not is_grpc(None)
    assert content_subtype(b"application/grpc") == b""
    assert content_subtype(b"application/grpc+Proto; x=y") == b"proto"


@pytest.mark.parametrize(
    "value, seconds",
    [
        (b"1H", 3600.0),
        (b"2M", 120.0),
        (b"3S", 3.0),
        (b"250m", 0.25),
        (b"99999999u", 99.999999),
        (b"5n", 5e-9),
    ],
)
def test_timeouts(value: bytes, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"10", b"123456789S", b"-1S", b"1.5S", b"10s"])
def test_malformed_timeouts(value: bytes) -> None:
    with pytest.raises(ValueError, match="grpc-timeout"):
        parse_timeout(value)


def test_metadata_keeps_custom_keys_and_decodes_bin_values() -> None:
    headers = {
        b"content-type": b"application/grpc",
        b"te": b"trailers",
        b"grpc-timeout": b"1S",
        b"user-agent": b"x",
        b"x-user": b"ann",
        b"x-trace-bin": b"AAEC/w",  # unpadded, as clients may send it
        b"x-two-bin": b"AQ==, Ag",  # two values joined
    }
    assert metadata(headers) == {
        "x-user": "ann",
        "x-trace-bin": b"\x00\x01\x02\xff",
        "x-two-bin": b"\x01\x02",
    }
    with pytest.raises(ValueError):
        metadata({b"x-bad-bin": b"!!!"})


@given(st.text())
def test_percent_encoding_round_trips_and_is_ascii(text: str) -> None:
    encoded = percent_encode(text)
    assert all(0x20 <= c < 0x7F for c in encoded)
    assert percent_decode(encoded) == text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def test_percent_encoding_leaves_printable_ascii_but_percent() -> None:
    assert percent_encode("model 'x' not found: 50%") == b"model 'x' not found: 50%25"
    assert percent_encode("é\n") == b"%C3%A9%0A"


def _stream(*messages: bytes) -> bytes:
    return b"".join(prefix(False, len(m)) + m for m in messages)


@given(st.lists(st.binary(max_size=300), max_size=6), st.lists(st.integers(1, 50), min_size=1, max_size=40))
def test_messages_come_out_whole_however_the_bytes_are_cut(messages: list[bytes], cuts: list[int]) -> None:
    data = _stream(*messages)
    reader, got, pos, i = MessageReader(1000), [], 0, 0
    while pos < len(data):
        size = cuts[i % len(cuts)]
        found: list = []
        reader.feed(memoryview(data[pos : pos + size]), found)
        got += [bytes(m) for _, m in found]
        pos, i = pos + size, i + 1
    assert got == messages
    assert not reader.partial


def test_a_message_cut_mid_prefix_or_mid_body_is_partial() -> None:
    for cut in (3, 6):
        reader, found = MessageReader(100), []
        reader.feed(memoryview(_stream(b"abc")[:cut]), found)
        assert found == [] and reader.partial


def test_the_size_limit_is_checked_at_the_prefix() -> None:
    reader, found = MessageReader(10), []
    with pytest.raises(GRPCError) as excinfo:  # the second prefix alone: nothing of its body needed
        reader.feed(memoryview(_stream(b"0123456789") + prefix(False, 11)), found)
    assert excinfo.value.status is Status.RESOURCE_EXHAUSTED and "11 bytes" in excinfo.value.message
    assert [bytes(m) for _, m in found] == [b"0123456789"], "the message before the bad prefix is kept"


def test_a_compressed_flag_other_than_0_or_1_is_internal() -> None:
    with pytest.raises(GRPCError) as excinfo:
        MessageReader(10).feed(memoryview(b"\x02\x00\x00\x00\x00"), [])
    assert excinfo.value.status is Status.INTERNAL


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
def test_compression_round_trips_in_the_formats_clients_use(encoding: bytes) -> None:
    data = b"tensor bytes " * 100
    packed = compress(encoding, data)
    assert (gzip.decompress(packed) if encoding == b"gzip" else zlib.decompress(packed)) == data
    assert decompress(encoding, packed, 10_000) == data


def test_decompression_is_bounded_and_checked() -> None:
    bomb = gzip.compress(bytes(10_000_000))  # ~10 KB that inflates to 10 MB
    with pytest.raises(GRPCError) as excinfo:
        decompress(b"gzip", bomb, 1 << 20)
    assert excinfo.value.status is Status.RESOURCE_EXHAUSTED
    with pytest.raises(GRPCError) as excinfo:
        decompress(b"gzip", gzip.compress(b"abc")[:-4], 100)
    assert excinfo.value.status is Status.INTERNAL and "truncated" in excinfo.value.message
    with pytest.raises(GRPCError) as excinfo:
        decompress(b"gzip", b"not gzip", 100)
    assert excinfo.value.status is Status.INTERNAL
    with pytest.raises(GRPCError) as excinfo:
        decompress(None, b"x", 100)
    assert excinfo.value.status is Status.INTERNAL and "grpc-encoding" in excinfo.value.message
