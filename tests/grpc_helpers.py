"""Client-side helpers of the KServe v2 gRPC end-to-end tests: grpclib stubs generated from proto/ on a
fresh channel per call, request builders, and answers read back as a client reads them; and gRPC calls
made frame by frame on an H2Wire, for what a client library hides (any service)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import numpy as np
import pytest
from e2e_helpers import A, B, ServerProcess, decode_bytes_elements
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from h2_wire import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    RST_STREAM,
    WINDOW_UPDATE,
    H2Wire,
    frame,
)
from v2_client import WIRE_DTYPES

import tensorgate.proto.inference as pb

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


# ------------------------------------------------------------------------------------------ raw frames


def message(data: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed message."""
    return (b"\x01" if compressed else b"\x00") + len(data).to_bytes(4, "big") + data


def messages_of(data: bytes) -> list[tuple[bool, bytes]]:
    """(compressed flag, bytes) of each length-prefixed message in `data`."""
    out = []
    while data:
        size = int.from_bytes(data[1:5], "big")
        out.append((data[0] == 1, data[5 : 5 + size]))
        data = data[5 + size :]
    return out


def open_call(
    h2: H2Wire, stream: int, path: str, body: bytes | None = None, extra=(), end: bool = True
) -> None:
    """HEADERS of a gRPC call, and its body in one DATA frame (END_STREAM unless `end` is False)."""
    named = {name for name, _ in extra}
    fields = [(n, v) for n, v in (("content-type", "application/grpc"), ("te", "trailers")) if n not in named]
    fields += extra
    out = frame(HEADERS, END_HEADERS, stream, h2.block("POST", path, fields))
    if body is not None:
        out += frame(DATA, END_STREAM if end else 0, stream, body)
    h2.send(out)


def answer(h2: H2Wire, stream: int) -> tuple[list[tuple[int, dict[str, str]]], bytes]:
    """The header blocks of a call's answer, each with its frame's flags, and its DATA, up to END_STREAM."""
    blocks, data = [], b""
    while True:
        got = h2.read_frame()
        assert got is not None, "connection closed before the answer ended"
        assert got.kind != GOAWAY, f"GOAWAY {got.error_code}: {got.payload[8:]!r}"
        if got.stream != stream:
            continue
        assert got.kind != RST_STREAM or got.error_code == NO_ERROR, f"reset with {got.error_code}"
        if got.kind == HEADERS:
            blocks.append((got.flags, dict(h2.decoder.decode(got.payload))))
        elif got.kind == DATA:
            data += got.payload
        if got.flags & END_STREAM:
            return blocks, data


def status_of(blocks: list[tuple[int, dict[str, str]]]) -> tuple[int, str]:
    """(grpc-status, grpc-message decoded) of an answer's trailers."""
    trailers = blocks[-1][1]
    return int(trailers["grpc-status"]), unquote(trailers.get("grpc-message", ""))


def stalled_stream(port: int, path: str, request: bytes, progress: Path) -> tuple[int, list[bytes]]:
    """A streaming call to `path` with `request`, from a client that gives the default 64 KB of window and
    reads nothing: how many steps the model's generator had taken (the number it writes to `progress`) once
    the answers stopped coming (1 s without a frame). Then the client opens its windows wide and reads the
    call to its end, status OK: every message of the answer, in the order sent."""
    with H2Wire(("127.0.0.1", port)) as h2:
        h2.open()
        open_call(h2, 1, path, message(request))
        early = b""
        with pytest.raises(TimeoutError):  # answers until the window is spent, then none
            while True:
                got = h2.read_frame(timeout=1.0 if early else 10.0)
                assert got is not None, "connection closed"
                if got.kind == DATA:
                    early += got.payload
        assert len(early) <= 65535, "DATA past the client's window"
        steps = int(progress.read_text())
        h2.send(frame(WINDOW_UPDATE, 0, 0, (64 << 20).to_bytes(4, "big")))
        h2.send(frame(WINDOW_UPDATE, 0, 1, (64 << 20).to_bytes(4, "big")))
        blocks, data = answer(h2, 1)
        assert status_of(blocks) == (0, "")
        return steps, [body for _, body in messages_of(early + data)]
