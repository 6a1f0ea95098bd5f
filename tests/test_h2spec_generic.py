"""h2spec's `generic` server cases (github.com/summerwind/h2spec) on raw frames; `http2` beside it.

One test per case, named by h2spec's section; each sends what h2spec sends and judges as it does: a
connection error is a GOAWAY with the code or the connection closed; a stream error is RST_STREAM with
the code, or a connection error with it; a success is the response, a PING's ACK, or a frame checked.
The `h2` fixture (conftest.py) is a connection to the shared example server after h2spec's handshake
(both sides' SETTINGS sent and acknowledged), so a later wait for a SETTINGS ACK sees only its own.
"""

from __future__ import annotations

import struct

import pytest
from h2_wire import (
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    POST_PATH,
    PRIORITY,
    PRIORITY_FLAG,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    H2Wire,
    frame,
    literal,
    priority,
    request_block,
    settings,
)
from server_log import no_traceback_in_the_server_log  # noqa: F401  (autouse: a Traceback fails)

pytestmark = pytest.mark.ours


def test_generic_1_client_connection_preface(h2: H2Wire) -> None:
    h2.expect_alive()


def test_generic_2_1_priority_on_idle_stream(h2: H2Wire) -> None:
    h2.send(frame(PRIORITY, 0, 1, priority(0)))
    h2.request(1)
    h2.expect_response()


def test_generic_2_2_window_update_on_half_closed_remote(h2: H2Wire) -> None:
    """Window 0 first, so the stream stays half-closed (remote) until the WINDOW_UPDATE opens it."""
    h2.send(frame(SETTINGS, 0, 0, settings((S_INITIAL_WINDOW_SIZE, 0))))
    h2.request(1)
    h2.send(frame(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
    assert h2.frames_until(lambda f: f.kind == DATA)[-1] is not None, "closed before a DATA frame"


def test_generic_2_3_priority_on_half_closed_remote(h2: H2Wire) -> None:
    h2.send(frame(SETTINGS, 0, 0, settings((S_INITIAL_WINDOW_SIZE, 0))))
    h2.request(1)
    h2.send(frame(PRIORITY, 0, 1, priority(0, 255)))
    h2.send(frame(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
    assert h2.frames_until(lambda f: f.kind == DATA)[-1] is not None, "closed before a DATA frame"


def test_generic_2_4_rst_stream_on_half_closed_remote(h2: H2Wire) -> None:
    h2.request(1)
    h2.send(frame(RST_STREAM, 0, 1, CANCEL.to_bytes(4, "big")))
    h2.expect_alive()


def test_generic_2_5_priority_on_closed_stream(h2: H2Wire) -> None:
    h2.request(1)
    h2.expect_response()
    h2.send(frame(PRIORITY, 0, 1, priority(0)))
    h2.expect_alive()


def test_generic_3_10_1_continuation(h2: H2Wire) -> None:
    block = h2.block()
    h2.send(frame(HEADERS, END_STREAM, 1, block[:5]) + frame(CONTINUATION, END_HEADERS, 1, block[5:]))
    h2.expect_response()


def test_generic_3_10_2_multiple_continuations(h2: H2Wire) -> None:
    block = h2.block(extra=[("x-pad", "p" * 40)])
    pieces = [block[i : i + 8] for i in range(0, len(block), 8)]
    out = frame(HEADERS, END_STREAM, 1, pieces[0])
    out += b"".join(frame(CONTINUATION, 0, 1, p) for p in pieces[1:-1])
    h2.send(out + frame(CONTINUATION, END_HEADERS, 1, pieces[-1]))
    h2.expect_response()


def test_generic_3_1_1_data(h2: H2Wire) -> None:
    h2.request(1, "POST", POST_PATH, b"test")
    h2.expect_response(status=404)


def test_generic_3_1_2_multiple_data(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", POST_PATH)))
    h2.send(frame(DATA, 0, 1, b"te") + frame(DATA, 0, 1, b"s") + frame(DATA, END_STREAM, 1, b"t"))
    h2.expect_response(status=404)


def test_generic_3_1_3_data_with_padding(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", POST_PATH)))
    h2.send(frame(DATA, END_STREAM | PADDED, 1, b"\x06test" + b"\x00" * 6))
    h2.expect_response(status=404)


def test_generic_3_2_1_headers(h2: H2Wire) -> None:
    h2.request(1)
    h2.expect_response()


def test_generic_3_2_2_headers_with_padding(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS | PADDED, 1, b"\x08" + h2.block() + b"\x00" * 8))
    h2.expect_response()


def test_generic_3_2_3_headers_withpriority(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY_FLAG, 1, priority(0, 255) + h2.block()))
    h2.expect_response()


@pytest.mark.parametrize(
    "payload",
    [priority(0, 0), priority(0, 255), priority(3, 15), priority(3, 15, exclusive=True)],
    ids=["weight-1", "weight-256", "dependency", "exclusive"],
)
def test_generic_3_3priority(h2: H2Wire, payload: bytes) -> None:
    h2.send(frame(PRIORITY, 0, 1, payload))
    h2.request(1)
    h2.expect_response()


def test_generic_3_3_5_priority_for_idle_stream_then_headers_for_lower_id(h2: H2Wire) -> None:
    h2.send(frame(PRIORITY, 0, 3, priority(0)))
    h2.request(1)
    h2.expect_response()


def test_generic_3_4_rst_stream(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", POST_PATH)))
    h2.send(frame(RST_STREAM, 0, 1, CANCEL.to_bytes(4, "big")))
    h2.expect_alive()


def test_generic_3_5_settings(h2: H2Wire) -> None:
    h2.send(
        frame(
            SETTINGS,
            0,
            0,
            settings(
                (S_HEADER_TABLE_SIZE, 4096),
                (S_ENABLE_PUSH, 1),
                (S_MAX_CONCURRENT_STREAMS, 100),
                (S_INITIAL_WINDOW_SIZE, 65535),
                (S_MAX_FRAME_SIZE, 16384),
                (S_MAX_HEADER_LIST_SIZE, 100),
            ),
        )
    )
    h2.expect_settings_ack()


def test_generic_3_7_ping(h2: H2Wire) -> None:
    h2.expect_alive()


def test_generic_3_8_goaway(h2: H2Wire) -> None:
    h2.send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0) + b"h2spec"))
    h2.expect_alive()  # h2spec: still answers a PING


def test_generic_3_9_1_window_update_stream_0(h2: H2Wire) -> None:
    h2.send(frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")))
    h2.expect_alive()


def test_generic_3_9_2_window_update_stream_1(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", POST_PATH)))
    h2.send(frame(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
    h2.expect_alive()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_generic_4_get_and_head(h2: H2Wire, method: str) -> None:
    h2.request(1, method)
    status, headers, body = h2.response(1)
    assert status == 200
    assert body == (b"" if method == "HEAD" else b'{"live":true}')
    assert headers["content-length"] == "13"


def test_generic_4_3_post(h2: H2Wire) -> None:
    h2.request(1, "POST", POST_PATH, b"test")
    h2.expect_response(status=404)


def test_generic_4_4_post_with_trailers(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_HEADERS, 1, h2.block("POST", POST_PATH)) + frame(DATA, 0, 1, b"test"))
    h2.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, h2.encoder.encode([("x-trailer", "yes")])))
    h2.expect_response(status=404)


@pytest.mark.parametrize("huffman", [False, True], ids=["plain", "huffman"])
@pytest.mark.parametrize(
    ("first", "prefix"),
    [(0x40, 6), (0x00, 4), (0x10, 4)],
    ids=["incremental-indexing", "without-indexing", "never-indexed"],
)
@pytest.mark.parametrize("named", [True, False], ids=["indexed-name", "new-name"])
def test_generic_5_hpack_literals(h2: H2Wire, first: int, prefix: int, named: bool, huffman: bool) -> None:
    field = literal(first, prefix, 58 if named else 0, b"x-test", b"value", huffman)  # 58: user-agent
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, request_block(field)))
    h2.expect_response()


def test_generic_5_1_indexed_field(h2: H2Wire) -> None:
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, request_block(b"\x90")))  # static 16: accept-encoding
    h2.expect_response()


@pytest.mark.parametrize("updates", [b"\x3f\xe1\x1f", b"\x20\x3f\xe1\x1f"], ids=["one", "several"])
def test_generic_5_dynamic_table_size_updates(h2: H2Wire, updates: bytes) -> None:
    h2.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, updates + request_block(b"")))
    h2.expect_response()
