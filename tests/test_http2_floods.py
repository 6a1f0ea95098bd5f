"""HTTP/2 control-frame defences measured against what clients do (issue 24): a client reading answers sends
WINDOW_UPDATEs and PINGs in proportion to them (gRPC's C core: a stream and a connection WINDOW_UPDATE per
answer, and BDP PINGs), and is never cut off at any rate; a connection that only sends control frames, or
sends far more of them than its answers explain, still gets GOAWAY ENHANCE_YOUR_CALM. The flood table of
test_http2_transport.py covers each kind of frame on an idle connection.

A flood's verdict is the defence's own: GOAWAY ENHANCE_YOUR_CALM with its reason, before the server has
answered more of the flood than the limit lets through. A connection that merely closes (a handler that
raised, a write buffer that dropped a client not reading its answers) is no defence, and fails here."""

from __future__ import annotations

import pytest
from e2e_helpers import EXAMPLES
from h2_wire import (
    ACK,
    DATA,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    PING,
    PRIORITY,
    SETTINGS,
    WINDOW_UPDATE,
    H2Wire,
    frame,
)

pytestmark = pytest.mark.ours

ANSWERS = 3000
IN_FLIGHT = 16
FLOOD = 20_000
CONTROL_LIMIT = 1000  # --http2-max-control-frames-per-second's default


def _update(stream: int, size: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, size.to_bytes(4, "big"))


def expect_calm(h2: H2Wire, reason: bytes, within: int) -> None:
    """GOAWAY ENHANCE_YOUR_CALM with `reason` in its debug data, within `within` frames of the server's
    (h2_wire's strict expect_goaway, bounded): a close without it fails, and so do more frames before it
    (the flood was served, not stopped)."""
    for _ in range(within + 1):
        try:
            got = h2.read_frame()
        except TimeoutError:
            raise AssertionError("no GOAWAY: the server took the flood and went quiet") from None
        assert got is not None, "the connection closed without GOAWAY"
        if got.kind == GOAWAY:
            assert got.error_code == ENHANCE_YOUR_CALM, f"GOAWAY {got.error_code}: {got.payload[8:]!r}"
            assert reason in got.payload[8:], got.payload[8:]
            return
    raise AssertionError(f"{within + 1} frames and no GOAWAY: the flood was answered, not stopped")


def test_a_client_that_reads_answers_as_grpc_core_does_is_never_cut_off(start_server) -> None:
    """3,000 answers, each read with a stream and a connection WINDOW_UPDATE, and a BDP PING with an answer
    whenever none is awaiting its ACK (as grpc-core's estimator pings), as fast as the server answers:
    over 6,000 control frames on a server that allows 10 a second beyond the answers."""
    server = start_server(EXAMPLES, extra_args=("--http2-max-control-frames-per-second", "10"))
    with H2Wire(server.address, timeout=10) as h2:
        h2.open()
        sent = answered = pings = 0
        pinging = False
        next_stream = 1
        while answered < ANSWERS:
            burst = b""
            while sent - answered < IN_FLIGHT and sent < ANSWERS:
                burst += frame(HEADERS, 0x4 | END_STREAM, next_stream, h2.block())
                next_stream += 2
                sent += 1
            h2.send(burst)
            got = h2.read_frame()
            assert got is not None, "connection closed"
            assert got.kind != GOAWAY, f"GOAWAY {got.error_code}: {got.payload[8:]!r}"
            if got.kind == PING and got.flags & ACK:
                pinging = False
            if got.kind == DATA and got.flags & END_STREAM:
                answered += 1
                updates = _update(got.stream, len(got.payload)) + _update(0, len(got.payload))
                if not pinging:
                    pinging, pings = True, pings + 1
                    updates += frame(PING, 0, 0, answered.to_bytes(8, "big"))
                h2.send(updates)
        while pinging:  # the last BDP PING's ACK
            got = h2.read_frame()
            assert got is not None and got.kind != GOAWAY, got
            pinging = not (got.kind == PING and got.flags & ACK)
        h2.expect_alive()
    assert pings > 100


def test_a_ping_flood_without_requests_is_goaway(start_server) -> None:
    """20,000 PINGs in a second and no request: gRPC's keepalive policy ends it (too_many_pings) once the
    strikes (2 by default) are used up: three PINGs answered, no more."""
    server = start_server(EXAMPLES)
    with H2Wire(server.address) as h2:
        h2.open()
        h2.send(frame(PING, 0, 0, b"12345678") * FLOOD)
        expect_calm(h2, b"too_many_pings", within=3)


@pytest.mark.parametrize(
    "one",
    [
        _update(0, 1),
        frame(SETTINGS, 0, 0, b""),
        frame(PRIORITY, 0, 9, b"\x00\x00\x00\x00\x10"),
        frame(PING, ACK, 0, b"12345678"),  # an ACK of nothing: costs a read, serves nothing; not counted
    ],
    ids=["window-update", "settings", "priority", "ping-ack"],
)
def test_control_frames_far_beyond_the_answers_are_goaway(start_server, one: bytes) -> None:
    """One request answered, then 20,000 control frames: the answer explains ten, the limit a thousand a
    second (the default); the rest is a flood. Of the SETTINGS, each answered with an ACK, no more than
    the limit allows in two seconds (the flood may straddle one) are answered before the GOAWAY. PING ACKs
    are the exception: they cost a read and no write, like any frame the server ignores, so they are left
    to TCP."""
    server = start_server(EXAMPLES)
    with H2Wire(server.address) as h2:
        h2.open()
        h2.request(1)
        h2.expect_response(1)
        h2.send(one * FLOOD)
        if one[3] == PING:
            h2.expect_alive()
        else:
            expect_calm(h2, b"too many control frames", within=2 * CONTROL_LIMIT + 100)
