"""server/backends/channel.py alone: messages framed and split back at any cut; tensors through the
shared-memory arena (every kind of array, BYTES in Triton's form, growth seen from the other side) and
inside messages."""

from __future__ import annotations

import numpy as np
import pytest

from server.backends import channel
from server.backends.channel import Arena, Frames


def test_frames_come_back_whatever_the_cuts() -> None:
    messages = [[channel.EXECUTE, 1, [b"\x00" * 300, "x"]], [channel.LOG, 20, "héllo"], [channel.END, 7]]
    data = b"".join(channel.frame(m) for m in messages)
    for cut in (1, 3, 4, 5, 17, len(data) - 1):
        frames = Frames()
        got = frames.feed(data[:cut]) + frames.feed(data[cut:])
        assert got == messages
    frames = Frames()
    assert [m for byte in range(len(data)) for m in frames.feed(data[byte : byte + 1])] == messages


ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "i64_transposed": np.arange(6, dtype=np.int64).reshape(2, 3).T,  # not C-contiguous
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 5), dtype=np.int16),
    "scalar": np.array(7, dtype=np.uint8),
    "text": np.array([[b"a", b""], ["h\xe9llo".encode(), b"\x00\xff"]], dtype=object),
}


def test_arrays_go_through_the_arena_as_they_are() -> None:
    server = Arena.create("test", 4096)
    try:
        process = Arena(server.fd, server.size)  # the other side maps the same memfd
        descriptors, end = server.write(ARRAYS, 0)
        assert end % channel.ALIGN == 0
        for descriptor in descriptors:
            got = process.read(descriptor, copy=False)
            want = ARRAYS[descriptor[0]]
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tolist() == want.tolist()
        text = next(d for d in descriptors if d[0] == "text")
        assert text[1] == channel.BYTES  # Triton's serialized form: a 4-byte length, then the bytes
        raw = bytes(server.map[text[3] : text[3] + text[4]])
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
    server = Arena.create("test", 1024)
    try:
        process = Arena(server.fd, server.size)
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
        message = Frames().feed(channel.frame([channel.PART, 1, [channel.inline(name, array)]]))[0]
        descriptor = message[2][0]
        got = channel.inline_array(descriptor)
        assert got.shape == array.shape and got.tolist() == array.tolist()
        if got.dtype != object:
            got[...] = got  # writable, as a model may expect its inputs to be
