"""Client-side helpers of the KServe v2 gRPC end-to-end tests: grpclib stubs generated from proto/ on a
fresh channel per call, request builders, and answers read back as a client reads them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest
from e2e_helpers import A, B, ServerProcess, decode_bytes_elements
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from v2_client import WIRE_DTYPES

import proto.inference as pb

SERVICE = "/inference.GRPCInferenceService/"
Stub = pb.GrpcInferenceServiceStub


def call(server: ServerProcess, fn: Callable[[Stub], Awaitable[Any]]) -> Any:
    """fn(stub) on a fresh channel to the server's gRPC port."""

    async def main() -> Any:
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            return await fn(Stub(channel))
        finally:
            channel.close()

    return asyncio.run(main())


def grpc_error(
    server: ServerProcess, fn: Callable[[Stub], Awaitable[Any]], status: Status, *fragments: str
) -> str:
    with pytest.raises(GRPCError) as excinfo:
        call(server, fn)
    assert excinfo.value.status is status, (excinfo.value.status, excinfo.value.message)
    message = excinfo.value.message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def tensor(
    name: str, datatype: str, shape: list[int], **contents: Any
) -> pb.ModelInferRequestInferInputTensor:
    typed = pb.InferTensorContents(**contents) if contents else None
    return pb.ModelInferRequestInferInputTensor(name=name, datatype=datatype, shape=shape, contents=typed)


def simple_request(a=A, b=B, **fields: Any) -> pb.ModelInferRequest:
    """`simple` with raw INT32 [1, 16] inputs."""
    inputs = [tensor("INPUT0", "INT32", [1, 16]), tensor("INPUT1", "INT32", [1, 16])]
    raw = [np.array(a, "<i4").tobytes(), np.array(b, "<i4").tobytes()]
    return pb.ModelInferRequest(**{"model_name": "simple", **fields}, inputs=inputs, raw_input_contents=raw)


def outputs(response: pb.ModelInferResponse) -> dict[str, list]:
    """The raw outputs as a client reads them (raw_output_contents in output order)."""
    assert len(response.raw_output_contents) == len(response.outputs)
    out = {}
    for meta, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        assert meta.contents is None
        if meta.datatype == "BYTES":
            out[meta.name] = decode_bytes_elements(raw)
        else:
            out[meta.name] = np.frombuffer(raw, WIRE_DTYPES[meta.datatype]).tolist()
    return out


SUMS = [x + y for x, y in zip(A, B, strict=True)]
DIFFS = [x - y for x, y in zip(A, B, strict=True)]


def rest(server: ServerProcess, method: str, path: str, **kwargs: Any) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        return c.request(method, path, **kwargs)


def stream(server: ServerProcess, requests: list[pb.ModelInferRequest]) -> list[pb.ModelStreamInferResponse]:
    async def run(stub: Stub) -> list:
        return [m async for m in stub.model_stream_infer(requests, timeout=20)]

    return call(server, run)


def open_stream(stub: Stub) -> Any:
    """A ModelStreamInfer call driven message by message."""
    return stub.channel.request(
        SERVICE + "ModelStreamInfer",
        Cardinality.STREAM_STREAM,
        pb.ModelInferRequest,
        pb.ModelStreamInferResponse,
    )


def text_request(text: str, **fields: Any) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="token_stream",
        inputs=[tensor("TEXT", "BYTES", [1], bytes_contents=[text.encode()])],
        **fields,
    )
