"""gRPC load generator: grpclib clients keeping `concurrency` KServe v2 calls in flight.

Two modes, on the same request (`simple`, two INT32 [1, 16] inputs in raw_input_contents):

* unary: ModelInfer calls, `concurrency` at a time, spread over `connections` channels (HTTP/2
  connections); whenever a call ends the next one starts.
* stream: `concurrency` ModelStreamInfer streams, each sending a request and waiting for its answer
  before sending the next (so req/s counts answers); a stream lives for the whole run.

The request is serialized once with the generated messages and sent as bytes; answers are not parsed,
only checked to be answers (a unary call that ends OK; a stream message without `error_message`). A
non-OK status, an error message and a lost connection count as errors.
"""

import asyncio
import time

import numpy as np
from grpclib import GRPCError
from grpclib.client import Channel, StreamStreamMethod, UnaryUnaryMethod
from grpclib.exceptions import StreamTerminatedError

import tensorgate.proto.inference as pb
from bench.connections import run_until_cancelled
from bench.stats import Recorder
from tensorgate.server.grpc.inference import (
    RawMessage as Raw,  # messages as their bytes, as the server reads them
)

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
INPUT0 = np.arange(16, dtype="<i4")
INPUT1 = np.ones(16, dtype="<i4")
_LOST = (GRPCError, StreamTerminatedError, ConnectionError, OSError)


def infer_request() -> pb.ModelInferRequest:
    """The bench's `simple` request, as the JSON scenarios send it."""
    inputs = [pb.ModelInferRequestInferInputTensor(name, "INT32", [1, 16]) for name in ("INPUT0", "INPUT1")]
    return pb.ModelInferRequest(
        model_name="simple", inputs=inputs, raw_input_contents=[INPUT0.tobytes(), INPUT1.tobytes()]
    )


def check_answer(response: pb.ModelInferResponse) -> str:
    """'' when `response` holds the sums and differences of the bench request, else what is wrong."""
    outputs = {o.name: i for i, o in enumerate(response.outputs)}
    if set(outputs) != {"OUTPUT0", "OUTPUT1"} or len(response.raw_output_contents) != 2:
        return f"unexpected outputs: {response.outputs}"
    got0 = np.frombuffer(response.raw_output_contents[outputs["OUTPUT0"]], "<i4")
    got1 = np.frombuffer(response.raw_output_contents[outputs["OUTPUT1"]], "<i4")
    if not (np.array_equal(got0, INPUT0 + INPUT1) and np.array_equal(got1, INPUT0 - INPUT1)):
        return f"wrong outputs: {got0.tolist()}, {got1.tolist()}"
    return ""


async def verify(host: str, port: int) -> str:
    """'' when one ModelInfer and one ModelStreamInfer answer `simple` right, else what went wrong."""
    channel = Channel(host, port)
    try:
        stub = pb.GrpcInferenceServiceStub(channel)
        problem = check_answer(await stub.model_infer(infer_request(), timeout=10))
        if problem:
            return f"ModelInfer: {problem}"
        answers = [m async for m in stub.model_stream_infer([infer_request()], timeout=10)]
        if len(answers) != 1 or answers[0].error_message or answers[0].infer_response is None:
            return f"ModelStreamInfer: {answers}"
        problem = check_answer(answers[0].infer_response)
        return f"ModelStreamInfer: {problem}" if problem else ""
    except Exception as exc:  # report, don't crash the run
        return f"{type(exc).__name__}: {exc}"
    finally:
        channel.close()


async def _unary(channel: Channel, request: Raw, rec: Recorder) -> None:
    call = UnaryUnaryMethod(channel, INFER_PATH, Raw, Raw)
    while True:
        t0 = time.perf_counter()
        try:
            await call(request)
        except _LOST:
            rec.record(time.perf_counter() - t0, False)
            await asyncio.sleep(0.01)
            continue
        rec.record(time.perf_counter() - t0, True)


async def _stream(channel: Channel, request: Raw, rec: Recorder) -> None:
    call = StreamStreamMethod(channel, STREAM_PATH, Raw, Raw)
    while True:
        try:
            async with call.open() as stream:
                while True:
                    t0 = time.perf_counter()
                    await stream.send_message(request)
                    reply = await stream.recv_message()
                    # an answer starts with field 2 (infer_response); field 1 is error_message
                    rec.record(time.perf_counter() - t0, reply is not None and reply.data[:1] != b"\x0a")
                    if reply is None:
                        break
        except _LOST:
            rec.error()
            await asyncio.sleep(0.01)


async def run_grpc(
    host: str, port: int, mode: str, concurrency: int, rec: Recorder, connections: int = 4
) -> None:
    """Keep `concurrency` calls (unary) or streams (stream) going over `connections` channels until
    cancelled."""
    request = Raw(bytes(infer_request()))
    channels = [Channel(host, port) for _ in range(max(1, min(connections, concurrency)))]
    worker = _unary if mode == "unary" else _stream
    try:
        await run_until_cancelled(
            worker(channels[i % len(channels)], request, rec) for i in range(concurrency)
        )
    finally:
        for channel in channels:
            channel.close()


# The harness's gRPC scenarios and the mode each runs: `bare-*` against bench/grpc_echo.py, `infer-*`
# against our server's gRPC port.
GRPC_MODES = {
    "bare-grpc": "unary",
    "infer-grpc": "unary",
    "bare-grpcstream": "stream",
    "infer-grpcstream": "stream",
}
