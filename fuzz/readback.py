"""What the server wrote, read back the way a client would, for the transport's fuzz targets
(fuzz/transport.py): `http1_answers` reads HTTP/1.1 answers, `http2_answers` HTTP/2 frames (their header
blocks decoded by the `hpack` package). Anything a client could not read raises `Mismatch`. Written plainly
from RFC 9112 and RFC 9113, sharing no code with the server."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hpack import Decoder as HpackDecoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Mismatch(Exception):
    """Not what it should be: the server's output does not read back, or a parser disagrees with an
    independent reading of the same input. A finding."""


# --------------------------------------------------------------------------------------- HTTP/1.1

_STATUS = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) [^\r\n]*\r\n")
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+): ?([^\r\n]*)\r\n")
_CHUNK = re.compile(rb"([0-9a-fA-F]{1,16})\r\n")
_SINGLE = (b"content-length", b"transfer-encoding", b"connection")


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    complete: bool = True  # False: a streamed body the connection's end cut between chunks


def _fields(out: bytes, pos: int, where: str) -> tuple[dict[bytes, bytes], int]:
    headers: dict[bytes, bytes] = {}
    while not out.startswith(b"\r\n", pos):
        line = _FIELD.match(out, pos)
        if line is None:
            raise Mismatch(f"a malformed {where} line at byte {pos}: {out[pos : pos + 80]!r}")
        name = line.group(1).lower()
        if name in headers and name in _SINGLE:
            raise Mismatch(f"{name.decode()} twice in one {where}: {out[: pos + 80][-400:]!r}")
        headers[name] = line.group(2)
        pos = line.end()
    return headers, pos + 2


def _chunked(out: bytes, pos: int) -> tuple[bytes, int, bool]:
    """A chunked body from `pos`: the body, the position after it, whether it ended (its last chunk and
    trailers came). Only the end of the output may cut it, and only between chunks."""
    body = bytearray()
    while True:
        if pos == len(out):
            return bytes(body), pos, False
        line = _CHUNK.match(out, pos)
        if line is None:
            raise Mismatch(f"a malformed chunk size at byte {pos}: {out[pos : pos + 80]!r}")
        size, pos = int(line.group(1), 16), line.end()
        if size == 0:
            break
        if out[pos + size : pos + size + 2] != b"\r\n":
            raise Mismatch(f"a chunk of {size} bytes not ended by CRLF at byte {pos}: {out[pos:][:200]!r}")
        body += out[pos : pos + size]
        pos += size + 2
    _, pos = _fields(out, pos, "trailer")
    return bytes(body), pos, True


def http1_answers(out: bytes, methods: list[str]) -> list[Answer]:
    """The HTTP/1.1 answers in `out`, interim (1xx) ones included; `methods` are those of the requests
    the final answers answer, in order (HEAD's has no body). Each must be a status line, header lines
    and a body framed as they say; no answer may follow `connection: close`; only the last, streamed,
    may be cut short."""
    answers: list[Answer] = []
    finals, pos, end = 0, 0, len(out)
    while pos < end:
        line = _STATUS.match(out, pos)
        if line is None:
            raise Mismatch(f"no status line at byte {pos} of the output: {out[max(0, pos - 200) :][:400]!r}")
        status = int(line.group(1))
        headers, pos = _fields(out, line.end(), "header")
        if status < 200:
            answers.append(Answer(status, headers, b""))
            continue
        if finals >= len(methods):
            raise Mismatch(f"more answers than requests answered ({methods}): {out[:2000]!r}")
        method, finals = methods[finals], finals + 1
        length, coding = headers.get(b"content-length"), headers.get(b"transfer-encoding")
        if length is not None and coding is not None:
            raise Mismatch(f"an answer with both Content-Length and Transfer-Encoding: {out[:2000]!r}")
        complete = True
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif coding is not None:
            if coding.lower() != b"chunked":
                raise Mismatch(f"transfer-encoding {coding!r}")
            body, pos, complete = _chunked(out, pos)
        elif length is not None:
            if not length.isdigit():
                raise Mismatch(f"content-length {length!r}")
            body = out[pos : pos + int(length)]
            if len(body) < int(length):
                raise Mismatch(f"a body of {len(body)} bytes under content-length {int(length)}")
            pos += len(body)
        else:  # the body runs to the connection's close
            body, pos = out[pos:], end
        answers.append(Answer(status, headers, body, complete))
        if pos < end and headers.get(b"connection", b"").lower() == b"close":
            raise Mismatch(f"bytes after an answer with connection: close: {out[pos:][:400]!r}")
    return answers


# --------------------------------------------------------------------------------------- HTTP/2

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
DEFAULT_FRAME, LARGEST_FRAME = 16384, (1 << 24) - 1
_ON_CONNECTION = frozenset({SETTINGS, PING, GOAWAY})
_CODE = re.compile(rb"[1-5][0-9][0-9]")
_LENGTHS = {RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4, PRIORITY: 5}


@dataclass
class Stream:
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    trailers: list[tuple[bytes, bytes]] | None = None
    ended: bool = False  # END_STREAM sent
    reset: bool = False  # RST_STREAM sent


def client_max_frame(sent: bytes) -> int:
    """The largest frame the client's SETTINGS allow the server (the default, or the largest
    SETTINGS_MAX_FRAME_SIZE among the client's frames, read leniently: the server may have stopped
    reading before it)."""
    largest, pos = DEFAULT_FRAME, sent.find(PREFACE)
    if pos < 0:
        return largest
    pos += len(PREFACE)
    while len(sent) - pos >= 9:
        length, kind = int.from_bytes(sent[pos : pos + 3], "big"), sent[pos + 3]
        payload = sent[pos + 9 : pos + 9 + length]
        if kind == SETTINGS and not sent[pos + 4] & ACK:
            for at in range(0, len(payload) - 5, 6):
                if int.from_bytes(payload[at : at + 2], "big") == 5:  # SETTINGS_MAX_FRAME_SIZE
                    value = int.from_bytes(payload[at + 2 : at + 6], "big")
                    if value <= LARGEST_FRAME:
                        largest = max(largest, value)
        pos += 9 + length
    return largest


def _unpad(payload: bytes, flags: int, what: str) -> bytes:
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise Mismatch(f"a {what} frame's padding exceeds it")
        payload = payload[1 : len(payload) - payload[0]]
    return payload


def http2_answers(out: bytes, max_frame: int = DEFAULT_FRAME) -> dict[int, Stream]:
    """The streams answered in `out`, the frames an HTTP/2 server wrote. Those must be: the server's
    SETTINGS first, whole frames of the client's allowed size, each on stream 0 or not as its type says
    with the length its type says; header blocks uninterrupted (HEADERS then its CONTINUATIONs) that
    the `hpack` package decodes, `:status` first in a stream's first; DATA only after those headers; on
    a stream nothing after END_STREAM or RST_STREAM but RST_STREAM and WINDOW_UPDATE; no push."""
    decoder = HpackDecoder(max_header_list_size=1 << 24)
    streams: dict[int, Stream] = {}
    block: tuple[int, int, bytearray] | None = None  # stream, flags, the header block so far
    pos = 0
    while pos < len(out):
        if len(out) - pos < 9:
            raise Mismatch(f"a frame head cut at byte {pos}: {out[pos:]!r}")
        length, kind, flags = int.from_bytes(out[pos : pos + 3], "big"), out[pos + 3], out[pos + 4]
        stream_id = int.from_bytes(out[pos + 5 : pos + 9], "big")
        payload = out[pos + 9 : pos + 9 + length]
        where = f"frame type {kind} flags {flags:#x} stream {stream_id} at byte {pos}"
        if len(payload) < length:
            raise Mismatch(f"{where} cut: {len(payload)} of {length} bytes")
        if pos == 0 and (kind != SETTINGS or flags & ACK):
            raise Mismatch(f"the output does not start with the server's SETTINGS: {out[:40]!r}")
        pos += 9 + length
        if stream_id >> 31:
            raise Mismatch(f"{where}: the reserved bit set")
        if length > max_frame:
            raise Mismatch(f"{where}: {length} bytes, over the client's {max_frame}")
        if kind > CONTINUATION or kind == PUSH_PROMISE:
            raise Mismatch(f"{where}: a server never sends that type")
        if (kind in _ON_CONNECTION) != (stream_id == 0) and kind != WINDOW_UPDATE:
            raise Mismatch(f"{where}: on the wrong stream for its type")
        if kind in _LENGTHS and length != _LENGTHS[kind]:
            raise Mismatch(f"{where}: {length} bytes, not {_LENGTHS[kind]}")
        if block is not None and (kind != CONTINUATION or stream_id != block[0]):
            raise Mismatch(f"{where} interrupts the header block of stream {block[0]}")
        if kind == SETTINGS and (length % 6 if not flags & ACK else length):
            raise Mismatch(f"{where}: a SETTINGS payload of {length} bytes")
        elif kind == GOAWAY and length < 8:
            raise Mismatch(f"{where}: a GOAWAY of {length} bytes")
        elif kind == WINDOW_UPDATE and not 0 < int.from_bytes(payload, "big") < 1 << 31:
            raise Mismatch(f"{where}: a window increment of {int.from_bytes(payload, 'big')}")
        elif kind == RST_STREAM:
            streams.setdefault(stream_id, Stream()).reset = True
        elif kind in (HEADERS, DATA):
            stream = streams.setdefault(stream_id, Stream())
            if stream.ended or stream.reset:
                raise Mismatch(f"{where}: after the stream's END_STREAM or RST_STREAM")
            payload = _unpad(payload, flags, "HEADERS" if kind == HEADERS else "DATA")
            if kind == HEADERS:
                block = (stream_id, flags, bytearray(payload[5:] if flags & PRIORITY_FLAG else payload))
            elif stream.status is None:
                raise Mismatch(f"{where}: DATA before the stream's headers")
            else:
                stream.body += payload
                stream.ended = bool(flags & END_STREAM)
        elif kind == CONTINUATION:
            if block is None:
                raise Mismatch(f"{where}: a CONTINUATION outside a header block")
            block[2].extend(payload)
        if kind in (HEADERS, CONTINUATION) and flags & END_HEADERS:
            _headers_read(streams[block[0]], block[1], bytes(block[2]), decoder, where)
            block = None
    if block is not None:
        raise Mismatch(f"the header block of stream {block[0]} never ends")
    return streams


def _headers_read(stream: Stream, flags: int, block: bytes, decoder: HpackDecoder, where: str) -> None:
    try:
        fields = [(bytes(n), bytes(v)) for n, v in decoder.decode(block, raw=True)]
    except Exception as e:  # the hpack package's refusal
        raise Mismatch(f"{where}: a header block the hpack package refuses ({e!r}): {block!r}") from None
    pseudo = [name for name, _ in fields if name.startswith(b":")]
    if stream.status is None or stream.status < 200:  # an answer's head (after interim ones, if any)
        if pseudo != [b":status"] or fields[0][0] != b":status" or not _CODE.fullmatch(fields[0][1]):
            raise Mismatch(f"{where}: an answer's header block without one :status first: {fields!r}")
        stream.status, stream.headers = int(fields[0][1]), fields[1:]
        if stream.status < 200 and flags & END_STREAM:
            raise Mismatch(f"{where}: an interim answer ends the stream")
    elif not flags & END_STREAM or pseudo:
        raise Mismatch(f"{where}: a second header block that is not trailers: {fields!r}")
    else:
        stream.trailers = fields
    stream.ended = bool(flags & END_STREAM)
