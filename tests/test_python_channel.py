"""The pieces of the link to a python model's process alone: messages framed and split back at any cut
(codec/framing.py, the framing of both links); tensors through the instance's shared-memory Region
(server/backends/channel.py: every kind of array, BYTES in Triton's form, growth seen from the other side)
and inside messages, each named by its v2 datatype."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from tensorgate.codec import messages as msg
from tensorgate.codec.framing import NOTHING, FrameReader, frame
from tensorgate.server.arena import ALIGN
from tensorgate.server.backends import channel
from tensorgate.server.backends.channel import BatchArena


def fed(reader: FrameReader, data: bytes) -> list:
    reader.feed(data)
    messages = []
    while (message := reader.next()) is not NOTHING:
        messages.append(message)
    return messages


def test_frames_come_back_whatever_the_cuts() -> None:
    messages = [[msg.EXECUTE, 1, [b"\x00" * 300, "x"]], [msg.LOG, 20, "héllo"], [msg.END, 7]]
    data = b"".join(frame(m) for m in messages)
    for cut in (1, 3, 4, 5, 17, len(data) - 1):
        reader = FrameReader()
        got = fed(reader, data[:cut]) + fed(reader, data[cut:])
        assert got == messages
    reader = FrameReader(size=16)  # smaller than a message: it grows to hold it
    assert [m for byte in range(len(data)) for m in fed(reader, data[byte : byte + 1])] == messages


ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "i64_transposed": np.arange(6, dtype=np.int64).reshape(2, 3).T,  # not C-contiguous
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 5), dtype=np.int16),
    "scalar": np.array(7, dtype=np.uint8),
    "text": np.array([[b"a", b""], ["h\xe9llo".encode(), b"\x00\xff"]], dtype=object),
}


def test_arrays_go_through_the_arena_as_they_are() -> None:
    server = BatchArena(4096, name="test")
    try:
        process = BatchArena(server.size, server.fd)  # the other side maps the same memfd
        descriptors, end = server.write(ARRAYS, 0)
        assert end % ALIGN == 0
        assert [t.datatype for t in descriptors] == ["FP32", "INT64", "BOOL", "INT16", "UINT8", "BYTES"]
        for descriptor in descriptors:
            got = process.read(descriptor, copy=False)
            want = ARRAYS[descriptor.name]
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tolist() == want.tolist()
        text = next(t for t in descriptors if t.name == "text")
        assert text.datatype == channel.BYTES  # Triton's serialized form: a 4-byte length, then the bytes
        _, offset, size = text.data
        raw = bytes(server.map[offset : offset + size])
        assert (
            raw
            == b"\x01\x00\x00\x00a"
            + b"\x00" * 4
            + b"\x06\x00\x00\x00h\xc3\xa9llo"
            + b"\x02\x00\x00\x00\x00\xff"
        )
    finally:
        server.close()


def test_the_arena_grows_and_the_other_side_follows() -> None:
    server = BatchArena(1024, name="test")
    try:
        process = BatchArena(server.size, server.fd)
        big = np.arange(100_000, dtype=np.float64)
        descriptors, _ = server.write({"big": big}, 512)  # past the end: the memfd grows
        assert server.size >= 512 + big.nbytes
        with pytest.raises(TypeError):  # not mapped that far on this side yet
            process.read(descriptors[0], copy=True)
        process.follow(server.size)
        copied = process.read(descriptors[0], copy=True)
        server.write({"big": big * 0}, 512)
        assert copied.tolist() == big.tolist()  # a copy does not see the next batch
    finally:
        server.close()


def test_tensors_inside_messages() -> None:
    for name, array in ARRAYS.items():
        reader = FrameReader(msgspec.msgpack.Decoder(msg.FROM_MODEL))
        (message,) = fed(reader, frame(msg.Part(1, msg.Answered([channel.inline(name, array)]))))
        got = channel.inline_array(message.answer.outputs[0])
        assert got.shape == array.shape and got.tolist() == array.tolist()
        if got.dtype != object:
            got[...] = got  # writable, as a model may expect its inputs to be


def test_an_array_no_datatype_holds_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="tensor 'z' is complex64, which no tensor datatype holds"):
        channel.inline("z", np.zeros(2, np.complex64))
    big_endian = np.arange(3, dtype=">i4")  # its values, in the link's little-endian layout
    assert channel.inline_array(channel.inline("b", big_endian)).tolist() == [0, 1, 2]


def test_outputs_are_lent_as_views_and_the_next_batch_is_written_after_them(monkeypatch) -> None:
    """The server reads a batch's outputs as views of the Region (no copy); while any lives, the next
    batch's inputs go after them, so nothing is written under a view; once all are gone, batches start at
    the beginning again. BYTES and tensors in the message are arrays of their own."""
    import gc

    server = BatchArena(1 << 16)
    process = BatchArena(server.size, server.fd)
    assert server.start == 0
    inputs, end = server.write({"x": np.arange(100, dtype=np.float32)}, server.start)
    outputs, out_end = process.write(  # the process writes its outputs after the inputs
        {"y": np.full(50, 7, np.int32), "s": np.array([b"ab"], dtype=object)}, end
    )
    arrays = server.lend([*outputs, channel.inline("small", np.ones(2, np.int8))])
    assert np.shares_memory(arrays["y"], np.frombuffer(server.map, np.uint8))
    assert arrays["y"].tolist() == [7] * 50 and arrays["s"].tolist() == [b"ab"]
    _, y_offset, y_size = outputs[0].data
    assert server.lent == 1 and y_offset + y_size <= server.start < out_end  # BYTES are decoded: not lent
    row = arrays["y"][10:20]  # a request's rows: a view of the batch's output keeps it lent
    del arrays
    gc.collect()
    assert server.lent == 1
    server.write({"x": np.zeros(1000, np.float32)}, server.start)  # the next batch, as large as it can be
    assert row.tolist() == [7] * 10  # not written under
    del row
    gc.collect()
    assert server.lent == 0 and server.start == 0

    monkeypatch.setattr(channel, "LENT_MAX", 64)  # past it, copies: the Region does not grow for views
    outputs, _ = process.write({"y": np.full(50, 3, np.int32)}, 0)
    arrays = server.lend(outputs)
    assert not np.shares_memory(arrays["y"], np.frombuffer(server.map, np.uint8))
    assert server.lent == 0 and server.start == 0


def test_a_batch_s_rows_are_gathered_in_the_region_as_they_are_written() -> None:
    """A process model's staging hands execute each input's requests as Rows; the Region receives them side
    by side, so the process reads the batch it would have read gathered (non-contiguous parts too)."""
    transposed = np.arange(100, 106, dtype=np.float32).reshape(3, 2).T  # 2 rows of 3, not C-contiguous
    parts = [np.arange(6, dtype=np.float32).reshape(2, 3), transposed, np.full((1, 3), 9, np.float32)]
    gathered = channel.rows(parts)
    assert isinstance(gathered, channel.Rows) and gathered.shape == (5, 3)
    server = BatchArena(1 << 16)
    process = BatchArena(server.size, server.fd)
    tensors, _ = server.write({"x": gathered, "ids": np.arange(5, dtype=np.int64)}, 64)
    read = {t.name: process.read(t, copy=True) for t in tensors}
    assert read["x"].tolist() == np.concatenate(parts).tolist()
    assert channel.inline_array(channel.inline("x", gathered)).tolist() == np.concatenate(parts).tolist()
    assert channel.rows([parts[0]]) is parts[0]  # one request: its own array
    mixed = channel.rows([parts[0], parts[0].astype(np.float64)])  # dtypes that differ: gathered now
    assert isinstance(mixed, np.ndarray) and mixed.dtype == np.float64
    words = channel.rows([np.array([b"a"], dtype=object), np.array([b"bc"], dtype=object)])
    assert isinstance(words, np.ndarray) and words.tolist() == [b"a", b"bc"]
