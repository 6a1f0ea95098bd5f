"""KServe v2 REST errors end to end: statuses, {"error"} bodies, and connections that stay usable."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from e2e_helpers import (
    EXAMPLES,
    A,
    B,
    RawConnection,
    RawH2,
    RawResponse,
    ServerProcess,
    assert_connection_reused,
    assert_error,
    binary_body,
    chunked,
    http_request,
    int32_config,
    make_client,
    simple_inputs,
    stop_all,
    write_model,
)

import tensorgate.proto.inference as pb

# ------------------------------------------------------------------------------------------ errors


def _binary_case(header: dict, raw: bytes) -> dict:
    body, headers = binary_body(header, raw)
    return {"content": body, "headers": headers}


def _fp32_binary(shape: list[int], raw: bytes, size: int | None = None) -> dict:
    size = len(raw) if size is None else size
    inputs = [
        {"name": "INPUT0", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": size}}
    ]
    return _binary_case({"inputs": inputs}, raw)


def _simple(inputs: list[dict]) -> dict:
    return {"json": {"inputs": inputs}}


GOOD1 = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B}
# (id, path, request kwargs, status, fragments the error must name)
INFER_ERRORS = [
    ("malformed-json", "simple", {"content": b'{"inputs": [ {"name": '}, 400, ["simple"]),
    ("not-an-object", "simple", {"content": b"[1, 2, 3]"}, 400, ["simple"]),
    ("empty-body", "simple", {"content": b""}, 400, ["simple"]),
    (
        "wrong-shape",
        "simple",
        _simple([{"name": "INPUT0", "datatype": "INT32", "shape": [1, 15], "data": A[:15]}, GOOD1]),
        400,
        ["simple", "INPUT0"],
    ),
    (
        "wrong-rank",
        "simple",
        _simple([{"name": "INPUT0", "datatype": "INT32", "shape": [16], "data": A}, GOOD1]),
        400,
        ["simple", "INPUT0"],
    ),
    (
        "element-count-vs-shape",
        "simple",
        _simple([{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A[:15]}, GOOD1]),
        400,
        ["simple", "INPUT0"],
    ),
    (
        "negative-shape",
        "simple",
        _simple([{"name": "INPUT0", "datatype": "INT32", "shape": [1, -16], "data": A}, GOOD1]),
        400,
        ["simple", "INPUT0"],
    ),
    ("binary-size-vs-shape", "identity_fp32", _fp32_binary([4], bytes(12)), 400, ["identity_fp32", "INPUT0"]),
    (
        "binary-size-past-body",
        "identity_fp32",
        _fp32_binary([4], bytes(8), size=16),
        400,
        ["identity_fp32", "INPUT0"],
    ),
    ("binary-trailing-bytes", "identity_fp32", _fp32_binary([2], bytes(12), size=8), 400, ["identity_fp32"]),
    (
        "unknown-input",
        "simple",
        _simple(
            simple_inputs(A, B, [1, 16])
            + [{"name": "INPUT9", "datatype": "INT32", "shape": [1], "data": [1]}]
        ),
        400,
        ["simple", "INPUT9"],
    ),
    ("missing-input", "simple", _simple(simple_inputs(A, B, [1, 16])[:1]), 400, ["simple", "INPUT1"]),
    (
        "wrong-datatype",
        "simple",
        _simple([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": A}, GOOD1]),
        400,
        ["simple", "INPUT0", "FP32"],
    ),
    (
        "unknown-datatype",
        "simple",
        _simple([{"name": "INPUT0", "datatype": "INT33", "shape": [1, 16], "data": A}, GOOD1]),
        400,
        ["simple", "INPUT0"],
    ),
    (
        "header-length-past-body",
        "simple",
        {
            "content": json.dumps(_simple(simple_inputs(A, B, [1, 16]))["json"]).encode(),
            "headers": {"Inference-Header-Content-Length": "100000"},
        },
        400,
        ["Inference-Header-Content-Length"],
    ),
    (
        "header-length-not-integer",
        "simple",
        {"content": b"{}", "headers": {"Inference-Header-Content-Length": "two"}},
        400,
        ["Inference-Header-Content-Length"],
    ),
    (
        "non-utf8-bytes-in-json",
        "simple_identity",
        {"content": b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1,1],"data":["\xff\xfe"]}]}'},
        400,
        ["simple_identity"],
    ),
    (
        "lone-surrogate-in-json",
        "simple_identity",
        {"content": b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1,1],"data":["\\udcff"]}]}'},
        400,
        ["simple_identity"],
    ),
    (
        "batch-over-max-batch-size",
        "simple",
        _simple(simple_inputs(A * 9, B * 9, [9, 16])),
        400,
        ["inference request batch-size must be <= 8 for 'simple'"],
    ),
    (
        "unknown-output",
        "simple",
        {"json": {"inputs": simple_inputs(A, B, [1, 16]), "outputs": [{"name": "OUTPUT7"}]}},
        400,
        ["simple", "OUTPUT7"],
    ),
    ("unknown-model", "no_such_model", _simple(simple_inputs(A, B, [1, 16])), 404, ["no_such_model"]),
    ("unknown-version", "simple/versions/2", _simple(simple_inputs(A, B, [1, 16])), 404, ["simple", "2"]),
    (
        "non-numeric-version",
        "simple/versions/latest",
        _simple(simple_inputs(A, B, [1, 16])),
        400,
        ["failed to get model version from specified version string 'latest'"],
    ),
]


@pytest.mark.parametrize(
    ("model", "kwargs", "status", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in INFER_ERRORS],
)
def test_infer_error(
    client: httpx.Client, model: str, kwargs: dict, status: int, fragments: list[str]
) -> None:
    response = client.post(f"/v2/models/{model}/infer", **kwargs)
    assert_error(response, status, *fragments)
    assert_connection_reused(client, response)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/no_such_model",
        "/v2/models/no_such_model/ready",
        "/v2/models/no_such_model/config",
        "/v2/models/simple/versions/2",
        "/v2/models/simple/versions/2/ready",
        "/v2/models/simple/versions/2/config",
    ],
)
def test_unknown_model_or_version_is_404(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    fragment = "no_such_model" if "no_such_model" in path else "simple"
    assert_error(response, 404, fragment)
    assert_connection_reused(client, response)


WRONG_METHODS = [
    ("GET", "/v2/models/simple/infer", "POST"),
    ("DELETE", "/v2/models/simple/versions/1/infer", "POST"),
    ("DELETE", "/v2", "GET"),
    ("PUT", "/v2/models/simple/versions/1/infer", "POST"),
    ("POST", "/v2/health/live", "GET"),
    ("POST", "/v2/models/simple/config", "GET"),
]


@pytest.mark.parametrize(("method", "path", "allowed"), WRONG_METHODS)
def test_wrong_method_is_405_with_allow(
    v2_server: ServerProcess, http_version: str, method: str, path: str, allowed: str
) -> None:
    with make_client(v2_server.base_url, http_version) as client:
        response = client.request(method, path)
        assert_error(response, 405, allowed)
        expected = [allowed, "HEAD"] if allowed == "GET" else [allowed]  # GET routes answer HEAD too
        assert [m.strip() for m in response.headers["allow"].split(",")] == expected
        assert_connection_reused(client, response)


@pytest.mark.parametrize(  # ("/" is the monitor page)
    "path", ["/v3", "/v2/models", "/v2/models/simple/infer/extra", "/v2/health", "/index.html"]
)
def test_unknown_path_is_404(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    assert_error(response, 404)
    assert_connection_reused(client, response)


# ------------------------------------------------------------------------------------------ 503 and 413

LIMIT = 4096


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """identity_fp32 plus a model whose code fails to import, with --max-request-bytes 4096."""
    base = tmp_path_factory.mktemp("limited")
    repository = base / "models"
    shutil.copytree(EXAMPLES / "identity_fp32", repository / "identity_fp32")
    write_model(
        repository,
        "broken",
        Path(EXAMPLES / "simple" / "config.pbtxt").read_text().replace('"simple"', '"broken"'),
        {1: "raise RuntimeError('deliberately broken at import')\n"},
    )
    server = ServerProcess(repository, base / "server.log", extra_args=("--max-request-bytes", str(LIMIT)))
    server.start()
    yield server
    stop_all([server])


@pytest.fixture
def limited_client(limited_server, http_version: str) -> Iterator[httpx.Client]:
    with make_client(limited_server.base_url, http_version) as c:
        yield c


@pytest.fixture(scope="module")
def sacrificial_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A limited server for tests of known connection bugs; its exit code is not checked (a bug left it
    unable to shut down cleanly is tested by test_http2_streamed_413_then_sigterm_exits_promptly)."""
    base = tmp_path_factory.mktemp("sacrificial")
    shutil.copytree(EXAMPLES / "identity_fp32", base / "models" / "identity_fp32")
    server = ServerProcess(
        base / "models", base / "server.log", extra_args=("--max-request-bytes", str(LIMIT))
    )
    server.start()
    yield server
    with contextlib.suppress(AssertionError):
        server.stop(timeout=2)


# (method, path, declared Content-Length or None, bytes sent before the response, status, error fragment)
EARLY_ERRORS = {
    "405-wrong-method": ("PUT", "/v2/models/identity_fp32/infer", 2000, 1000, 405, "POST"),
    "404-unknown-path": ("POST", "/v2/nowhere", 2000, 1000, 404, "/v2/nowhere"),
    "413-declared-length": ("POST", "/v2/models/identity_fp32/infer", 4 * LIMIT, LIMIT, 413, str(LIMIT)),
    "413-streamed": ("POST", "/v2/models/identity_fp32/infer", None, LIMIT + 500, 413, str(LIMIT)),
}


def _early_error_http1(server: ServerProcess, case: tuple) -> tuple[int, dict, object]:
    method, path, declared, first, _, _ = case
    headers = {"Content-Length": str(declared)} if declared else {"Transfer-Encoding": "chunked"}
    total = declared or 3 * LIMIT
    head = http_request(method, path, headers=headers, port=server.port)
    rest = b" " * (total - first)
    rest = rest if declared else chunked(rest)
    with RawConnection(server.address, timeout=1) as conn:
        conn.send(head + (b" " * first if declared else f"{first:x}\r\n".encode() + b" " * first + b"\r\n"))
        response = conn.read_response()  # early: before the rest of the body is sent
        assert response is not None, "connection closed without a response"
        if (response.header("connection") or "").lower() == "close":
            return response.status, response.json(), "closed (announced with Connection: close)"
        try:  # not announced as closing: the connection must stay usable once the request is complete
            conn.send(rest)
            conn.send(http_request("GET", "/v2/health/live", port=server.port))
            follow = conn.read_response()
        except OSError as e:
            follow = e
        return response.status, response.json(), follow


def _early_error_http2(server: ServerProcess, case: tuple) -> tuple[int, dict, object]:
    import h2.exceptions

    method, path, declared, first, _, _ = case
    total = declared or 3 * LIMIT
    with RawH2(server.address, timeout=1) as h2c:
        h2c.start(1, method, path, [("content-length", str(declared))] if declared else [])
        h2c.data(1, b" " * first)
        status, body = h2c.response(1)  # early: before the rest of the body is sent
        assert status is not None, "connection ended before the response"
        # The rest of the body: legal while the server has not reset the stream (RFC 9113 8.1).
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            h2c.data(1, b" " * (total - first), end=True)
        h2c.start(3, "GET", "/v2/health/live", end=True)
        follow = h2c.response(3)
        return status, json.loads(body), follow if not h2c.closed else ("connection closed", follow)


@pytest.mark.ours  # hypercorn reads the whole body before the app may answer
@pytest.mark.parametrize("case", sorted(EARLY_ERRORS))
def test_early_error_before_body_keeps_connection(
    sacrificial_server: ServerProcess, http_version: str, case: str
) -> None:
    spec = EARLY_ERRORS[case]
    run = _early_error_http1 if http_version == "http1" else _early_error_http2
    status, doc, follow = run(sacrificial_server, spec)
    assert status == spec[4]
    assert spec[5] in doc["error"]
    if isinstance(follow, str):  # HTTP/1.1 close announced: the client knows not to reuse it
        return
    if isinstance(follow, RawResponse):
        follow = (follow.status, follow.body)
    assert follow == (200, b'{"live":true}'), f"the connection broke after the {status}: {follow!r}"


def test_http2_streamed_413_then_sigterm_exits_promptly(start_server, repo: Path) -> None:
    shutil.copytree(EXAMPLES / "identity_fp32", repo / "identity_fp32")
    server = start_server(repo, extra_args=("--max-request-bytes", str(LIMIT)))
    body = _padded_request(3 * LIMIT)
    with make_client(server.base_url, "http2") as c:
        response = c.post(
            "/v2/models/identity_fp32/infer",
            content=iter([body[i : i + 1000] for i in range(0, len(body), 1000)]),
        )
        assert_error(response, 413, str(LIMIT))
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=3) == 0


def test_model_not_ready_is_503_with_reason(limited_client: httpx.Client) -> None:
    response = limited_client.post("/v2/models/broken/infer", json={"inputs": simple_inputs(A, B, [1, 16])})
    assert_error(response, 503, "broken", "deliberately broken at import")
    assert_connection_reused(limited_client, response)
    response = limited_client.post(
        "/v2/models/broken/versions/1/infer", json={"inputs": simple_inputs(A, B, [1, 16])}
    )
    assert_error(response, 503, "broken", "deliberately broken at import")
    assert_connection_reused(limited_client, response)

    ready = limited_client.get("/v2/health/ready")
    assert (ready.status_code, ready.json()) == (400, {"ready": False})
    model_ready = limited_client.get("/v2/models/broken/ready")
    assert (model_ready.status_code, model_ready.json()) == (400, {"name": "broken", "ready": False})
    # The good model next to it serves.
    ok = limited_client.post(
        "/v2/models/identity_fp32/infer",
        json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]},
    )
    assert ok.status_code == 200, ok.text


def _padded_request(total: int) -> bytes:
    doc = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.0]}]}
    )
    body = doc.encode()
    assert len(body) <= total
    return body + b" " * (total - len(body))  # trailing whitespace: still the same JSON document


def _assert_limited_server_serves(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as fresh:
        response = fresh.post("/v2/models/identity_fp32/infer", content=_padded_request(100))
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_body_at_limit_is_served(limited_client: httpx.Client) -> None:
    response = limited_client.post("/v2/models/identity_fp32/infer", content=_padded_request(LIMIT))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    assert_connection_reused(limited_client, response)


# A declared length over the limit is answered 413 at once, before the body is read. Over HTTP/1.1 the
# connection then closes (the body may still be coming; where it ends is the client's business); over
# HTTP/2 only the stream is reset, and the connection stays usable.
@pytest.mark.parametrize("size", [LIMIT + 1, 4 * LIMIT])
def test_body_over_limit_is_413(limited_server: ServerProcess, http_version: str, size: int) -> None:
    with make_client(limited_server.base_url, http_version) as c:
        response = c.post("/v2/models/identity_fp32/infer", content=_padded_request(size))
        assert_error(response, 413, str(LIMIT), "--max-request-bytes")
        if http_version == "http1":
            assert response.headers["connection"] == "close"
        else:
            assert_connection_reused(c, response)
    _assert_limited_server_serves(limited_server)


def test_chunked_body_over_limit_is_413(limited_server: ServerProcess) -> None:
    """Without a Content-Length (chunked transfer encoding) the limit still holds."""
    body = _padded_request(3 * LIMIT)
    with make_client(limited_server.base_url, "http1") as c:
        response = c.post(
            "/v2/models/identity_fp32/infer", content=iter([body[:3000], body[3000:6000], body[6000:]])
        )
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_error(response, 413, str(LIMIT))
    _assert_limited_server_serves(limited_server)


SILENT_FAILURE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("")) for _ in requests]
"""


def test_a_model_error_without_a_message_is_still_an_error_message(start_server, repo: Path) -> None:
    """Triton's C++ clients take an error with an empty message for a success (Error::IsOk): a model's
    TritonError("") is answered with a message on REST and gRPC."""
    write_model(repo, "silent", int32_config("silent"), {1: SILENT_FAILURE})
    server = start_server(repo)
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    response = httpx.post(f"{server.base_url}/v2/models/silent/infer", json=doc, timeout=10)
    assert response.status_code == 500
    assert response.json()["error"] == "internal error (no message given)"
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        request = pb.ModelInferRequest(
            model_name="silent",
            inputs=[pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="INT32", shape=[1])],
            raw_input_contents=[b"\x01\x00\x00\x00"],
        )
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as failed:
            call(bytes(request), timeout=10)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == "internal error (no message given)"


# ------------------------------------------------------------------------------ compressed requests


def _compressed(body: bytes, coding: str) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, {"gzip": 31, "deflate": 15}[coding])
    return packer.compress(body) + packer.flush()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_request_is_inflated(limited_client: httpx.Client, coding: str) -> None:
    """As Triton's clients compress a request (Content-Encoding, with Inference-Header-Content-Length the
    uncompressed JSON's length); the limit holds for what it inflates to."""
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}}
            ]
        }
    ).encode()
    body = header + struct.pack("<3f", 1, 2, 3)
    headers = {"content-encoding": coding, "inference-header-content-length": str(len(header))}
    response = limited_client.post(
        "/v2/models/identity_fp32/infer", content=_compressed(body, coding), headers=headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]

    bomb = _compressed(_padded_request(LIMIT + 1), coding)
    assert len(bomb) < LIMIT
    response = limited_client.post(
        "/v2/models/identity_fp32/infer", content=bomb, headers={"content-encoding": coding}
    )
    assert_error(response, 413, str(LIMIT), "--max-request-bytes")


@pytest.mark.parametrize(
    ("coding", "content", "fragment"),
    [("br", b"x", "Unsupported compression type"), ("gzip", b"not gzip", "does not inflate as gzip")],
)
def test_a_body_that_does_not_inflate_is_400(
    limited_client: httpx.Client, coding: str, content: bytes, fragment: str
) -> None:
    response = limited_client.post(
        "/v2/models/identity_fp32/infer", content=content, headers={"content-encoding": coding}
    )
    assert_error(response, 400, fragment)
    assert_connection_reused(limited_client, response)
