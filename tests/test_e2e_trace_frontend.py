"""Triton's front-end timestamps in our trace files, against a real server: REST infer over HTTP/1.1 and
HTTP/2 (httpx) and on hypercorn, generate and generate_stream, gRPC ModelInfer and ModelStreamInfer
(grpcio), with and without --workers: each traced request's trace carries Triton's names in Triton's
order; and a summary computed the way Triton's qa/common/trace_summary.py computes it finds each front
end's requests with positive figures."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from e2e_helpers import ServerProcess, make_client, write_model
from grpc_helpers import tensor
from trace_helpers import COMPUTE, infer, int32_model, traces, write_trace_repository

import tensorgate.proto.inference as pb

CORE = ["REQUEST_START", "QUEUE_START", *COMPUTE, "REQUEST_END"]
# Each name no earlier than the one before it, as Triton's front ends capture them.
HTTP_ORDER = [
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    *CORE,
    "INFER_RESPONSE_COMPLETE",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
]
GRPC_ORDER = [
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    *CORE,
    "INFER_RESPONSE_COMPLETE",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
]


def start_traced(start_server, repo: Path, tmp_path: Path, *args: str) -> ServerProcess:
    """Every request traced (rate 1, TIMESTAMPS); the traces kept until shutdown, then written to
    trace.json (so a test reads them once the server has stopped, never half written)."""
    write_trace_repository(repo)
    config = (
        "--trace-config",
        f"triton,file={tmp_path / 'trace.json'}",
        "--trace-config",
        "level=TIMESTAMPS",
    )
    return start_server(repo, extra_args=(*config, "--trace-config", "rate=1", *args))


def written(server: ServerProcess, tmp_path: Path) -> Path:
    """The trace file, once the server has stopped and written it."""
    assert server.stop() == 0
    return tmp_path / "trace.json"


def grpcio_infer(server: ServerProcess, values: list[int]) -> list[int]:
    request = pb.ModelInferRequest(
        model_name="double",
        inputs=[tensor("INPUT0", "INT32", [len(values)])],
        raw_input_contents=[np.array(values, "<i4").tobytes()],
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        method = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelInferResponse.parse,
        )
        answer = method(request, timeout=30)
    return np.frombuffer(answer.raw_output_contents[0], "<i4").tolist()


def assert_front_end(trace: dict, order: list[str]) -> None:
    """The trace has exactly these timestamps (Triton's names), each no earlier than the one before."""
    stamps = trace["timestamps"]
    assert sorted(stamps) == sorted(order), list(stamps)
    times = [stamps[name] for name in order]
    assert times == sorted(times), {name: stamps[name] for name in order}


@pytest.mark.parametrize("http_version", ["http1", "http2"])
def test_rest_requests_carry_tritons_http_timestamps(
    start_server, repo: Path, tmp_path: Path, http_version: str
) -> None:
    server = start_traced(start_server, repo, tmp_path)
    with make_client(server.base_url, http_version) as client:
        assert infer(client, "double", [1, 2], id="small") == [2, 4]
        assert infer(client, "double", list(range(50_000)), id="large")[-1] == 99_998  # a body in pieces
    found = {t["request_id"]: t for t in traces(written(server, tmp_path)).values()}
    assert set(found) == {"small", "large"}
    for trace in found.values():
        assert trace["model_name"] == "double"
        assert_front_end(trace, HTTP_ORDER)
        # received before the model saw it, sent after it answered: the front end's first and last
        assert list(trace["timestamps"])[:2] == ["HTTP_RECV_START", "HTTP_RECV_END"]
        assert list(trace["timestamps"])[-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]


def test_hypercorn_requests_carry_them_too(start_server, repo: Path, tmp_path: Path) -> None:
    server = start_traced(start_server, repo, tmp_path, "--http-server", "hypercorn")
    with httpx.Client(base_url=server.base_url) as client:
        assert infer(client, "double", [3]) == [6]
    (trace,) = traces(written(server, tmp_path)).values()
    assert_front_end(trace, HTTP_ORDER)


def test_grpc_model_infer_carries_tritons_grpc_timestamps(start_server, repo: Path, tmp_path: Path) -> None:
    server = start_traced(start_server, repo, tmp_path)
    assert grpcio_infer(server, [5, 6]) == [10, 12]
    (trace,) = traces(written(server, tmp_path)).values()
    assert trace["model_name"] == "double"
    assert_front_end(trace, GRPC_ORDER)


def test_an_ensembles_steps_carry_none(start_server, repo: Path, tmp_path: Path) -> None:
    """Triton captures them in the request's own trace: its steps' child traces have the model's only."""
    server = start_traced(start_server, repo, tmp_path)
    with httpx.Client(base_url=server.base_url) as client:
        assert infer(client, "pipe", [1]) == [3]
    found = traces(written(server, tmp_path))
    (parent,) = [t for t in found.values() if "parent_id" not in t]
    assert_front_end(parent, HTTP_ORDER)
    steps = [t for t in found.values() if "parent_id" in t]
    assert len(steps) == 2 and all(list(step["timestamps"]) == CORE for step in steps)


# ------------------------------------------------------------------------------------ trace_summary.py
# What Triton's qa/common/trace_summary.py does with a trace file, which this test relies on:
# - it groups the file's entries by "id" (model_name, model_version and every "timestamps" list of an id
#   make one trace), and summarizes the HTTP and the GRPC front end apart;
# - a trace without "parent_id" belongs to the HTTP front end when one of its timestamp names contains
#   "HTTP_RECV_START", to the GRPC one when one contains "GRPC_WAITREAD_START"; a trace with a
#   "parent_id" belongs where its parent does;
# - only traces with REQUEST_START and REQUEST_END count, per (model_name, model_version); REQUEST is
#   REQUEST_END - REQUEST_START;
# - HTTP, when HTTP_RECV_START and HTTP_SEND_END are there: HTTP_INFER = HTTP_SEND_END - HTTP_RECV_START,
#   HTTP_RECV = HTTP_RECV_END - HTTP_RECV_START, HTTP_SEND = HTTP_SEND_END - HTTP_SEND_START, and
#   "Overhead" = HTTP_INFER - REQUEST - HTTP_RECV - HTTP_SEND;
# - GRPC, when GRPC_WAITREAD_END and GRPC_SEND_END are there: GRPC_INFER = GRPC_SEND_END -
#   GRPC_WAITREAD_END, GRPC_SEND = GRPC_SEND_END - GRPC_SEND_START;
# - a span whose end is before its start stops it with an error; each figure is printed as an average.


def summarize(entries: list[dict], front_end: str) -> dict[tuple[str, int], dict[str, float]]:
    """Per model: the trace count and the average of each span (ns), as trace_summary.py sums them."""
    marker = {"HTTP": "HTTP_RECV_START", "GRPC": "GRPC_WAITREAD_START"}[front_end]
    grouped: dict[int, dict] = {}
    for entry in sorted(entries, key=lambda e: e["id"]):
        one = grouped.setdefault(entry["id"], {"timestamps": {}})
        one.update({k: v for k, v in entry.items() if k in ("model_name", "model_version", "parent_id")})
        one["timestamps"].update({s["name"]: s["ns"] for s in entry.get("timestamps", [])})
    members: set[int] = set()
    for trace_id, one in grouped.items():
        if "parent_id" in one:
            if one["parent_id"] in members:
                members.add(trace_id)
        elif any(marker in name for name in one["timestamps"]):
            members.add(trace_id)
    spans = {
        "HTTP": {
            "HTTP_INFER": ("HTTP_RECV_START", "HTTP_SEND_END"),
            "HTTP_RECV": ("HTTP_RECV_START", "HTTP_RECV_END"),
            "HTTP_SEND": ("HTTP_SEND_START", "HTTP_SEND_END"),
        },
        "GRPC": {
            "GRPC_INFER": ("GRPC_WAITREAD_END", "GRPC_SEND_END"),
            "GRPC_SEND": ("GRPC_SEND_START", "GRPC_SEND_END"),
        },
    }[front_end]
    summary: dict[tuple[str, int], dict[str, float]] = {}
    for trace_id in sorted(members):
        one = grouped[trace_id]
        stamps = one["timestamps"]
        if "REQUEST_START" not in stamps or "REQUEST_END" not in stamps:
            continue
        totals = summary.setdefault((one["model_name"], one["model_version"]), {"count": 0})
        totals["count"] += 1
        wanted = {"REQUEST": ("REQUEST_START", "REQUEST_END")}
        first, last = next(iter(spans.values()))
        if first in stamps and last in stamps:
            wanted.update(spans)
        for span, (start, end) in wanted.items():
            assert stamps[end] >= stamps[start], f"trace {trace_id}: {end} < {start}"
            totals[span] = totals.get(span, 0) + stamps[end] - stamps[start]
    for totals in summary.values():
        count = totals.pop("count")
        for span in totals:
            totals[span] /= count
        totals["count"] = count
        if front_end == "HTTP" and "HTTP_INFER" in totals:
            received, sent = totals["HTTP_RECV"], totals["HTTP_SEND"]
            totals["OVERHEAD"] = totals["HTTP_INFER"] - totals["REQUEST"] - received - sent
    return summary


def test_a_trace_summary_finds_each_front_ends_requests(start_server, repo: Path, tmp_path: Path) -> None:
    server = start_traced(start_server, repo, tmp_path)
    for http_version in ("http1", "http2"):
        with make_client(server.base_url, http_version) as client:
            for value in range(3):
                assert infer(client, "batched", [value]) == [2 * value]
            assert infer(client, "pipe", [1]) == [3]  # its steps: double, then inc
    for value in range(4):
        assert grpcio_infer(server, [value]) == [2 * value]
    entries = json.loads(written(server, tmp_path).read_text())
    http, over_grpc = summarize(entries, "HTTP"), summarize(entries, "GRPC")
    # an ensemble's steps are counted with the front end of the request they ran for
    assert {key: totals["count"] for key, totals in http.items()} == {
        ("batched", 1): 6,
        ("pipe", 1): 2,
        ("double", 1): 2,
        ("inc", 1): 2,
    }
    assert {key: totals["count"] for key, totals in over_grpc.items()} == {("double", 1): 4}
    top = http[("batched", 1)]
    assert top["HTTP_INFER"] > 0 and top["REQUEST"] > 0
    assert top["HTTP_RECV"] >= 0 and top["HTTP_SEND"] >= 0 and top["OVERHEAD"] >= 0
    assert top["HTTP_INFER"] >= top["REQUEST"] + top["HTTP_RECV"] + top["HTTP_SEND"]
    (grpc_totals,) = over_grpc.values()
    assert grpc_totals["GRPC_INFER"] > 0 and grpc_totals["GRPC_SEND"] >= 0
    assert grpc_totals["GRPC_INFER"] >= grpc_totals["REQUEST"]


def test_with_workers_every_front_ends_requests_carry_them(start_server, repo: Path, tmp_path: Path) -> None:
    """--workers: a worker's requests are sampled and written by the engine, with the timestamps the
    worker took (it sends them once its answer is out); the engine's own carry them as before."""
    server = start_traced(start_server, repo, tmp_path, "--workers", "2")
    for value in range(12):  # new connections, which the kernel spreads over the two processes
        with httpx.Client(base_url=server.base_url) as client:
            assert infer(client, "double", [value], id=f"r{value}") == [2 * value]
    for value in range(4):
        assert grpcio_infer(server, [value]) == [2 * value]
    found = traces(written(server, tmp_path))
    rest = [t for t in found.values() if "request_id" in t]
    assert sorted(t["request_id"] for t in rest) == sorted(f"r{value}" for value in range(12))
    for trace in rest:
        assert_front_end(trace, HTTP_ORDER)
    over_grpc = [t for t in found.values() if "request_id" not in t]
    assert len(over_grpc) == 4
    for trace in over_grpc:
        assert_front_end(trace, GRPC_ORDER)


# ------------------------------------------------------------------------ generate, ModelStreamInfer
# A model that streams (ours: execute_stream): one answer per value of INPUT0.
COUNTER = """
import numpy as np

class Model:
    async def execute_stream(self, inputs):
        for value in inputs["INPUT0"]:
            yield {"OUTPUT0": np.array([value], np.int32)}
"""
FRONT = {
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
    "INFER_RESPONSE_COMPLETE",
}


def start_with_counter(start_server, repo: Path, tmp_path: Path) -> ServerProcess:
    write_model(repo, "counter", int32_model("counter"), {1: COUNTER})
    return start_traced(start_server, repo, tmp_path)


def front_stamps(path: Path) -> dict[int, list[tuple[str, int]]]:
    """Per trace id, its front-end timestamps in the order written, repeated names kept (a streamed
    answer's sends)."""
    found: dict[int, list[tuple[str, int]]] = {}
    for entry in json.loads(path.read_text()):
        for stamp in entry.get("timestamps", []):
            if stamp["name"] in FRONT:
                found.setdefault(entry["id"], []).append((stamp["name"], stamp["ns"]))
    return found


def assert_stamps(stamps: list[tuple[str, int]], names: list[str]) -> None:
    """Exactly these front-end timestamps, in this order, each no earlier than the one before."""
    assert [name for name, _ in stamps] == names
    times = [ns for _, ns in stamps]
    assert times == sorted(times), stamps


def test_generate_carries_tritons_http_timestamps(
    start_server, repo: Path, tmp_path: Path, http_version: str
) -> None:
    server = start_with_counter(start_server, repo, tmp_path)
    with make_client(server.base_url, http_version) as client:
        response = client.post("/v2/models/double/generate", json={"INPUT0": [4, 5]})
        assert response.status_code == 200, response.text
        assert response.json()["OUTPUT0"] == [8, 10]
    (trace,) = traces(written(server, tmp_path)).values()
    assert trace["model_name"] == "double"
    assert_front_end(trace, HTTP_ORDER)


def test_generate_stream_stamps_each_event_as_triton_does(
    start_server, repo: Path, tmp_path: Path, http_version: str
) -> None:
    """Triton's generate_stream: INFER_RESPONSE_COMPLETE, HTTP_SEND_START and HTTP_SEND_END for each
    answer it streams, after the request's HTTP_RECV_START and HTTP_RECV_END."""
    server = start_with_counter(start_server, repo, tmp_path)
    with make_client(server.base_url, http_version) as client:
        response = client.post("/v2/models/counter/generate_stream", json={"INPUT0": [1, 2, 3]})
        assert response.status_code == 200, response.text
        assert response.text.count("data: ") == 3
        once = client.post("/v2/models/double/generate_stream", json={"INPUT0": [7]})
        assert once.status_code == 200 and once.text.count("data: ") == 1, once.text
    path = written(server, tmp_path)
    names = {t["model_name"]: trace_id for trace_id, t in traces(path).items()}
    stamps = front_stamps(path)
    each = ["INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
    assert_stamps(stamps[names["counter"]], ["HTTP_RECV_START", "HTTP_RECV_END", *each * 3])
    assert_stamps(stamps[names["double"]], ["HTTP_RECV_START", "HTTP_RECV_END", *each])
    (trace,) = [t for t in traces(path).values() if t["model_name"] == "double"]
    assert_front_end(trace, HTTP_ORDER)  # one event: the order of an infer's


def stream_infer(server: ServerProcess, requests: list[tuple[str, list[int]]]) -> list[list[int]]:
    """ModelStreamInfer over grpcio: the requests on one stream, each answer's OUTPUT0."""
    messages = [
        pb.ModelInferRequest(
            model_name=model,
            id=f"s{index}",
            inputs=[tensor("INPUT0", "INT32", [len(values)])],
            raw_input_contents=[np.array(values, "<i4").tobytes()],
        )
        for index, (model, values) in enumerate(requests)
    ]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        method = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelStreamInferResponse.parse,
        )
        answers = list(method(iter(messages), timeout=30))
    assert all(not answer.error_message for answer in answers), answers
    return [np.frombuffer(a.infer_response.raw_output_contents[0], "<i4").tolist() for a in answers]


def test_model_stream_infer_carries_tritons_stream_timestamps(
    start_server, repo: Path, tmp_path: Path
) -> None:
    """Triton's stream handler: per request GRPC_WAITREAD_START (the stream waiting for its message),
    GRPC_WAITREAD_END, INFER_RESPONSE_COMPLETE (its first answer), GRPC_SEND_START and GRPC_SEND_END
    around each answer; a request's wait starts no earlier than the one before it was read."""
    server = start_with_counter(start_server, repo, tmp_path)
    answers = stream_infer(server, [("double", [1]), ("double", [2]), ("counter", [5, 6])])
    assert answers == [[2], [4], [5], [6]]
    path = written(server, tmp_path)
    found = traces(path)
    by_request = {t["request_id"]: trace_id for trace_id, t in found.items()}
    assert set(by_request) == {"s0", "s1", "s2"}
    first, second = found[by_request["s0"]], found[by_request["s1"]]
    for trace in (first, second):
        assert_front_end(trace, GRPC_ORDER)
    assert second["timestamps"]["GRPC_WAITREAD_START"] >= first["timestamps"]["GRPC_WAITREAD_END"]
    sends = ["GRPC_SEND_START", "GRPC_SEND_END"]
    stamps = front_stamps(path)[by_request["s2"]]
    assert_stamps(stamps, ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", *sends * 2])


def test_with_workers_model_stream_infer_carries_them(start_server, repo: Path, tmp_path: Path) -> None:
    """--workers with the engine taking no connections: every stream reaches a worker."""
    write_model(repo, "counter", int32_model("counter"), {1: COUNTER})
    server = start_traced(start_server, repo, tmp_path, "--workers", "2", "--engine-front-end", "false")
    answers = stream_infer(server, [("double", [1]), ("counter", [5, 6])])
    assert answers == [[2], [5], [6]]
    path = written(server, tmp_path)
    found = traces(path)
    by_request = {t["request_id"]: trace_id for trace_id, t in found.items()}
    assert_front_end(found[by_request["s0"]], GRPC_ORDER)
    sends = ["GRPC_SEND_START", "GRPC_SEND_END"]
    stamps = front_stamps(path)[by_request["s1"]]
    assert_stamps(stamps, ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", *sends * 2])


def test_with_workers_a_request_the_worker_does_not_time_is_written_too(
    start_server, repo: Path, tmp_path: Path
) -> None:
    """TF Serving's predict is not traced at the front end (Triton has none): a worker's request is
    traced by the engine all the same, with the model's timestamps, beside a timed one."""
    server = start_traced(start_server, repo, tmp_path, "--workers", "2", "--engine-front-end", "false")
    with httpx.Client(base_url=server.base_url) as client:
        predicted = client.post("/v1/models/double:predict", json={"inputs": {"INPUT0": [3, 4]}})
        assert predicted.status_code == 200, predicted.text
        assert predicted.json()["outputs"] == [6, 8]
        assert infer(client, "double", [5], id="timed") == [10]
    found = traces(written(server, tmp_path))
    (timed,) = [t for t in found.values() if t.get("request_id") == "timed"]
    assert_front_end(timed, HTTP_ORDER)
    (untimed,) = [t for t in found.values() if t.get("request_id") != "timed"]
    assert list(untimed["timestamps"]) == CORE
