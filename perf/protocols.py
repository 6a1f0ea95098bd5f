"""What each protocol sends for a request and how its answer is read: every request is serialized once,
before the load starts; an answer is checked for its status, and for the outputs (names and shapes) the
model's description promises. Identical answer bytes are checked once (`Checker`), so a deterministic
model costs one parse per distinct answer, not one per request.

| `--protocol` | wire | request |
|---|---|---|
| rest | HTTP/1.1 | KServe v2 JSON infer |
| rest-binary | HTTP/1.1 | v2 infer with binary tensors (Inference-Header-Content-Length), outputs binary |
| h2 | HTTP/2 cleartext (prior knowledge) | v2 JSON infer |
| grpc | HTTP/2, gRPC | ModelInfer, tensors in raw_input_contents |
| grpc-stream | HTTP/2, gRPC | ModelStreamInfer: each stream sends its next request when its answer came |
| tfserving | HTTP/1.1 | TF Serving predict, columnar (`{"inputs": {...}}`) |
| grps | HTTP/1.1 | grps predict with `gtensors` |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tensorgate.codec.bytes_tensor import encode_bytes
from tensorgate.codec.datatypes import BY_GRPS, BY_V2
from tensorgate.perf.model import Arrays, ModelSpec, PerfError, bytes_elements

PROTOCOLS = ("rest", "rest-binary", "h2", "grpc", "grpc-stream", "tfserving", "grps")
HTTP1 = ("rest", "rest-binary", "tfserving", "grps")
GRPC = ("grpc", "grpc-stream")
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"


@dataclass
class Wire:
    """One request as it goes out: its HTTP method, path and headers (HTTP), and its body (for gRPC the
    serialized message, unframed)."""

    path: str
    headers: dict[str, str]
    body: bytes


def _json_value(array: np.ndarray) -> Any:
    if array.dtype == object:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    return array.reshape(-1).tolist()


def _raw(array: np.ndarray) -> bytes:
    return encode_bytes(array) if array.dtype == object else np.ascontiguousarray(array).tobytes()


def encode(protocol: str, spec: ModelSpec, inputs: Arrays) -> Wire:
    """The request carrying `inputs` to `spec`'s model in `protocol`."""
    version = f"/versions/{spec.version}" if spec.version else ""
    types = {t.name: t.datatype for t in spec.inputs}
    if protocol in ("rest", "h2"):
        doc = {
            "inputs": [
                {
                    "name": name,
                    "datatype": types[name],
                    "shape": list(array.shape),
                    "data": _json_value(array),
                }
                for name, array in inputs.items()
            ]
        }
        return Wire(
            f"/v2/models/{spec.name}{version}/infer", {"Content-Type": "application/json"}, orjson.dumps(doc)
        )
    if protocol == "rest-binary":
        raws = [_raw(array) for array in inputs.values()]
        header = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": name,
                        "datatype": types[name],
                        "shape": list(array.shape),
                        "parameters": {"binary_data_size": len(raw)},
                    }
                    for (name, array), raw in zip(inputs.items(), raws, strict=True)
                ],
                "outputs": [{"name": t.name, "parameters": {"binary_data": True}} for t in spec.outputs],
            }
        )
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }
        return Wire(f"/v2/models/{spec.name}{version}/infer", headers, header + b"".join(raws))
    if protocol in GRPC:
        import tensorgate.proto.inference as pb

        tensors = [
            pb.ModelInferRequestInferInputTensor(name, types[name], list(array.shape))
            for name, array in inputs.items()
        ]
        message = pb.ModelInferRequest(
            model_name=spec.name,
            model_version=spec.version,
            inputs=tensors,
            raw_input_contents=[_raw(array) for array in inputs.values()],
        )
        return Wire(STREAM_PATH if protocol == "grpc-stream" else INFER_PATH, {}, bytes(message))
    if protocol == "tfserving":
        doc = {"inputs": {name: _nested(array) for name, array in inputs.items()}}
        path = f"/v1/models/{spec.name}{version}:predict"
        return Wire(path, {"Content-Type": "application/json"}, orjson.dumps(doc))
    if protocol == "grps":
        tensors = []
        for name, array in inputs.items():
            dtype = BY_V2[types[name]].grps
            if types[name] != BY_GRPS.get(dtype, BY_V2[types[name]]).v2:
                raise PerfError(
                    f"input {name}: grps carries {types[name]} only widened, which perf does not send"
                )
            field = "flat_" + dtype[3:].lower()
            tensors.append(
                {"name": name, "dtype": dtype, "shape": list(array.shape), field: _json_value(array)}
            )
        model = spec.name + (f"-{spec.version}" if spec.version else "")
        body = orjson.dumps({"model": model, "gtensors": {"tensors": tensors}})
        return Wire("/grps/v1/infer/predict", {"Content-Type": "application/json"}, body)
    raise PerfError(f"--protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")


def _nested(array: np.ndarray) -> Any:
    if array.dtype == object:
        return np.vectorize(lambda v: v.decode("utf-8", "replace"), otypes=[object])(array).tolist()
    return array.tolist()


# ------------------------------------------------------------------------------------------ answers


class Answer:
    """What a client hands over when a request ends: an HTTP status (gRPC: 200 with a grpc-status), the
    head's interesting header, and the body (gRPC: the answer message, unframed)."""

    __slots__ = ("status", "grpc_status", "grpc_message", "header_length", "body")

    def __init__(
        self, status: int, body: bytes, header_length: int = -1, grpc_status: int = 0, grpc_message: str = ""
    ) -> None:
        self.status = status
        self.body = body
        self.header_length = header_length  # Inference-Header-Content-Length of a binary answer
        self.grpc_status = grpc_status
        self.grpc_message = grpc_message


def outputs_of(protocol: str, answer: Answer) -> dict[str, np.ndarray]:
    """The output arrays an answer holds (raises ValueError or KeyError when it holds none)."""
    if protocol in ("rest", "h2"):
        return {o["name"]: _v2_array(o) for o in orjson.loads(answer.body)["outputs"]}
    if protocol == "rest-binary":
        size = answer.header_length if answer.header_length >= 0 else len(answer.body)
        doc = orjson.loads(answer.body[:size])
        arrays, offset = {}, size
        for o in doc["outputs"]:
            length = (o.get("parameters") or {}).get("binary_data_size")
            if length is None:
                arrays[o["name"]] = _v2_array(o)
                continue
            raw = answer.body[offset : offset + length]
            offset += length
            arrays[o["name"]] = _from_raw(o["datatype"], o["shape"], raw)
        if offset != len(answer.body):
            raise ValueError(f"binary answer: {len(answer.body) - offset} bytes past its outputs")
        return arrays
    if protocol in GRPC:
        import tensorgate.proto.inference as pb

        if protocol == "grpc-stream":
            message = pb.ModelStreamInferResponse.parse(answer.body)
            if message.error_message:
                raise ValueError(message.error_message)
            response = message.infer_response
        else:
            response = pb.ModelInferResponse.parse(answer.body)
        raws = list(response.raw_output_contents)
        arrays = {}
        for i, o in enumerate(response.outputs):
            arrays[o.name] = _from_raw(o.datatype, list(o.shape), raws[i]) if i < len(raws) else np.empty(0)
        return arrays
    if protocol == "tfserving":
        doc = orjson.loads(answer.body)
        outputs = doc["outputs"] if "outputs" in doc else doc["predictions"]
        if not isinstance(outputs, dict):
            return {"": np.asarray(outputs)}
        return {name: np.asarray(value) for name, value in outputs.items()}
    if protocol == "grps":
        doc = orjson.loads(answer.body)
        if doc.get("status", {}).get("status") != "SUCCESS":
            raise ValueError(f"grps status {doc.get('status')}")
        arrays = {}
        for t in doc.get("gtensors", {}).get("tensors", []):
            values = next((v for k, v in t.items() if k.startswith("flat")), [])
            arrays[t["name"]] = np.asarray(values).reshape(t["shape"])
        return arrays
    raise AssertionError(protocol)


def _v2_array(output: dict) -> np.ndarray:
    data = np.asarray(output.get("data", []))
    return data.reshape(output["shape"]) if data.size == int(np.prod(output["shape"])) else data


def _from_raw(datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    if datatype == "BYTES":
        return bytes_elements(raw).reshape(shape)
    return np.frombuffer(raw, BY_V2[datatype].numpy).reshape(shape)


class Checker:
    """Judges answers: '' for a good one, else the kind of error it is ("http 503", "grpc 14",
    "wrong outputs", "mismatch"), with one example message per kind kept in `examples`."""

    CACHE = 256  # distinct answers remembered as good

    def __init__(
        self, protocol: str, spec: ModelSpec, references: list[dict[str, np.ndarray] | None] | None = None
    ) -> None:
        self.protocol = protocol
        self.spec = spec
        self.names = {t.name for t in spec.outputs}
        self.references = references  # --verify: the reference outputs of each request, by its index
        self.good: set[tuple[int, bytes]] = set()
        self.examples: dict[str, str] = {}

    def __call__(self, index: int, answer: Answer) -> str:
        if answer.status != 200:
            return self._bad(f"http {answer.status}", answer.body[:300].decode("utf-8", "replace"))
        if answer.grpc_status:
            return self._bad(f"grpc {answer.grpc_status}", answer.grpc_message)
        reference = self.references[index % len(self.references)] if self.references else None
        key = (index % len(self.references) if reference is not None else -1, answer.body)
        if key in self.good:
            return ""
        try:
            outputs = outputs_of(self.protocol, answer)
        except (ValueError, KeyError, TypeError) as e:
            return self._bad("wrong answer", f"{type(e).__name__}: {e}")
        problem = self._shapes(outputs)
        if problem:
            return self._bad("wrong outputs", problem)
        if reference is not None:
            problem = mismatch(outputs, reference)
            if problem:
                return self._bad("mismatch", problem)
        if len(self.good) < self.CACHE:
            self.good.add(key)
        return ""

    def _shapes(self, outputs: dict[str, np.ndarray]) -> str:
        # TF Serving's answers name their outputs only when there are several
        if self.protocol == "tfserving" and set(outputs) == {""} and len(self.names) == 1:
            return ""
        if set(outputs) != self.names:
            return f"outputs {sorted(outputs)}, the model describes {sorted(self.names)}"
        for name, array in outputs.items():
            if not self.spec.output_shape_ok(name, list(array.shape)):
                want = next(t.shape for t in self.spec.outputs if t.name == name)
                return f"output {name} has shape {list(array.shape)}, the model describes {want}"
        return ""

    def _bad(self, kind: str, message: str) -> str:
        self.examples.setdefault(kind, message)
        return kind


def mismatch(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> str:
    """'' when every reference output is in `outputs` with equal values (floats within 1e-5 relative),
    else the first difference."""
    for name, want in reference.items():
        got = outputs.get(name)
        if got is None:
            return f"output {name} missing"
        if got.shape != want.shape:
            return f"output {name}: shape {list(got.shape)}, the reference {list(want.shape)}"
        if want.dtype.kind in "fc" or got.dtype.kind in "fc":
            equal = np.allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-6, equal_nan=True
            )
        else:
            equal = np.array_equal(got, want)
        if not equal:
            return (
                f"output {name} differs from the reference run: {np.asarray(got).reshape(-1)[:8].tolist()}..."
            )
    return ""
