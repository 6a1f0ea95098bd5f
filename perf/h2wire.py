"""HTTP/2 on the client side through the `h2` package: the connection's configuration (no header
validation, huge windows), a request's headers, and sending what a stream's window allows. `tensorgate
perf` and the bench's HTTP/2 load generator use it."""

from h2.config import H2Configuration
from h2.connection import H2Connection

CONFIG = H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)
WINDOW = 2**30


def build_headers(
    method: str, path: str, authority: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> list[tuple[bytes, bytes]]:
    """The request's header block (pseudo-headers first), as bytes pairs for h2."""
    block = [(b":method", method.encode()), (b":scheme", b"http"), (b":authority", authority.encode())]
    block.append((b":path", path.encode()))
    block += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if body:
        block.append((b"content-length", str(len(body)).encode()))
    return block


def pump(conn: H2Connection, unsent: dict[int, memoryview], sid: int) -> None:
    """Sends as much of stream `sid`'s body (`unsent[sid]`) as the peer's windows and frame size allow;
    what is left stays in `unsent` for the next WindowUpdated."""
    data = unsent[sid]
    while data:
        n = min(len(data), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
        if n <= 0:
            unsent[sid] = data
            return
        conn.send_data(sid, data[:n].tobytes(), end_stream=n == len(data))
        data = data[n:]
    del unsent[sid]
