"""The model under load: its inputs and outputs as the server describes them, and the input data sent.

The description comes from the server: KServe v2 metadata and config over REST (`/v2/models/m`,
`/v2/models/m/config`) or gRPC (ModelMetadata, ModelConfig), or TF Serving's signature
(`/v1/models/m/metadata`). A grps server is asked for the v2 metadata at the same address (ours serves
both); another one needs `--input-data` with every input's shape. A dimension of -1 comes from `--shape
NAME:DIMS`, or is the batch dimension (`--batch-size`) when the model batches; anything else left
dynamic is an error, as perf_analyzer makes it.

The data is random (seeded), zero, or perf_analyzer's `--input-data` JSON: `{"data": [{"INPUT0": [...],
"INPUT1": {"content": [...], "shape": [...]}, "TEXT": {"b64": "..."}}, ...]}`, each entry one request
(requests cycle through them); an entry's "validation_data" list, when there is one, holds the expected
outputs, checked as `--verify` checks them.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensorgate.codec.datatypes import BY_V2, TABLE

BY_TF = {t.tf: t for t in TABLE}
Arrays = dict[str, np.ndarray]


class PerfError(Exception):
    """A mistake in the plan or a server that cannot be measured: the message is the whole story."""


@dataclass
class Tensor:
    name: str
    datatype: str  # v2 name
    shape: list[int]  # as the server describes it: -1 for a dynamic dimension, the batch one included


@dataclass
class ModelSpec:
    name: str
    version: str
    max_batch_size: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    extra: dict[str, Any] = field(default_factory=dict)

    def output_shape_ok(self, name: str, shape: list[int]) -> bool:
        """Whether an answer's output `name` has a shape its description allows (-1 matches any size)."""
        for tensor in self.outputs:
            if tensor.name == name:
                return len(tensor.shape) == len(shape) and all(
                    want in (-1, got) for want, got in zip(tensor.shape, shape, strict=True)
                )
        return False


def http_json(url: str, body: Any = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")[:300]
        raise PerfError(f"{url}: HTTP {e.code}: {text}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PerfError(f"{url}: {getattr(e, 'reason', e)}") from None


def _versioned(model: str, version: str) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")


def spec_from_v2_rest(base: str, model: str, version: str) -> ModelSpec:
    metadata = http_json(base + _versioned(model, version))
    try:
        config = http_json(base + _versioned(model, version) + "/config")
        max_batch = int(config.get("max_batch_size", 0))
    except PerfError:  # a server without Triton's configuration extension: the shapes say it
        max_batch = -1
    return _from_v2(metadata, version, max_batch)


async def spec_from_v2_grpc(host: str, port: int, model: str, version: str) -> ModelSpec:
    from grpclib.client import Channel

    import tensorgate.proto.inference as pb

    channel = Channel(host, port)
    try:
        stub = pb.GrpcInferenceServiceStub(channel)
        try:
            metadata = await stub.model_metadata(
                pb.ModelMetadataRequest(name=model, version=version), timeout=10
            )
        except Exception as e:
            raise PerfError(f"ModelMetadata of '{model}' at {host}:{port}: {e}") from None
        try:
            config = await stub.model_config(pb.ModelConfigRequest(name=model, version=version), timeout=10)
            max_batch = config.config.max_batch_size
        except Exception:  # noqa: BLE001 (no configuration extension)
            max_batch = -1
    finally:
        channel.close()
    doc = {
        "name": metadata.name,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in metadata.inputs],
        "outputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in metadata.outputs
        ],
    }
    return _from_v2(doc, version, max_batch)


def spec_from_tfserving(base: str, model: str, version: str) -> ModelSpec:
    path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "") + "/metadata"
    doc = http_json(base + path)
    try:
        signatures = doc["metadata"]["signature_def"]["signature_def"]
        signature = signatures.get("serving_default") or next(iter(signatures.values()))
    except (KeyError, StopIteration, AttributeError):
        raise PerfError(f"{base}{path}: no signature_def in the answer") from None

    def tensors(side: dict) -> list[Tensor]:
        found = []
        for name, info in sorted(side.items()):
            dtype = BY_TF.get(info.get("dtype", ""))
            if dtype is None:
                raise PerfError(f"input {name}: TF dtype {info.get('dtype')!r} is not one perf can send")
            dims = [int(d.get("size", -1)) for d in info.get("tensor_shape", {}).get("dim", [])]
            found.append(Tensor(name, dtype.v2, dims))
        return found

    inputs, outputs = tensors(signature.get("inputs", {})), tensors(signature.get("outputs", {}))
    batches = all(t.shape[:1] == [-1] for t in inputs)  # TF Serving's convention: a leading -1 batches
    return ModelSpec(model, version, 1 << 30 if batches else 0, inputs, outputs)


def _from_v2(doc: dict, version: str, max_batch: int) -> ModelSpec:
    inputs = [Tensor(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in doc.get("inputs", [])]
    outputs = [Tensor(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in doc.get("outputs", [])]
    for tensor in inputs:
        if tensor.datatype not in BY_V2:
            raise PerfError(f"input {tensor.name}: datatype {tensor.datatype!r} is not a KServe v2 one")
    if max_batch < 0:  # unknown: a leading -1 on every input is taken for the batch dimension
        max_batch = 1 << 30 if inputs and all(t.shape[:1] == [-1] for t in inputs) else 0
    return ModelSpec(doc.get("name", ""), version, max_batch, inputs, outputs)


# ------------------------------------------------------------------------------------------- shapes


def parse_shapes(entries: list[str]) -> dict[str, list[int]]:
    """`--shape NAME:D1,D2,...` (perf_analyzer's form) to {name: dims}."""
    shapes = {}
    for entry in entries:
        name, sep, dims = entry.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise PerfError(f"--shape {entry!r}: write NAME:DIM,DIM,... (e.g. INPUT0:1,16)") from None
        if any(d < 0 for d in shapes[name]):
            raise PerfError(f"--shape {entry!r}: dimensions are sizes, >= 0")
    return shapes


def request_shapes(spec: ModelSpec, shapes: dict[str, list[int]], batch_size: int) -> dict[str, list[int]]:
    """Each input's shape in a request: the batch dimension first where the model batches."""
    unknown = set(shapes) - {t.name for t in spec.inputs}
    if unknown:
        raise PerfError(f"--shape names {sorted(unknown)}, which model '{spec.name}' does not have")
    if spec.max_batch_size == 0 and batch_size != 1:
        raise PerfError(f"--batch-size {batch_size}: model '{spec.name}' does not batch (max_batch_size 0)")
    if 0 < spec.max_batch_size < batch_size:
        raise PerfError(
            f"--batch-size {batch_size} is over model '{spec.name}' max_batch_size {spec.max_batch_size}"
        )
    result = {}
    for tensor in spec.inputs:
        dims = list(tensor.shape)
        batched = spec.max_batch_size > 0 and dims[:1] == [-1]
        rest = dims[1:] if batched else dims
        given = shapes.get(tensor.name)
        if given is not None:  # perf_analyzer's --shape leaves the batch dimension out
            if len(given) != len(rest) or any(
                want not in (-1, got) for want, got in zip(rest, given, strict=True)
            ):
                raise PerfError(
                    f"--shape {tensor.name}:{','.join(map(str, given))} does not fit its shape {dims}"
                )
            rest = given
        if any(d < 0 for d in rest):
            raise PerfError(
                f"input {tensor.name} has a dynamic shape {dims}: give its size with "
                f"--shape {tensor.name}:{','.join('N' if d < 0 else str(d) for d in rest)}"
            )
        result[tensor.name] = [batch_size, *rest] if batched else rest
    return result


# --------------------------------------------------------------------------------------------- data


def generated(
    spec: ModelSpec, shapes: dict[str, list[int]], kind: str, count: int, seed: int = 0
) -> list[Arrays]:
    """`count` requests' inputs: random (seeded, small values) or zero."""
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        arrays = {}
        for tensor in spec.inputs:
            shape = shapes[tensor.name]
            dtype = BY_V2[tensor.datatype]
            if tensor.datatype == "BYTES":
                words = [
                    "" if kind == "zero" else f"w{rng.integers(1 << 20)}" for _ in range(int(np.prod(shape)))
                ]
                arrays[tensor.name] = np.array([w.encode() for w in words], dtype=object).reshape(shape)
            elif kind == "zero":
                arrays[tensor.name] = np.zeros(shape, dtype.numpy)
            elif tensor.datatype == "BOOL":
                arrays[tensor.name] = rng.integers(0, 2, shape).astype(bool)
            elif dtype.numpy.kind == "f" or tensor.datatype == "BF16":
                values = rng.random(shape, np.float32)
                arrays[tensor.name] = (
                    values.astype(dtype.numpy)
                    if tensor.datatype != "BF16"
                    else ((values.view(np.uint32) >> 16).astype(np.uint16))
                )
            else:
                arrays[tensor.name] = rng.integers(0, 100, shape).astype(dtype.numpy)
        requests.append(arrays)
    return requests


def from_file(
    spec: ModelSpec, path: Path, shapes: dict[str, list[int]]
) -> tuple[list[Arrays], list[Arrays | None]]:
    """perf_analyzer's --input-data JSON: each entry's inputs, and its validation_data (or None)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PerfError(f"--input-data {path}: {e}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f'--input-data {path}: expected {{"data": [{{"INPUT": [...]}}, ...]}}')
    if isinstance(entries[0], list):  # perf_analyzer's streams (sequences): their steps, one after another
        entries = [step for stream in entries for step in stream]
    expected = doc.get("validation_data") if isinstance(doc, dict) else None
    by_name = {t.name: t for t in spec.inputs}
    out_by_name = {t.name: t for t in spec.outputs}
    requests, validations = [], []
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PerfError(f"--input-data {path}: entry {number} is not an object")
        missing = set(by_name) - set(entry)
        if missing:
            raise PerfError(f"--input-data {path}: entry {number} lacks {sorted(missing)}")
        requests.append(
            {name: _array(entry[name], by_name[name], shapes.get(name), path, number) for name in by_name}
        )
        check = expected[number] if isinstance(expected, list) and number < len(expected) else None
        validations.append(
            None
            if check is None
            else {
                name: _array(value, out_by_name[name], None, path, number)
                for name, value in check.items()
                if name in out_by_name
            }
        )
    return requests, validations


def bytes_elements(raw: bytes) -> np.ndarray:
    """BYTES in Triton's serialized form (each element a 4-byte little-endian length, then its bytes), as
    many elements as there are: an object array of them."""
    elements, offset = [], 0
    while offset + 4 <= len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        elements.append(raw[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return np.array(elements, dtype=object)


def _array(value: Any, tensor: Tensor, shape: list[int] | None, path: Path, number: int) -> np.ndarray:
    dtype = BY_V2[tensor.datatype]
    where = f"--input-data {path}: entry {number}, {tensor.name}"
    if isinstance(value, dict):
        shape = value.get("shape", shape)
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if tensor.datatype == "BYTES":
                array = bytes_elements(raw)
            else:
                array = np.frombuffer(raw, dtype.numpy).copy()
        else:
            value = value.get("content", [])
            array = None
    else:
        array = None
    if array is None:
        flat = np.asarray(value).reshape(-1)
        if tensor.datatype == "BYTES":
            array = np.array([str(v).encode() if not isinstance(v, bytes) else v for v in flat], dtype=object)
        else:
            array = flat.astype(dtype.numpy)
    if shape is None:
        fixed = [d for d in tensor.shape]
        if fixed[:1] == [-1]:
            fixed[0] = array.size // max(1, int(np.prod([d for d in fixed[1:] if d > 0])))
        shape = fixed
    try:
        return array.reshape(shape)
    except ValueError:
        raise PerfError(f"{where}: {array.size} values do not make shape {shape}") from None
