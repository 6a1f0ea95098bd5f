"""Trailers after an answer (what gRPC's status needs), on our transport in process: an HTTP/2 HEADERS
frame with END_STREAM after the body, and chunked trailer fields over HTTP/1.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import hpack
import pytest
from e2e_helpers import serving_in_process
from h2_wire import DATA, END_STREAM, HEADERS, H2Wire

from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

pytestmark = pytest.mark.ours


def _router() -> Router:
    async def listed(request: HttpRequest) -> HttpResponse:
        response = body_response(b"whole")
        response.trailers = [(b"x-status", b"0"), (b"x-message", b"done")]
        return response

    async def streamed(request: HttpRequest) -> HttpResponse:
        trailers: list[tuple[bytes, bytes]] = []

        async def chunks() -> AsyncIterator[bytes]:
            yield b"one,"
            yield b"two"
            trailers.append((b"x-status", b"7"))  # known only once the stream has ended

        return HttpResponse(200, [(b"content-type", b"text/plain")], chunks(), trailers)

    router = Router(fallback_errors=lambda error: body_response(b"{}", status=404))
    router.add("GET", "/listed", listed, router.fallback_errors)
    router.add("GET", "/streamed", streamed, router.fallback_errors)
    return router


async def _serving(client) -> object:
    return await serving_in_process(_router(), client)


def _h2_answer(address: tuple[str, int], path: str) -> tuple[bytes, list[tuple[str, str]], int]:
    """(body, trailer fields, flags of the frame that ended the stream)."""
    with H2Wire(address) as h2:
        h2.open()
        h2.request(1, "GET", path)
        decoder, body, blocks = hpack.Decoder(), b"", []
        while True:
            got = h2.read_frame()
            assert got is not None
            if got.stream != 1:
                continue
            if got.kind == HEADERS:
                blocks.append(decoder.decode(got.payload))
            elif got.kind == DATA:
                body += got.payload
                assert not got.flags & END_STREAM, "the body ended the stream: no room for trailers"
            if got.flags & END_STREAM:
                assert got.kind == HEADERS
                assert not any(name.startswith(":") for name, _ in blocks[-1])
                return body, blocks[-1], len(blocks)


@pytest.mark.parametrize(
    ("path", "body", "trailers"),
    [
        ("/listed", b"whole", [("x-status", "0"), ("x-message", "done")]),
        ("/streamed", b"one,two", [("x-status", "7")]),
    ],
)
def test_http2_trailers_follow_the_body(path: str, body: bytes, trailers: list) -> None:
    got_body, got_trailers, blocks = asyncio.run(_serving(lambda address: _h2_answer(address, path)))
    assert (got_body, got_trailers, blocks) == (body, trailers, 2)


def test_http11_chunked_answer_carries_its_trailers() -> None:
    def fetch(address: tuple[str, int]) -> bytes:
        with socket.create_connection(address, timeout=5) as sock:
            sock.sendall(b"GET /streamed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        return raw

    raw = asyncio.run(_serving(fetch))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"4\r\none,\r\n3\r\ntwo\r\n0\r\nx-status: 7\r\n\r\n"
