"""Hostile and unusual HTTP/1.1 on raw sockets: the server answers 400 (or closes cleanly) and stays up."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
from e2e_helpers import (
    RawConnection,
    RawResponse,
    ServerProcess,
    chunked,
    decode_bytes_elements,
    encode_bytes_elements,
    http_request,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

A = list(range(16))
B = [7 * i - 50 for i in range(16)]
SIMPLE_DOC = {
    "id": "raw",
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B},
    ],
}
SIMPLE_BODY = json.dumps(SIMPLE_DOC).encode()
INFER = "/v2/models/simple/infer"


def assert_simple_ok(response: RawResponse | None, request_id: str = "raw") -> None:
    assert response is not None, "server closed the connection instead of answering"
    assert response.status == 200, response
    doc = response.json()
    assert doc["id"] == request_id
    out = {o["name"]: o["data"] for o in doc["outputs"]}
    assert out == {"OUTPUT0": np.add(A, B).tolist(), "OUTPUT1": np.subtract(A, B).tolist()}


def assert_error(response: RawResponse | None, status: int, *fragments: str) -> str:
    assert response is not None, "server closed the connection instead of answering"
    assert response.status == status, response
    assert (response.header("content-type") or "").startswith("application/json"), response
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def assert_live_on(conn: RawConnection, port: int) -> None:
    """A follow-up request on the same socket is answered."""
    conn.send(http_request("GET", "/v2/health/live", port=port))
    response = conn.read_response()
    assert response is not None, "server closed the keep-alive connection after the previous response"
    assert (response.status, response.json()) == (200, {"live": True})


def assert_server_up(server: ServerProcess) -> None:
    """The process lives and answers on a new connection."""
    assert server.running(), f"server exited with {server.proc.poll()}"
    with RawConnection(server.address) as conn:
        conn.send(http_request("POST", INFER, SIMPLE_BODY, port=server.port))
        assert_simple_ok(conn.read_response())


@pytest.fixture
def conn(v2_server: ServerProcess):
    with RawConnection(v2_server.address) as c:
        yield c


# ---------------------------------------------------------------------- Inference-Header-Content-Length


@pytest.mark.parametrize(
    "value",
    ["abc", "-5", "1.5", "", "0x10", "99999999999999999999999", "past-the-body"],
)
def test_bad_inference_header_length(v2_server: ServerProcess, conn: RawConnection, value: str) -> None:
    if value == "past-the-body":
        value = str(len(SIMPLE_BODY) + 1)
    conn.send(
        http_request(
            "POST", INFER, SIMPLE_BODY, {"Inference-Header-Content-Length": value}, port=v2_server.port
        )
    )
    assert_error(conn.read_response(), 400, "Inference-Header-Content-Length")
    assert_live_on(conn, v2_server.port)


@pytest.mark.parametrize("value", ["0", "10"])
def test_inference_header_length_cutting_the_json(
    v2_server: ServerProcess, conn: RawConnection, value: str
) -> None:
    conn.send(
        http_request(
            "POST", INFER, SIMPLE_BODY, {"Inference-Header-Content-Length": value}, port=v2_server.port
        )
    )
    assert_error(conn.read_response(), 400, "simple")
    assert_live_on(conn, v2_server.port)


def test_inference_header_length_equal_to_body_is_plain_json(
    v2_server: ServerProcess, conn: RawConnection
) -> None:
    headers = {"Inference-Header-Content-Length": str(len(SIMPLE_BODY))}
    conn.send(http_request("POST", INFER, SIMPLE_BODY, headers, port=v2_server.port))
    assert_simple_ok(conn.read_response())


# ------------------------------------------------------------------------------ truncated and garbage bodies


@pytest.mark.parametrize("how", ["close", "shutdown-write"])
def test_truncated_body(v2_server: ServerProcess, how: str) -> None:
    with RawConnection(v2_server.address, timeout=5) as c:
        c.send(
            http_request("POST", INFER, SIMPLE_BODY[:100], {"Content-Length": "1000"}, port=v2_server.port)
        )
        if how == "shutdown-write":
            c.sock.shutdown(socket.SHUT_WR)
            # The server must notice the end and close (or answer 400), not wait forever.
            response = c.read_response()
            assert response is None or response.status == 400, response
    assert_server_up(v2_server)


def test_truncated_headers(v2_server: ServerProcess) -> None:
    with RawConnection(v2_server.address, timeout=5) as c:
        c.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        c.sock.shutdown(socket.SHUT_WR)
        response = c.read_response()
        assert response is None or 400 <= response.status < 500, response
    assert_server_up(v2_server)


GARBAGE_JSON = [
    b"{",
    b"}",
    b'{"inputs": [',
    b"[]",
    b"null",
    b"42",
    b'"inputs"',
    b"\x00\xff\xfe\xfd",
    b"\xef\xbb\xbf" + SIMPLE_BODY,  # UTF-8 BOM
    SIMPLE_BODY + b"garbage",
    SIMPLE_BODY[:-1] + b",}",
    b"[" * 5000 + b"]" * 5000,
    b'{"inputs": 5}',
    b'{"inputs": []}',
    b'{"inputs": [5]}',
    b'{"inputs": [{"datatype": "INT32", "shape": [1, 16], "data": []}]}',
    b'{"inputs": [{"name": "INPUT0"}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": "16", "data": [1]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, true], "data": [1]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": {"a": 1}}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [[1, 2], [3]]}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": null}]}',
    b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1e400]}]}',
    b'{"inputs": [{"name": 7, "datatype": "INT32", "shape": [1], "data": [1]}]}',
    json.dumps(SIMPLE_DOC | {"id": 5}).encode(),
    json.dumps(SIMPLE_DOC | {"parameters": [1]}).encode(),
    json.dumps(SIMPLE_DOC | {"parameters": {"binary_data_output": "yes"}}).encode(),
    json.dumps(SIMPLE_DOC | {"outputs": {"name": "OUTPUT0"}}).encode(),
    json.dumps(SIMPLE_DOC | {"outputs": [5]}).encode(),
    json.dumps(SIMPLE_DOC | {"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]}).encode(),
]


@pytest.mark.parametrize("body", GARBAGE_JSON, ids=[f"garbage{i}" for i in range(len(GARBAGE_JSON))])
def test_garbage_json(v2_server: ServerProcess, conn: RawConnection, body: bytes) -> None:
    conn.send(http_request("POST", INFER, body, port=v2_server.port))
    assert_error(conn.read_response(), 400, "simple")
    assert_live_on(conn, v2_server.port)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
SMALL_SHAPES = st.lists(st.integers(-2, 20), max_size=3)
INPUTS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT0", "INPUT1", "x", ""]),
        "datatype": st.sampled_from(["INT32", "FP32", "BYTES", "BOOL", "BF16", "int32", "INT"]),
        "shape": SMALL_SHAPES | JSON_VALUES,
    },
    optional={
        "data": JSON_VALUES | st.lists(st.integers(-(2**33), 2**33), max_size=40),
        "parameters": JSON_VALUES,
    },
)
DOCS = st.fixed_dictionaries(
    {"inputs": st.lists(INPUTS, max_size=3) | JSON_VALUES},
    optional={"id": JSON_VALUES, "outputs": JSON_VALUES, "parameters": JSON_VALUES},
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=DOCS, model=st.sampled_from(["simple", "simple_string", "simple_identity", "identity_fp32"]))
def test_fuzzed_requests_get_4xx_never_5xx(
    v2_server: ServerProcess, conn: RawConnection, doc: dict, model: str
) -> None:
    """Random request documents: answered 200 or 400 with an error, never 500, on one kept-alive socket."""
    conn.send(
        http_request("POST", f"/v2/models/{model}/infer", json.dumps(doc).encode(), port=v2_server.port)
    )
    response = conn.read_response()
    assert response is not None, f"server closed the connection on {doc!r}"
    assert response.status in (200, 400), (doc, response)
    if response.status == 400:
        assert isinstance(response.json()["error"], str)
    else:
        assert_answer_follows(model, doc, response.json())


def _flat(value) -> list:
    return [v for item in value for v in _flat(item)] if isinstance(value, list) else [value]


def assert_answer_follows(model: str, doc: dict, answer: dict) -> None:
    """A request that was served got the model's answer to what it sent, read from the request's JSON
    independently of the server's codec."""
    sent = {i["name"]: _flat(i["data"]) for i in doc["inputs"]}
    got = {o["name"]: o["data"] for o in answer["outputs"]}
    if model == "identity_fp32":
        assert got["OUTPUT0"] == pytest.approx(sent["INPUT0"], rel=1e-6)
    elif model == "simple_identity":
        assert got["OUTPUT0"] == sent["INPUT0"]
    elif model == "simple":
        a, b = sent["INPUT0"], sent["INPUT1"]
        assert got == {"OUTPUT0": [x + y for x, y in zip(a, b, strict=True)],
                       "OUTPUT1": [x - y for x, y in zip(a, b, strict=True)]}  # fmt: skip
    else:  # simple_string: decimal strings
        a, b = (list(map(int, sent[n])) for n in ("INPUT0", "INPUT1"))
        assert got == {"OUTPUT0": [str(x + y) for x, y in zip(a, b, strict=True)],
                       "OUTPUT1": [str(x - y) for x, y in zip(a, b, strict=True)]}  # fmt: skip


@pytest.mark.parametrize("count", [10**6, 10**15])
def test_huge_bytes_shape_with_tiny_binary_data(
    v2_server: ServerProcess, conn: RawConnection, count: int
) -> None:
    """A BYTES shape claiming more elements than its binary data can hold: 400, not a huge allocation."""
    raw = encode_bytes_elements([b"x"])
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, count],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    started = time.monotonic()
    conn.send(
        http_request("POST", "/v2/models/simple_identity/infer", header + raw, headers, port=v2_server.port)
    )
    assert_error(conn.read_response(), 400, "simple_identity", "INPUT0")
    assert time.monotonic() - started < 5
    assert_live_on(conn, v2_server.port)


# ------------------------------------------------------------------------------ framing that must work


def test_chunked_json_body(v2_server: ServerProcess, conn: RawConnection) -> None:
    pieces = [SIMPLE_BODY[i : i + 7] for i in range(0, len(SIMPLE_BODY), 7)]
    head = http_request("POST", INFER, headers={"Transfer-Encoding": "chunked"}, port=v2_server.port)
    conn.send(head + chunked(*pieces))
    assert_simple_ok(conn.read_response())
    assert_live_on(conn, v2_server.port)


def test_chunked_with_extensions_and_trailer(v2_server: ServerProcess, conn: RawConnection) -> None:
    half = len(SIMPLE_BODY) // 2
    body = (
        f"{half:x};name=value\r\n".encode()
        + SIMPLE_BODY[:half]
        + b"\r\n"
        + f"{len(SIMPLE_BODY) - half:X}\r\n".encode()  # upper-case hex is valid too
        + SIMPLE_BODY[half:]
        + b"\r\n0\r\nX-Trailer: done\r\n\r\n"
    )
    conn.send(
        http_request("POST", INFER, headers={"Transfer-Encoding": "chunked"}, port=v2_server.port) + body
    )
    assert_simple_ok(conn.read_response())
    assert_live_on(conn, v2_server.port)


def test_chunked_binary_extension_split_across_chunks(v2_server: ServerProcess, conn: RawConnection) -> None:
    values = np.arange(-300, 300, dtype="<f4") / 8
    raw = values.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [len(values)],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + raw
    # Chunk boundaries inside the JSON header, right at its end + 1, and in the middle of a float.
    cuts = [0, 5, len(header) // 2, len(header) + 1, len(header) + 4 * 100 + 2, len(body) - 3, len(body)]
    pieces = [body[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    headers = {"Transfer-Encoding": "chunked", "Inference-Header-Content-Length": str(len(header))}
    conn.send(http_request("POST", "/v2/models/identity_fp32/infer", headers=headers, port=v2_server.port))
    for piece in pieces:  # each chunk its own write
        conn.send(chunked(piece)[: -len(b"0\r\n\r\n")])
        time.sleep(0.005)
    conn.send(b"0\r\n\r\n")
    response = conn.read_response()
    assert response is not None and response.status == 200, response
    assert response.header("content-type") == "application/octet-stream"
    length = int(response.header("inference-header-content-length"))
    doc = json.loads(response.body[:length])
    (out,) = doc["outputs"]
    assert (out["name"], out["shape"], out["parameters"]["binary_data_size"]) == ("OUTPUT0", [600], len(raw))
    assert response.body[length:] == raw
    assert_live_on(conn, v2_server.port)


def test_chunked_bytes_binary_split_inside_length_prefix(
    v2_server: ServerProcess, conn: RawConnection
) -> None:
    elements = [b"\xff" * 3, b"", b"hello", bytes(range(40))]
    raw = encode_bytes_elements(elements)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, len(elements)],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    body = header + raw
    pieces = [body[: len(header) + 2], body[len(header) + 2 : len(header) + 9], body[len(header) + 9 :]]
    headers = {"Transfer-Encoding": "chunked", "Inference-Header-Content-Length": str(len(header))}
    conn.send(http_request("POST", "/v2/models/simple_identity/infer", headers=headers, port=v2_server.port))
    conn.send(chunked(*pieces))
    response = conn.read_response()
    assert response is not None and response.status == 200, response
    length = int(response.header("inference-header-content-length"))
    assert decode_bytes_elements(response.body[length:]) == elements


def test_request_in_many_tiny_writes(v2_server: ServerProcess, conn: RawConnection) -> None:
    request = http_request(
        "POST", INFER, SIMPLE_BODY, {"Content-Type": "application/json"}, port=v2_server.port
    )
    sizes = [1, 2, 3]
    offset, i = 0, 0
    while offset < len(request):
        step = sizes[i % 3]
        conn.send(request[offset : offset + step])
        offset, i = offset + step, i + 1
        if i % 8 == 0:
            time.sleep(0.001)  # let the pieces reach the server as separate segments
    assert_simple_ok(conn.read_response())
    assert_live_on(conn, v2_server.port)


def test_pipelined_requests(v2_server: ServerProcess, conn: RawConnection) -> None:
    port = v2_server.port
    first = json.dumps(SIMPLE_DOC | {"id": "first"}).encode()
    second = json.dumps(SIMPLE_DOC | {"id": "second"}).encode()
    conn.send(
        http_request("POST", INFER, first, port=port)
        + http_request("GET", "/v2/health/ready", port=port)
        + http_request("POST", INFER, b"{broken", port=port)
        + http_request("POST", INFER, second, port=port)
        + http_request("GET", "/v2/models/simple/ready", port=port)
    )
    assert_simple_ok(conn.read_response(), "first")
    ready = conn.read_response()
    assert ready is not None and (ready.status, ready.json()) == (200, {"ready": True})
    assert_error(conn.read_response(), 400, "simple")
    assert_simple_ok(conn.read_response(), "second")
    model_ready = conn.read_response()
    assert model_ready is not None and model_ready.json() == {"name": "simple", "ready": True}


def test_http10_request(v2_server: ServerProcess, conn: RawConnection) -> None:
    conn.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    response = conn.read_response()
    assert response is not None and response.status == 200, response
    assert response.json() == {"live": True}


# ------------------------------------------------------------------------------ garbage at the HTTP layer

POST = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
GARBAGE_REQUESTS = {
    "word": b"GARBAGE\r\n\r\n",
    "binary": bytes(range(256)) + b"\r\n\r\n",
    "nul-bytes": b"\x00" * 64 + b"\r\n\r\n",
    "tls-client-hello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 32 + b"\r\n\r\n",
    "bad-version": b"GET /v2 HTTX/1.1\r\nHost: x\r\n\r\n",
    "no-path": b"GET\r\n\r\n",
    "bad-header-line": b"GET /v2 HTTP/1.1\r\nHost: x\r\nthis is not a header\r\n\r\n",
    "space-before-colon": b"GET /v2 HTTP/1.1\r\nHost : x\r\n\r\n",
    "bad-content-length": POST + b"Content-Length: abc\r\n\r\n{}",
    "two-content-lengths": POST + b"Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}",
    "bad-chunk-size": (POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    "huge-header": b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n",
    "lf-only-garbage": b"\n\n\n\n\x7f\x7f\n\n",
}


def test_content_length_with_chunked_closes_connection(v2_server: ServerProcess) -> None:
    body = b"2\r\n{}\r\n0\r\n\r\n"
    request = POST + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    with RawConnection(v2_server.address, timeout=1) as c:
        c.send(request)
        response = c.read_response()
        assert response is not None, "closed without an answer"
        assert response.status == 400, response  # the framing is ambiguous (RFC 9112 6.1): refused
        try:
            closed = c.closed_by_peer()
        except TimeoutError:
            closed = False
        assert closed, f"connection still open 1 s after answering {response.status}"
    assert_server_up(v2_server)


@pytest.mark.parametrize("raw", list(GARBAGE_REQUESTS.values()), ids=list(GARBAGE_REQUESTS))
def test_garbage_at_http_layer(v2_server: ServerProcess, raw: bytes) -> None:
    with RawConnection(v2_server.address, timeout=5) as c:
        try:
            c.send(raw)
            response = c.read_response()
        except (ConnectionResetError, BrokenPipeError):
            response = None  # closed on us mid-send: the server refused it, fine
        except TimeoutError:
            pytest.fail("the server neither answered nor closed the connection within 5 s")
        if response is not None:
            assert 400 <= response.status < 600 and response.status != 500, response
            # Having refused the request, the server is done with this connection.
            assert c.closed_by_peer(), "connection left open after an unparseable request"
    assert_server_up(v2_server)
