"""Serving leaves nothing for Python's cycle collector: each request's objects (and each connection's) are
freed when they are done with, not found later by a collection whose pause lands in the latency's tail.
Read from the metrics port's standard `python_gc_objects_collected_total`, around thousands of requests
over gRPC, HTTP/2, and HTTP/1.1 connections of one request each, and around gRPC streams the client
cancels."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import grpc
import httpx
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, simple_inputs
from grpc_helpers import SERVICE, simple_request
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.ours

CALLS = 3000  # past the collector's threshold many times over, were each to leave a cycle behind
INFER = json.dumps({"inputs": simple_inputs(list(range(16)), [1] * 16, [1, 16])}).encode()


def collected(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=15).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(sample.value for sample in families["python_gc_objects_collected"].samples)


def grpc_calls(server: ServerProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer")
        message = bytes(simple_request())
        for _ in range(CALLS):
            assert infer(message, timeout=10)


def grpc_streams_cancelled(server: ServerProcess) -> None:
    """A third as many ModelStreamInfer calls, each cancelled by the client after its first answer."""
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        message = bytes(simple_request())
        for _ in range(CALLS // 3):
            done = threading.Event()

            def requests(done: threading.Event = done) -> Iterator[bytes]:
                yield message
                done.wait(10)  # the request stream stays open until the call is cancelled

            call = stream(requests(), timeout=10)
            assert next(call)
            call.cancel()
            done.set()


def http2_requests(server: ServerProcess) -> None:
    with httpx.Client(http1=False, http2=True, base_url=server.base_url, timeout=10) as client:
        for _ in range(CALLS):
            assert client.post("/v2/models/simple/infer", content=INFER).status_code == 200


def http1_connections(server: ServerProcess) -> None:
    head = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(INFER)
    )
    for _ in range(CALLS):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + INFER)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


SERVES = [grpc_calls, grpc_streams_cancelled, http2_requests, http1_connections]


@pytest.mark.parametrize("serve", SERVES, ids=lambda f: f.__name__)
def test_requests_leave_nothing_for_the_cycle_collector(start_server, serve) -> None:
    # the cancelled streams reset faster than a client is let by default (a rapid-reset defence)
    server = start_server(
        EXAMPLES, extra_args=("--http2-max-resets-per-second", "100000"), log_level="warning"
    )
    serve(server)  # the first requests build what stays: caches, a connection's buffers
    before = collected(server.metrics_port)
    serve(server)
    found = collected(server.metrics_port) - before
    # Before each stream's handler, each HTTP/1.1 parser and each cancelled call's task let go of what
    # held them, 5 to 30 objects a request, connection or cancelled stream were only ever freed by the
    # collector: 17,000-38,000 here. One-time garbage (a module a library imports on first use) may
    # still be collected meanwhile.
    assert found < CALLS / 4, f"the cycle collector freed {found:.0f} objects over {CALLS} requests"
