"""Helpers of the shared-memory tests (tests/test_e2e_shared_memory*.py): segments made as
tritonclient.utils.shared_memory makes them, and REST and gRPC calls naming them."""

import base64
import contextlib
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any

import grpc
import httpx
import numpy as np
from e2e_helpers import (
    A,
    B,
    ServerProcess,
)
from grpc_helpers import SERVICE, call, grpc_error, rest
from grpclib.const import Status

import tensorgate.proto.inference as pb

ALLOW = ("--allow-client-shm", "true")
A32, B32 = np.array(A, np.int32), np.array(B, np.int32)
NOPE = "Unable to find shared memory region: 'nope'"


class Segment:
    """A client's POSIX shared-memory segment, made as tritonclient.utils.shared_memory makes it:
    SharedMemory(name="/<name>", create=True), i.e. /dev/shm/<name>; registered here under `name`."""

    def __init__(self, size: int) -> None:
        self.name = f"tg_shm_{uuid.uuid4().hex[:12]}"
        self.key = "/" + self.name
        self.shm = shared_memory.SharedMemory(name=self.key, create=True, size=size)

    def write(self, offset: int, values: list) -> None:
        self.shm.buf[offset : offset + 4 * len(values)] = np.asarray(values, np.int32).tobytes()

    def read(self, offset: int, count: int = 16) -> list[int]:
        return np.frombuffer(bytes(self.shm.buf[offset : offset + 4 * count]), np.int32).tolist()  # a copy

    def close(self) -> None:
        self.shm.close()
        self.shm.unlink()


@contextlib.contextmanager
def segments(*sizes: int) -> Iterator[list[Segment]]:
    made: list[Segment] = []
    try:
        made.extend(Segment(size) for size in sizes)
        yield made
    finally:
        for segment in made:
            segment.close()


def shm(region: str, byte_size: int | None = None, offset: int = 0) -> dict:
    """The parameters naming a region, as tritonclient's set_shared_memory writes them."""
    params = {
        "shared_memory_region": region,
        "shared_memory_byte_size": byte_size,
        "shared_memory_offset": offset,
    }
    return {k: v for k, v in params.items() if v is not None and v != 0}


def ints(raw: bytes) -> list[int]:
    return np.frombuffer(raw, np.int32).tolist()


# ------------------------------------------------------------------------------------------ REST


def register(server: ServerProcess, seg: Segment, name: str = "", offset: int = 0, byte_size: int = 0):
    body = {"key": seg.key, "offset": offset, "byte_size": byte_size or seg.shm.size - offset}
    return rest(server, "POST", f"/v2/systemsharedmemory/region/{name or seg.name}/register", json=body)


def shm_call(server: ServerProcess, what: str, name: str = "", kind: str = "system") -> httpx.Response:
    """GET .../status or POST .../unregister, of one region or all."""
    path = f"/v2/{kind}sharedmemory" + (f"/region/{name}" if name else "") + f"/{what}"
    return rest(server, "GET" if what == "status" else "POST", path)


def rest_doc(inputs: list, outputs: list | None = None, datatype: str = "INT32", shape=(1, 16)) -> dict:
    """[(name, array or shm parameters)], [(name, parameters)] -> a JSON infer request."""
    doc: dict[str, Any] = {"inputs": []}
    for name, value in inputs:
        entry = {"name": name, "datatype": datatype, "shape": list(shape)}
        entry.update({"parameters": value} if isinstance(value, dict) else {"data": value.tolist()})
        doc["inputs"].append(entry)
    if outputs is not None:
        doc["outputs"] = [{"name": name, "parameters": params} for name, params in outputs]
    return doc


def infer(server: ServerProcess, doc: dict, model: str = "simple") -> httpx.Response:
    return rest(server, "POST", f"/v2/models/{model}/infer", json=doc)


def in_region(name: str, shape=(1, 16), datatype="INT32") -> dict:
    """An answer's entry for an output written into a region, as Triton writes it: no data and no
    parameters (Triton's C++ HTTP client requires `binary_data_size` in any output's parameters)."""
    return {"name": name, "datatype": datatype, "shape": list(shape)}


# ------------------------------------------------------------------------------------------ gRPC


def grpc_params(params: dict) -> dict[str, pb.InferParameter]:
    return {
        k: pb.InferParameter(string_param=v) if isinstance(v, str) else pb.InferParameter(int64_param=v)
        for k, v in params.items()
    }


def grpc_request(
    inputs: list, outputs=(), model: str = "simple", datatype: str = "INT32", shape=(1, 16), **fields: Any
) -> pb.ModelInferRequest:
    """As rest_doc: an array goes in raw_input_contents, shm parameters in the input's parameters."""
    tensors, raw = [], []
    for name, value in inputs:
        tensors.append(pb.ModelInferRequestInferInputTensor(name=name, datatype=datatype, shape=list(shape)))
        if isinstance(value, dict):
            tensors[-1].parameters = grpc_params(value)
        else:
            raw.append(value.tobytes())
    wanted = [pb.ModelInferRequestInferRequestedOutputTensor(n, grpc_params(p)) for n, p in outputs]
    return pb.ModelInferRequest(
        model_name=model, inputs=tensors, raw_input_contents=raw, outputs=wanted, **fields
    )


def grpcio_infer(server: ServerProcess, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        parse = pb.ModelInferResponse.parse
        method = channel.unary_unary(
            SERVICE + "ModelInfer", request_serializer=bytes, response_deserializer=parse
        )
        return method(request, timeout=10)


def rpc(
    server: ServerProcess, method: str, *args: Any, error: Status | None = None, message: str = ""
) -> Any:
    """grpclib: stub.<method>(<Method>Request(*args)), or of a request; with `error`, it must fail so."""
    request_type = getattr(pb, "".join(w.title() for w in method.split("_")) + "Request")
    request = args[0] if args and isinstance(args[0], request_type) else request_type(*args)
    if error is None:
        return call(server, lambda s: getattr(s, method)(request))
    return grpc_error(server, lambda s: getattr(s, method)(request), error, message)


def grpclib_infer(server: ServerProcess, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    return rpc(server, "model_infer", request)


def register_cuda(server: ServerProcess, name: str, handle: bytes, byte_size: int = 64) -> httpx.Response:
    body = {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": 0, "byte_size": byte_size}
    return rest(server, "POST", f"/v2/cudasharedmemory/region/{name}/register", json=body)
