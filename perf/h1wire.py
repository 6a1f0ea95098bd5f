"""HTTP/1.1 on the client side, as bytes: a request serialised once, an answer's head, its chunked body
and where a whole answer ends. `tensorgate perf` and the bench's HTTP/1.1 load generators read with it."""


def build_request(
    method: str, path: str, host: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """One complete HTTP/1.1 request, head and body, ready to write as is."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, int | None]:
    """Status code and body length of a response head (None: chunked). Raises ValueError when malformed."""
    if not head.startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP/1.x response: {head[:40]!r}")
    status = int(head[9:12])
    lower = head.lower()
    i = lower.find(b"\r\ncontent-length:")
    if i >= 0:
        j = lower.find(b"\r\n", i + 17)
        return status, int(lower[i + 17 : j if j >= 0 else None])
    if b"\r\ntransfer-encoding:" in lower and b"chunked" in lower:
        return status, None
    return status, 0


def chunked_end(buf: bytes, pos: int) -> int:
    """Offset just past a chunked body starting at `pos`, or -1 while it is incomplete."""
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return -1
        size = int(buf[pos:eol].split(b";", 1)[0], 16)
        if size == 0:  # last chunk; the body ends at the blank line after any trailers
            end = buf.find(b"\r\n\r\n", eol)
            return -1 if end < 0 else end + 4
        pos = eol + 2 + size + 2
        if pos > len(buf):
            return -1


def dechunk(body: bytes) -> bytes:
    """A chunked body's chunks joined (the body whole, as chunked_end found it)."""
    parts, pos = [], 0
    while True:
        eol = body.find(b"\r\n", pos)
        size = int(body[pos:eol].split(b";", 1)[0], 16)
        if size == 0:
            return b"".join(parts)
        parts.append(body[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2


def whole_answer(buf: bytes) -> tuple[bytes, int, int, int, bool] | None:
    """The first answer in `buf` once it is whole: its head, status, where its body starts and ends, and
    whether the body is chunked; None while it is not. Raises ValueError when it is malformed."""
    i = buf.find(b"\r\n\r\n")
    if i < 0:
        return None
    head = buf[:i]
    status, length = parse_head(head)
    start = i + 4
    end = start + length if length is not None else chunked_end(buf, start)
    if end < 0 or len(buf) < end:
        return None
    return head, status, start, end, length is None
