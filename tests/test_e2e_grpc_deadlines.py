"""gRPC deadlines and cancellation: a call whose grpc-timeout passes ends DEADLINE_EXCEEDED, a call the
client cancels ends at once, and either way its request leaves the batcher's queue (the model never
runs it). grpcio and grpclib clients, on a one-instance model kept busy by a first request; grpcio and
grpclib keep a deadline themselves too, so a raw HTTP/2 client (no clock of its own) shows the server's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
from e2e_helpers import wait_for_file, write_model
from grpc_helpers import SERVICE, answer, message, open_call, outputs, status_of, tensor
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from h2_wire import H2Wire

import tensorgate.proto.inference as pb

pytestmark = pytest.mark.ours

GATED_MODEL = """
import asyncio, pathlib
HERE = pathlib.Path(__file__).parent

class Model:
    async def execute(self, inputs):
        with open(HERE / "ran", "a") as log:
            log.write(" ".join(str(v) for v in inputs["INPUT0"].ravel().tolist()) + "\\n")
        while not (HERE / "release").exists():
            await asyncio.sleep(0.01)
        return {"OUTPUT0": inputs["INPUT0"]}
"""
GATED_CONFIG = """
name: "gated"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { }
"""


def request(value: int) -> bytes:
    return bytes(
        pb.ModelInferRequest(
            model_name="gated", inputs=[tensor("INPUT0", "INT32", [1, 1], int_contents=[value])]
        )
    )


def _queued(server, count: int) -> None:
    """Waits until `count` requests wait in the server's queues (the pending-request gauge)."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        line = next(
            ln
            for ln in text.splitlines()
            if ln.startswith('nv_inference_pending_request_count{model="gated"')
        )
        if float(line.split()[-1]) == count:
            return
        assert time.monotonic() < deadline, line
        time.sleep(0.01)


def test_deadlines_and_cancellation_take_requests_out_of_the_queue(start_server, repo: Path) -> None:
    version_dir = write_model(repo, "gated", GATED_CONFIG, {1: GATED_MODEL}) / "1"
    server = start_server(repo)
    target = f"127.0.0.1:{server.grpc_port}"
    try:
        with grpc.insecure_channel(target) as channel:
            infer = channel.unary_unary(
                SERVICE + "ModelInfer",
                request_serializer=bytes,
                response_deserializer=pb.ModelInferResponse.parse,
            )
            first = infer.future(request(1), timeout=30)
            wait_for_file(version_dir / "ran")  # the one instance is busy with request 1 from now on

            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as excinfo:  # grpcio: a deadline passes in the queue
                infer(request(2), timeout=0.3)
            assert excinfo.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # ended while request 1 still holds the model (the order), in time (a generous bound)
            assert time.monotonic() - started < 10

            cancelled = infer.future(request(3), timeout=30)  # grpcio: cancelled while queued
            _queued(server, 1)
            assert cancelled.cancel()

            async def grpclib_calls() -> None:
                channel = Channel("127.0.0.1", server.grpc_port)
                stub = pb.GrpcInferenceServiceStub(channel)
                try:
                    # grpclib: a deadline, which grpclib also keeps itself: whichever side is first
                    with pytest.raises((GRPCError, TimeoutError)) as excinfo:
                        await stub.model_infer(pb.ModelInferRequest.parse(request(4)), timeout=0.3)
                    if isinstance(excinfo.value, GRPCError):
                        assert excinfo.value.status is Status.DEADLINE_EXCEEDED
                    queued = asyncio.create_task(stub.model_infer(pb.ModelInferRequest.parse(request(5))))
                    await asyncio.to_thread(_queued, server, 1)
                    queued.cancel()  # grpclib: RST_STREAM CANCEL
                    with pytest.raises(asyncio.CancelledError):
                        await queued
                finally:
                    channel.close()

            asyncio.run(grpclib_calls())
            _queued(server, 0)
            (version_dir / "release").write_text("1")
            assert list(memoryview(first.result(timeout=10).raw_output_contents[0]).cast("i")) == [1]
            last = infer(request(6), timeout=10)
            assert list(memoryview(last.raw_output_contents[0]).cast("i")) == [6]
    finally:
        (version_dir / "release").write_text("1")
    assert (version_dir / "ran").read_text().split() == ["1", "6"], "a timed-out or cancelled request ran"
    stats = httpx.get(f"{server.base_url}/v2/models/gated/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 2


def test_a_deadline_that_passes_while_the_model_runs(start_server, repo: Path) -> None:
    version_dir = write_model(repo, "gated", GATED_CONFIG, {1: GATED_MODEL}) / "1"
    server = start_server(repo)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            infer = channel.unary_unary(
                SERVICE + "ModelInfer",
                request_serializer=bytes,
                response_deserializer=pb.ModelInferResponse.parse,
            )
            with pytest.raises(grpc.RpcError) as excinfo:
                infer(request(1), timeout=0.5)
            assert excinfo.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            (version_dir / "release").write_text("1")
            assert list(memoryview(infer(request(2), timeout=10).raw_output_contents[0]).cast("i")) == [2]
    finally:
        (version_dir / "release").write_text("1")


def test_a_deadline_on_a_stream_whose_model_is_slow(start_server, repo: Path) -> None:
    """A ModelStreamInfer call with a short grpc-timeout, still open, whose request the model holds: it ends
    DEADLINE_EXCEEDED (grpcio aio). On the raw wire the server says so itself, in time, and the request
    that waited in the queue behind the first leaves it unrun; once released, the model serves on."""
    version_dir = write_model(repo, "gated", GATED_CONFIG, {1: GATED_MODEL}) / "1"
    server = start_server(repo)

    async def with_grpcio_aio() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            streaming = channel.stream_stream(
                SERVICE + "ModelStreamInfer",
                request_serializer=bytes,
                response_deserializer=pb.ModelStreamInferResponse.parse,
            )
            call = streaming(timeout=0.5)
            await call.write(request(1))  # and the client keeps its side of the stream open
            await asyncio.to_thread(wait_for_file, version_dir / "ran")  # the model holds request 1
            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await call.read()
            return excinfo.value.code()

    try:
        assert asyncio.run(with_grpcio_aio()) == grpc.StatusCode.DEADLINE_EXCEEDED
        with H2Wire(("127.0.0.1", server.grpc_port), timeout=10) as h2:
            h2.open()
            started = time.monotonic()
            open_call(
                h2,
                1,
                SERVICE + "ModelStreamInfer",
                message(request(2)),
                extra=[("grpc-timeout", "500m")],
                end=False,
            )
            blocks, data = answer(h2, 1)
            elapsed = time.monotonic() - started
        assert status_of(blocks) == (Status.DEADLINE_EXCEEDED.value, "Deadline Exceeded")
        assert data == b"", "no answer to request 2"
        # The server's own clock: not before the timeout, and (a generous bound) not long after it; the
        # order is the test's: the model still holds request 1 (released below), so only the deadline
        # could end this call.
        assert 0.45 < elapsed < 10, f"the call ended {elapsed:.2f} s after it began, its timeout 0.5 s"
        _queued(server, 0)
        (version_dir / "release").write_text("1")
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            streaming = channel.stream_stream(
                SERVICE + "ModelStreamInfer",
                request_serializer=bytes,
                response_deserializer=pb.ModelStreamInferResponse.parse,
            )
            [last] = streaming(iter([request(3)]), timeout=10)
        assert last.error_message == "" and outputs(last.infer_response) == {"OUTPUT0": [3]}
    finally:
        (version_dir / "release").write_text("1")
    assert (version_dir / "ran").read_text().split() == ["1", "3"], "the timed-out queued request ran"
