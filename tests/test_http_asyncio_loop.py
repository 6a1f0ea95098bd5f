"""Our transport on asyncio's own event loop (where uvloop is absent: Windows), in process: the loop hands
a connection `data_received`, which it copies into `get_buffer` piece by piece (server/http/connection.py).
A large body read straight into its buffer, with the next request pipelined behind it in the same bytes,
and the HTTP/2 preface, must read as they do on uvloop."""

from __future__ import annotations

import asyncio
import hashlib
import socket

import pytest
from e2e_helpers import serving_in_process
from h2_wire import DATA, END_STREAM, HEADERS, H2Wire

from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

pytestmark = pytest.mark.ours

BODY = bytes(range(256)) * 8192  # 2 MiB: more than one read, received into its own buffer


def _router() -> Router:
    async def digest(request: HttpRequest) -> HttpResponse:
        return body_response(hashlib.sha256(request.body).hexdigest().encode(), b"text/plain")

    router = Router(fallback_errors=lambda error: body_response(b"{}", status=404))
    router.add("POST", "/digest", digest, router.fallback_errors)
    return router


async def _serving(client) -> object:
    assert not type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    return await serving_in_process(_router(), client)


def _post(body: bytes, close: bool = False) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    head = b"POST /digest HTTP/1.1\r\nHost: x\r\n%bContent-Length: %d\r\n\r\n" % (connection, len(body))
    return head + body


def test_a_large_body_and_the_request_pipelined_behind_it() -> None:
    def fetch(address: tuple[str, int]) -> bytes:
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(_post(BODY) + _post(b"next", close=True))
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        return raw

    raw = asyncio.run(_serving(fetch))
    answers = raw.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert [answer.partition(b"\r\n\r\n")[2] for answer in answers] == [
        hashlib.sha256(BODY).hexdigest().encode(),
        hashlib.sha256(b"next").hexdigest().encode(),
    ]


def test_http2_prior_knowledge_reads_its_body() -> None:
    def fetch(address: tuple[str, int]) -> bytes:
        with H2Wire(address) as h2:
            h2.open()
            h2.request(1, "POST", "/digest", BODY[:16_000])
            body = b""
            while (got := h2.read_frame()) is not None:
                if got.stream == 1 and got.kind == DATA:
                    body += got.payload
                if got.stream == 1 and got.flags & END_STREAM and got.kind in (DATA, HEADERS):
                    return body
        raise AssertionError("the stream did not end")

    assert asyncio.run(_serving(fetch)) == hashlib.sha256(BODY[:16_000]).hexdigest().encode()
