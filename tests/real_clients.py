"""Real gRPC clients calling ModelInfer as fast as they can, each in its own process, every answer checked:

    python tests/real_clients.py CLIENT PORT MODEL SECONDS

CLIENT is `grpcio-shared` (THREADS threads on one grpcio channel), `grpcio-each` (THREADS threads, each
on its own channel and connection), `grpcio-aio` (64 calls in flight on one grpcio.aio channel) or
`grpclib` (16 calls in flight on one grpclib channel). Prints one JSON line: {"ok": n, "failed": {why: n}}.
A wrong answer counts as a failure. gRPC's C core (grpcio) sends a connection WINDOW_UPDATE for each
answer it reads, and BDP PINGs: what a strict, fast client does to a server's flood defences.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tensorgate.proto.inference as pb  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"
THREADS = 8
AIO_IN_FLIGHT = 64
GRPCLIB_IN_FLIGHT = 16


def tensors_for(model: str) -> tuple[str, dict[str, np.ndarray], list[np.ndarray]]:
    """The datatype and inputs of the request sent to `model`, and the outputs it must get back."""
    if model == "simple":
        a = np.arange(16, dtype="<i4").reshape(1, 16)
        b = np.full((1, 16), 3, dtype="<i4")
        return "INT32", {"INPUT0": a, "INPUT1": b}, [a + b, a - b]
    if model == "identity_fp32":
        x = np.linspace(-1, 1, 64, dtype="<f4")
        return "FP32", {"INPUT0": x}, [x]
    raise SystemExit(f"no request for model {model!r}")


def request_for(model: str) -> tuple[bytes, list[np.ndarray]]:
    """The serialized ModelInferRequest and the outputs it must get back."""
    datatype, inputs, expected = tensors_for(model)
    request = pb.ModelInferRequest(
        model_name=model,
        inputs=[
            pb.ModelInferRequestInferInputTensor(name=name, datatype=datatype, shape=list(x.shape))
            for name, x in inputs.items()
        ],
        raw_input_contents=[x.tobytes() for x in inputs.values()],
    )
    return bytes(request), expected


def check(answer: bytes, expected: list[np.ndarray]) -> str | None:
    """Why the serialized answer is wrong, or None."""
    response = pb.ModelInferResponse.parse(answer)
    raw = response.raw_output_contents
    if len(raw) != len(expected):
        return f"{len(raw)} outputs, expected {len(expected)}"
    for got, want in zip(raw, expected, strict=True):
        if got != want.tobytes():
            return "wrong output values"
    return None


class Tally:
    def __init__(self) -> None:
        self.ok = 0
        self.failed: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def answer(self, answer: bytes, expected: list[np.ndarray]) -> None:
        wrong = check(answer, expected)
        with self.lock:
            if wrong is None:
                self.ok += 1
            else:
                self.failed[wrong] += 1

    def fail(self, why: str) -> None:
        with self.lock:
            self.failed[why] += 1


def grpcio_threads(port: int, model: str, seconds: float, one_channel: bool) -> Tally:
    import grpc

    data, expected = request_for(model)
    tally = Tally()
    target = f"127.0.0.1:{port}"
    # Channels to the same target share one connection unless each has its own subchannel pool.
    own = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(target, options=own)] * THREADS
    if not one_channel:
        channels = [grpc.insecure_channel(target, options=own) for _ in range(THREADS)]
    end = time.monotonic() + seconds

    def work(channel: grpc.Channel) -> None:
        call = channel.unary_unary(METHOD)
        while time.monotonic() < end:
            try:
                tally.answer(call(data, timeout=30), expected)
            except grpc.RpcError as e:
                tally.fail(f"{e.code()}: {e.details()}")

    threads = [threading.Thread(target=work, args=(channel,)) for channel in channels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for channel in set(channels):
        channel.close()
    return tally


async def grpcio_aio(port: int, model: str, seconds: float) -> Tally:
    import grpc
    import grpc.aio

    data, expected = request_for(model)
    tally = Tally()
    end = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)

        async def work() -> None:
            while time.monotonic() < end:
                try:
                    tally.answer(await call(data, timeout=30), expected)
                except grpc.RpcError as e:
                    tally.fail(f"{e.code()}: {e.details()}")

        await asyncio.gather(*(work() for _ in range(AIO_IN_FLIGHT)))
    return tally


async def grpclib_calls(port: int, model: str, seconds: float) -> Tally:
    from grpclib import GRPCError
    from grpclib.client import Channel

    data, expected = request_for(model)
    request = pb.ModelInferRequest.parse(data)
    tally = Tally()
    end = time.monotonic() + seconds
    channel = Channel("127.0.0.1", port)
    stub = pb.GrpcInferenceServiceStub(channel)

    async def work() -> None:
        while time.monotonic() < end:
            try:
                tally.answer(bytes(await stub.model_infer(request, timeout=30)), expected)
            except (GRPCError, OSError) as e:
                tally.fail(f"{type(e).__name__}: {e}")

    try:
        await asyncio.gather(*(work() for _ in range(GRPCLIB_IN_FLIGHT)))
    finally:
        channel.close()
    return tally


def main(argv: list[str]) -> int:
    client, port, model, seconds = argv[0], int(argv[1]), argv[2], float(argv[3])
    if client in ("grpcio-shared", "grpcio-each"):
        tally = grpcio_threads(port, model, seconds, one_channel=client == "grpcio-shared")
    elif client == "grpcio-aio":
        tally = asyncio.run(grpcio_aio(port, model, seconds))
    elif client == "grpclib":
        tally = asyncio.run(grpclib_calls(port, model, seconds))
    else:
        raise SystemExit(f"unknown client {client!r}")
    print(json.dumps({"ok": tally.ok, "failed": dict(tally.failed)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
