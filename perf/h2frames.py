"""HTTP/2 frames as bytes, for the clients that write their own (bench/grpc_pingpong.py, bench/sequence.py,
perf/clients.py): the connection preface, the frame types and flags they use, and a frame's bytes.
Nothing here imports the server."""

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
WINDOW = (1 << 31) - 1  # the largest flow-control window


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload
