"""A raw HTTP/2 client for tests: frames built and read by hand (malformed ones included), HPACK by the
`hpack` package, and the verdicts h2spec uses (a connection error, a stream error, still alive)."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

import hpack
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from tensorgate.server.http.hpack_encode import integer

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/v2/health/live"  # a request that gets a response
POST_PATH = "/v2/models/nowhere/infer"  # any POST gets an answer (404) once its body is in
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 0xB
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 1, 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6


@dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def error_code(self) -> int:
        """RST_STREAM's code, or GOAWAY's."""
        return struct.unpack(">I", self.payload[4:8] if self.kind == GOAWAY else self.payload[:4])[0]


def frame(kind: int, flags: int, stream: int, payload: bytes = b"", length: int | None = None) -> bytes:
    """A frame; `length` overrides the length field (for malformed frames)."""
    size = len(payload) if length is None else length
    return size.to_bytes(3, "big") + bytes((kind, flags)) + (stream & 0xFFFFFFFF).to_bytes(4, "big") + payload


def settings(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in pairs)


class H2Wire:
    """One connection: `open()` does h2spec's handshake (both SETTINGS sent and acknowledged)."""

    def __init__(self, address: tuple[str, int], timeout: float = 2.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buffer = b""
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.server_settings: dict[int, int] = {}
        self.authority = f"{address[0]}:{address[1]}"

    def __enter__(self) -> H2Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def open(self, client_settings: bytes | None = None) -> H2Wire:
        """h2spec's handshake (spec/connection.go handshakeAsClient): the preface and our SETTINGS
        (h2spec's SETTINGS_INITIAL_WINDOW_SIZE 65535 unless `client_settings` is given), then frames read
        until both the server's SETTINGS (ACKed, kept in `server_settings`) and its ACK of ours came; any
        other frame is passed over, as h2spec does. A later wait for an ACK then sees only its own."""
        if client_settings is None:
            client_settings = settings((S_INITIAL_WINDOW_SIZE, 65535))
        self.send(PREFACE + frame(SETTINGS, 0, 0, client_settings))
        theirs = acked = False
        while not (theirs and acked):
            got = self.read_frame()
            assert got is not None, "connection closed during the handshake"
            if got.kind != SETTINGS:
                continue
            if got.flags & ACK:
                acked = True
                continue
            theirs = True
            for offset in range(0, len(got.payload), 6):
                key, value = struct.unpack(">HI", got.payload[offset : offset + 6])
                self.server_settings[key] = value
            self.send(frame(SETTINGS, ACK, 0))
        return self

    @property
    def max_frame(self) -> int:
        return self.server_settings.get(S_MAX_FRAME_SIZE, 16384)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def block(self, method: str = "GET", path: str = "/v2/health/live", extra: list | None = None) -> bytes:
        fields = [(":method", method), (":scheme", "http"), (":path", path), (":authority", self.authority)]
        return self.encoder.encode(fields + list(extra or []))

    def request(
        self,
        stream: int,
        method: str = "GET",
        path: str = "/v2/health/live",
        body: bytes | None = None,
        extra=None,
    ) -> None:
        extra = list(extra or [])
        if body is not None:
            extra.append(("content-length", str(len(body))))
        flags = END_HEADERS | (END_STREAM if body is None else 0)
        out = frame(HEADERS, flags, stream, self.block(method, path, extra))
        if body is not None:
            out += frame(DATA, END_STREAM, stream, body)
        self.send(out)

    def read_frame(self, timeout: float | None = None) -> Frame | None:
        """The next frame; None when the connection closed; raises TimeoutError when none comes."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            if len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) >= 9 + length:
                    head, payload = self.buffer[:9], self.buffer[9 : 9 + length]
                    self.buffer = self.buffer[9 + length :]
                    return Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            except TimeoutError:
                raise TimeoutError("no frame") from None
            if not chunk:
                return None
            self.buffer += chunk

    def frames_until(self, done, timeout: float | None = None) -> list[Frame]:
        """Frames until `done(frame)` is true for one (included) or the connection closes (None last)."""
        seen: list[Frame] = []
        while True:
            got = self.read_frame(timeout)
            seen.append(got)
            if got is None or done(got):
                return seen

    def response(self, stream: int) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of `stream`, WINDOW_UPDATEs not sent (bodies here are small)."""
        status, headers, body = 0, {}, b""
        while True:
            got = self.read_frame()
            assert got is not None, "connection closed before the response ended"
            assert got.kind != GOAWAY, f"GOAWAY {got.error_code}: {got.payload[8:]!r}"
            if got.stream != stream:
                continue
            assert got.kind != RST_STREAM, f"stream reset with {got.error_code}"
            if got.kind == HEADERS:
                for name, value in self.decoder.decode(got.payload):
                    if name == ":status":
                        status = int(value)
                    else:
                        headers[name] = value
            elif got.kind == DATA:
                body += got.payload
            if got.flags & END_STREAM:
                return status, headers, body

    def expect_response(self, stream: int = 1, status: int = 200) -> None:
        assert self.response(stream)[0] == status

    # ---- h2spec's verdicts

    def expect_connection_error(self, *codes: int) -> None:
        """A GOAWAY with one of `codes`, or the connection closed (h2spec's VerifyConnectionError). Stricter
        than h2spec in one way: a GOAWAY with another code fails here, where h2spec reads on and passes
        when the close follows it."""
        for got in self.frames_until(lambda f: f.kind == GOAWAY, timeout=self.timeout):
            if got is None:
                return
            if got.kind == GOAWAY:
                assert got.error_code in codes, f"GOAWAY {got.error_code}, wanted one of {codes}"
                return

    def expect_stream_error(self, stream: int, *codes: int) -> None:
        """RST_STREAM on `stream` with one of `codes`, or a connection error with one of them (h2spec's
        VerifyStreamError, stricter as expect_connection_error is)."""
        for got in self.frames_until(
            lambda f: f.kind == GOAWAY or (f.kind == RST_STREAM and f.stream == stream), timeout=self.timeout
        ):
            if got is None:
                return
            if got.kind in (GOAWAY, RST_STREAM):
                assert got.error_code in codes, f"{got.kind} {got.error_code}, wanted one of {codes}"
                return

    def expect_alive(self) -> None:
        """A PING answered with its ACK: the connection still works."""
        self.send(frame(PING, 0, 0, b"alive!!!"))
        for got in self.frames_until(lambda f: f.kind == PING and f.flags & ACK):
            assert got is not None, "connection closed"
            assert got.kind != GOAWAY, f"GOAWAY {got.error_code}"
        assert got.payload == b"alive!!!"

    def expect_settings_ack(self) -> None:
        """h2spec's VerifySettingsFrameWithAck: the next SETTINGS frame (others passed over) is an ACK;
        the connection closing first fails."""
        got = self.frames_until(lambda f: f.kind == SETTINGS)[-1]
        assert got is not None, "connection closed before a SETTINGS ACK"
        assert got.flags & ACK, "a SETTINGS frame without ACK"

    def expect_ping_ack(self, data: bytes) -> None:
        """h2spec's VerifyPingFrameWithAck: the next PING frame (others passed over) is an ACK with
        `data`; the connection closing first fails."""
        got = self.frames_until(lambda f: f.kind == PING)[-1]
        assert got is not None, "connection closed before a PING ACK"
        assert got.flags & ACK and got.payload == data, f"PING flags {got.flags} {got.payload!r}"

    def expect_goaway(self, code: int) -> None:
        """h2spec's WaitEventByType(GOAWAY) verdict (6.9.1): a GOAWAY with `code`; a close alone fails."""
        got = self.frames_until(lambda f: f.kind == GOAWAY)[-1]
        assert got is not None, f"connection closed without GOAWAY {code}"
        assert got.error_code == code, f"GOAWAY {got.error_code}, wanted {code}"

    def expect_rst_stream(self, stream: int, code: int) -> None:
        """h2spec's WaitEventByType(RST_STREAM) verdict (6.9.1): RST_STREAM on `stream` with `code`; a
        GOAWAY is passed over and a close without the RST_STREAM fails."""
        got = self.frames_until(lambda f: f.kind == RST_STREAM and f.stream == stream)[-1]
        assert got is not None, f"connection closed without RST_STREAM {code} on stream {stream}"
        assert got.error_code == code, f"RST_STREAM {got.error_code}, wanted {code}"


def priority(depends_on: int, weight: int = 15, exclusive: bool = False) -> bytes:
    """A PRIORITY payload (and HEADERS' priority fields)."""
    return struct.pack(">IB", depends_on | (0x80000000 if exclusive else 0), weight)


def literal(first: int, prefix_bits: int, index: int, name: bytes, value: bytes, huffman: bool) -> bytes:
    """One HPACK literal field: `index` > 0 names it from the static table, else `name` follows."""

    def string(text: bytes) -> bytes:
        if huffman:
            coded = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode(text)
            return integer(len(coded), 7, 0x80) + coded
        return integer(len(text), 7) + text

    out = integer(index, prefix_bits, first)
    if index == 0:
        out += string(name)
    return out + string(value)


def request_block(extra: bytes) -> bytes:
    """:method GET, :scheme http, :path PATH, :authority, then `extra` (raw HPACK)."""
    return (
        b"\x82\x86"
        + literal(0x00, 4, 4, b"", PATH.encode(), False)
        + literal(0x00, 4, 1, b"", b"x", False)
        + extra
    )


def literals(fields: list[tuple[str, str]]) -> bytes:
    """Fields as literals without indexing: they leave the connection's dynamic table alone, so the
    server's decoder and a client's encoder stay in step after a refused block."""
    return b"".join(literal(0x00, 4, 0, name.encode(), value.encode(), False) for name, value in fields)
