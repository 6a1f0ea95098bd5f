"""OpenTelemetry export of traces (`--trace-config mode=opentelemetry`) against a local OTLP/HTTP receiver
the test runs: Triton's spans (InferRequest, the model's, compute, an ensemble's steps under it), their
attributes and events, the client's W3C traceparent as their parent, over REST and gRPC; with rate 0 only
the requests that carry one are traced. Needs the `otel` extra (`make test` installs it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import need_module
from grpc_helpers import call, tensor
from trace_helpers import write_trace_repository

import tensorgate.proto.inference as pb

trace_service = need_module(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    "the otel extra: pip install -e '.[otel]' (make test installs it)",
)

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
GRPC_TRACE = "0af7651916cd43dd8448eb211c80319c"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list = []
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        request = trace_service.ExportTraceServiceRequest.FromString(body)
        self.server.paths.append(self.path)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.server.spans += scope.spans
        answer = trace_service.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def start(start_server, repo: Path, receiver: Receiver, rate: int, workers: int | None = None):
    write_trace_repository(repo)
    args = ["--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS"]
    args += ["--workers", str(workers)] if workers else []
    args += ["--trace-config", f"rate={rate}", "--trace-config", f"opentelemetry,url={receiver.url}"]
    args += ["--trace-config", "opentelemetry,resource=deployment=test"]
    return start_server(repo, extra_args=tuple(args))


def attributes(span) -> dict:
    found = {}
    for attribute in span.attributes:
        value = attribute.value
        found[attribute.key] = value.string_value if value.HasField("string_value") else value.int_value
    return found


def test_spans_follow_tritons_layout_under_the_clients_trace(
    start_server, repo: Path, receiver: Receiver
) -> None:
    # rate 0: only requests with a traceparent. One process: with --workers, the engine samples what the
    # workers send it and the clients' W3C context does not cross (docs/operations/workers.md).
    server = start(start_server, repo, receiver, rate=0, workers=1)
    with httpx.Client(base_url=server.base_url) as client:
        setting = client.get("/v2/trace/setting").json()
        assert setting["trace_mode"] == "opentelemetry" and setting["url"] == receiver.url
        assert "trace_file" not in setting and "log_frequency" not in setting
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}], "id": "r1"}
        assert client.post("/v2/models/pipe/infer", json=body).status_code == 200  # not traced
        headers = {"traceparent": TRACEPARENT}
        response = client.post("/v2/models/pipe/infer", json=body, headers=headers)
        assert response.json()["outputs"][0]["data"] == [3, 5]
    request = pb.ModelInferRequest(
        model_name="double",
        inputs=[tensor("INPUT0", "INT32", [1])],
        raw_input_contents=[np.int32(4).tobytes()],
    )
    metadata = {"traceparent": f"00-{GRPC_TRACE}-{CLIENT_SPAN}-01"}
    call(server, lambda stub: stub.model_infer(request, metadata=metadata))
    server.stop()  # the batch span processor sends what it holds at shutdown

    assert set(receiver.paths) == {"/v1/traces"}
    by_trace: dict[str, list] = {}
    for span in receiver.spans:
        by_trace.setdefault(span.trace_id.hex(), []).append(span)
    assert set(by_trace) == {CLIENT_TRACE, GRPC_TRACE}  # the request without a traceparent was not traced

    spans = {span.span_id: span for span in by_trace[CLIENT_TRACE]}
    named = {}
    for span in spans.values():
        named.setdefault(span.name, []).append(span)
    assert sorted(named) == ["InferRequest", "compute", "double", "inc", "pipe"]
    (top,) = named["InferRequest"]
    assert top.parent_span_id.hex() == CLIENT_SPAN  # the client's span is its parent
    (pipe,) = named["pipe"]
    assert pipe.parent_span_id == top.span_id
    # the front end's timestamps are the top span's events (Triton's root span), around the model's span
    assert [event.name for event in top.events] == [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "INFER_RESPONSE_COMPLETE",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]
    assert top.start_time_unix_nano <= pipe.start_time_unix_nano <= pipe.end_time_unix_nano
    assert pipe.end_time_unix_nano <= top.end_time_unix_nano
    assert attributes(pipe) == {
        "triton.model_name": "pipe",
        "triton.model_version": 1,
        "triton.trace_id": attributes(pipe)["triton.trace_id"],
        "triton.trace_parent_id": 0,
        "triton.request_id": "r1",
    }
    assert [event.name for event in pipe.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    for step in ("double", "inc"):
        (span,) = named[step]
        assert span.parent_span_id == pipe.span_id  # a step is a child of the ensemble's span
        assert attributes(span)["triton.trace_parent_id"] == attributes(pipe)["triton.trace_id"]
        assert pipe.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
    assert len(named["compute"]) == 3  # the ensemble's and each step's
    for compute in named["compute"]:
        parent = spans[compute.parent_span_id]
        assert parent.name in ("pipe", "double", "inc")
        assert [e.name for e in compute.events] == [
            "COMPUTE_START",
            "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START",
            "COMPUTE_END",
        ]
        assert parent.start_time_unix_nano <= compute.start_time_unix_nano <= compute.end_time_unix_nano
    assert sorted(span.name for span in by_trace[GRPC_TRACE]) == ["InferRequest", "compute", "double"]
    (grpc_top,) = [span for span in by_trace[GRPC_TRACE] if span.name == "InferRequest"]
    assert [event.name for event in grpc_top.events] == [
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "INFER_RESPONSE_COMPLETE",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
    ]


def test_rate_samples_requests_without_a_traceparent(start_server, repo: Path, receiver: Receiver) -> None:
    server = start(start_server, repo, receiver, rate=2)
    with httpx.Client(base_url=server.base_url) as client:
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
        for _ in range(4):
            assert client.post("/v2/models/double/infer", json=body).status_code == 200
    server.stop()
    tops = [span for span in receiver.spans if span.name == "InferRequest"]
    assert len(tops) == 2 and all(not span.parent_span_id for span in tops)  # every second; no parent
