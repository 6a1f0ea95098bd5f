"""The one framing of the server's links between processes, sans-IO: each message a MessagePack value
(msgspec; nothing pickled, so nothing a process receives can run code) after its 4-byte little-endian
length. Both links use it: a front-end worker and its engine (server/link.py), and the server and a
python model's process (server/backends/instance.py, stub.py).

`FrameReader` receives bytes into a buffer of its own, either straight from the socket (`get_buffer` /
`received`, asyncio's BufferedProtocol: no copy) or as a blocking `recv` gives them (`feed`), and hands
out whole messages one at a time (`next`), so a reader may stop between two of them and resume later.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import numpy as np

LENGTH = struct.Struct("<I")
NOTHING: Any = object()  # FrameReader.next: no whole message yet
READ_BUFFER = 256 << 10


def _plain(value: Any) -> Any:
    """What msgspec cannot write itself: numpy scalars and arrays a model put in its parameters."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise NotImplementedError(f"{type(value).__name__} cannot cross to another process")


_encoder = msgspec.msgpack.Encoder(enc_hook=_plain)
_decoder = msgspec.msgpack.Decoder()


class Invalid(Exception):
    """A whole message whose fields do not match its kind (msgspec.ValidationError): it is dropped, and
    the call it names (`call`, 0: none) fails; the framing after it is intact."""

    def __init__(self, call: int, error: msgspec.ValidationError) -> None:
        super().__init__(str(error))
        self.call = call


def pack(message: Any) -> bytes:
    return _encoder.encode(message)


def unpack(data: bytes | memoryview) -> Any:
    return _decoder.decode(data)


def frame(message: Any) -> bytes:
    """A message with its length before it."""
    body = _encoder.encode(message)
    return LENGTH.pack(len(body)) + body


class FrameReader:
    def __init__(self, decoder: msgspec.msgpack.Decoder = _decoder, size: int = READ_BUFFER) -> None:
        """`decoder`: what the reader's peer may send (a union of codec/messages.py's Structs), or any
        MessagePack value."""
        self.decoder = decoder
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0  # the bytes received and not yet handed out

    def get_buffer(self, sizehint: int = 0) -> memoryview:
        """Where the next bytes go: the free end of the buffer, made room for (the message in progress
        moved to the front, or the buffer doubled) when there is none."""
        if self.end == len(self.buffer):
            size = self.end - self.start
            if self.start == 0:
                self.buffer = bytearray(2 * len(self.buffer))
                self.buffer[:size] = self.view[:size]
            else:
                self.buffer[:size] = self.view[self.start : self.end]
            self.view = memoryview(self.buffer)
            self.start, self.end = 0, size
        return self.view[self.end :]

    def received(self, nbytes: int) -> None:
        """`nbytes` were written where get_buffer said."""
        self.end += nbytes

    def feed(self, data: bytes) -> None:
        while data:
            room = self.get_buffer()
            taken = min(len(room), len(data))
            room[:taken] = data[:taken]
            self.received(taken)
            data = data[taken:]

    @property
    def pending(self) -> bool:
        """Whether bytes wait that `next` has not handed out (a whole message, or part of one)."""
        return self.end > self.start

    def next(self) -> Any:
        """The next whole message (NOTHING if none is in yet). Raises Invalid for a message the peer may
        not send (it is dropped), and msgspec.DecodeError for bytes that are not MessagePack: nothing
        after those can be trusted, so the link ends."""
        start, end = self.start, self.end
        if end - start < 4:
            return NOTHING
        (length,) = LENGTH.unpack_from(self.view, start)
        if end - start - 4 < length:
            if length + 4 > len(self.buffer):  # larger than the buffer: room for it whole
                grown = bytearray(length + 4)
                grown[: end - start] = self.view[start:end]
                self.buffer, self.view = grown, memoryview(grown)
                self.start, self.end = 0, end - start
            return NOTHING
        body = self.view[start + 4 : start + 4 + length]
        after = start + 4 + length
        try:
            message = self.decoder.decode(body)
        except msgspec.ValidationError as e:
            self.start, self.end = (0, 0) if after == end else (after, end)
            raise Invalid(_call_of(body), e) from None
        if after == end:
            self.start = self.end = 0
        else:
            self.start = after
        return message


def _call_of(body: memoryview) -> int:
    """The call an invalid message names: its second element, when it is an array of an int and more."""
    try:
        value = _decoder.decode(body)
    except msgspec.DecodeError:
        return 0
    if type(value) is list and len(value) > 1 and type(value[1]) is int:
        return value[1]
    return 0


def receive(sock: Any, reader: FrameReader) -> Any:
    """Blocking: the next message on `sock` (None once the peer closed it)."""
    while (message := reader.next()) is NOTHING:
        data = sock.recv(65536)
        if not data:
            return None
        reader.feed(data)
    return message
