"""KServe v2 / Triton over gRPC (`inference.GRPCInferenceService`): InferResponse -> protobuf, the gRPC
status of each error kind, and the other messages.

ModelInferResponse is written by a small protobuf wire writer of our own (betterproto2 takes ~90 µs to
write the `simple` answer): outputs go out as views of their arrays where they can. The request's reader
is codec/v2_grpc_request.py. The generated messages in `proto.inference` stay the source of truth: the
field numbers below are theirs, and tests/test_codec_v2_grpc.py checks this codec against them both
ways. The other, rarer messages (metadata, config, statistics) are built with betterproto2.

Answers carry `raw_output_contents`, one entry per output in order, as Triton's do; BYTES raw data is
4-byte little-endian length-prefixed elements in both directions; FP16 and BF16 travel only raw.
"""

from typing import Any

from grpclib.const import Status

import tensorgate.proto.inference as pb
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.protowire import (
    DOUBLE,
    I64_BIAS,
    LEN,
    SMALL,
    len_field,
    remember,
    str_field,
    tag,
    uvarint,
)
from tensorgate.codec.tensor import (
    InferResponse,
    Tensor,
    tensor_bytes,
)

# The tags of length-delimited fields 1 to 6, the fields this codec writes in every message.
_K1, _K2, _K3, _K4, _K5, _K6 = (tag(n, LEN) for n in range(1, 7))

# ----------------------------------------------------------------------------------------- gRPC status

GRPC_STATUS = {
    ErrorKind.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: Status.NOT_FOUND,
    ErrorKind.UNAVAILABLE: Status.UNAVAILABLE,
    ErrorKind.UNIMPLEMENTED: Status.UNIMPLEMENTED,
    ErrorKind.RESOURCE_EXHAUSTED: Status.RESOURCE_EXHAUSTED,
    ErrorKind.INTERNAL: Status.INTERNAL,
}


def grpc_status(kind: ErrorKind) -> Status:
    """The one place an error kind becomes a gRPC status."""
    return GRPC_STATUS[kind]


# ----------------------------------------------------------------------------------- ModelInferResponse


def encode_response(response: InferResponse) -> bytes:
    """InferResponse -> ModelInferResponse bytes: output metadata, then one raw_output_contents entry per
    output in the same order (Triton's layout)."""
    return b"".join(encode_response_parts(response))


def encode_response_parts(response: InferResponse) -> list[bytes | memoryview]:
    """The bytes of encode_response in pieces, the outputs' data as views of their arrays: a large answer
    goes out without being copied into one message."""
    head = _HEADS.get((response.model_name, response.model_version))
    if head is None:
        head = remember(_HEADS, (response.model_name, response.model_version), _head(response))
    parts = [head]
    if response.id:
        parts.append(str_field(_K3, response.id))
    for key, value in response.parameters.items():
        parts.append(len_field(_K4, _map_entry(key, value)))
    raws = []
    for tensor in response.outputs:
        if tensor.parameters:
            parts.append(len_field(_K5, _output_metadata(tensor)))
        else:
            spec = (tensor.name, tensor.datatype, tensor.shape)
            meta = _METAS.get(spec)
            parts.append(
                meta if meta is not None else remember(_METAS, spec, len_field(_K5, _output_metadata(tensor)))
            )
        raws.append(b"" if tensor.data is None else tensor_bytes(tensor))  # None: in shared memory
    for chunk in raws:
        parts.append(_K6 + uvarint(len(chunk)))
        parts.append(chunk)
    return parts


# Encoded pieces that repeat from answer to answer: the model name and version, and each output's
# metadata (name, datatype, shape). Bounded: cleared when full.
_HEADS: dict[tuple[str, str], bytes] = {}
_METAS: dict[tuple[str, str, tuple[int, ...]], bytes] = {}


def _head(response: InferResponse) -> bytes:
    head = b""
    if response.model_name:
        head += str_field(_K1, response.model_name)
    if response.model_version:
        head += str_field(_K2, response.model_version)
    return head


def _output_metadata(tensor: Tensor) -> bytes:
    dims = b"".join([uvarint(d) for d in tensor.shape])
    body = str_field(_K1, tensor.name) + str_field(_K2, tensor.datatype) + len_field(_K3, dims)
    for key, value in tensor.parameters.items():
        body += len_field(_K4, _map_entry(key, value))
    return body


def _map_entry(key: str, value: Any) -> bytes:
    return str_field(_K1, key) + len_field(_K2, encode_parameter(value))


def encode_parameter(value: Any) -> bytes:
    """A Python value as InferParameter bytes: bool, int (int64, or uint64 past its range), str, float;
    anything else as its text."""
    if isinstance(value, bool):
        return b"\x08" + SMALL[int(value)]
    if isinstance(value, int):
        if -(1 << 63) <= value < 0:
            return b"\x10" + uvarint(value + I64_BIAS)
        if value < 1 << 63:
            return b"\x10" + uvarint(value)
        return b"\x28" + uvarint(value & (I64_BIAS - 1))
    if isinstance(value, float):
        return b"\x21" + DOUBLE.pack(value)
    return str_field(b"\x1a", value if isinstance(value, str) else str(value))


def encode_stream_response(infer_response: bytes) -> bytes:
    """ModelStreamInferResponse carrying an encoded ModelInferResponse."""
    return _K2 + uvarint(len(infer_response)) + infer_response


def encode_stream_error(message: str, request_id: str | None = None) -> bytes:
    """ModelStreamInferResponse carrying an error for one request of the stream; as Triton, the
    infer_response holds only the request's id so the client can tell which request failed."""
    return str_field(_K1, message) + len_field(_K2, str_field(_K3, request_id) if request_id else b"")


# -------------------------------------------------------------------------------- the other messages


def model_metadata(doc: dict) -> pb.ModelMetadataResponse:
    """The REST metadata document (server/model.py) as ModelMetadataResponse."""

    def tensors(entries: list[dict]) -> list[pb.ModelMetadataResponseTensorMetadata]:
        return [
            pb.ModelMetadataResponseTensorMetadata(e["name"], e["datatype"], list(e["shape"]))
            for e in entries
        ]

    return pb.ModelMetadataResponse(
        name=doc["name"],
        versions=list(doc["versions"]),
        platform=doc["platform"],
        inputs=tensors(doc["inputs"]),
        outputs=tensors(doc["outputs"]),
    )


def model_config(config: dict) -> pb.ModelConfigResponse:
    """A model's config (the JSON form REST answers) as ModelConfigResponse. Settings that the
    model_config.proto subset in proto/ does not carry are left out."""
    try:
        message = pb.ModelConfig.from_dict(config, ignore_unknown_fields=True)
    except (KeyError, ValueError, TypeError) as e:
        raise InferError(
            ErrorKind.INTERNAL, f"model '{config.get('name')}': its config has no protobuf form: {e}"
        ) from None
    return pb.ModelConfigResponse(config=message)


def _duration(entry: dict) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=entry["count"], ns=entry["ns"])


def model_statistics(name: str, version: str, stats: dict) -> pb.ModelStatistics:
    """One version's statistics, in the dict form batcher/stats.py gives them, as ModelStatistics."""
    inference = stats["inference_stats"]
    return pb.ModelStatistics(
        name=name,
        version=version,
        last_inference=stats["last_inference"],
        inference_count=stats["inference_count"],
        execution_count=stats["execution_count"],
        inference_stats=pb.InferStatistics(**{key: _duration(value) for key, value in inference.items()}),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=batch["batch_size"],
                compute_input=_duration(batch["compute_input"]),
                compute_infer=_duration(batch["compute_infer"]),
                compute_output=_duration(batch["compute_output"]),
            )
            for batch in stats["batch_stats"]
        ],
        response_stats={
            key: pb.InferResponseStatistics(**{kind: _duration(value) for kind, value in entry.items()})
            for key, entry in stats.get("response_stats", {}).items()
        },
    )


def repository_parameters(parameters: dict[str, pb.ModelRepositoryParameter]) -> tuple[str | None, dict]:
    """RepositoryModelLoadRequest parameters -> (config JSON or None, file overrides "1/model.py" ->
    bytes). Triton's messages for a wrongly typed value."""
    config, files = None, {}
    for key, parameter in parameters.items():
        if key == "config":
            if parameter.string_param is None:
                raise invalid("Config parameter 'config' must have string type for its value (a JSON string)")
            config = parameter.string_param
        elif key.startswith("file:"):
            if parameter.bytes_param is None:
                raise invalid(f"File parameter '{key}' must have bytes type for its value")
            files[key[len("file:") :]] = parameter.bytes_param
    return config, files
