"""proto/: the committed betterproto2 modules are current and speak the same wire format as protoc.

- Regenerating from proto/*.proto reproduces the committed modules byte for byte (else: `make proto`).
- Every message protoc reads from our .proto files has the same fields (number, type) in the generated
  modules, and filled messages round-trip between betterproto2 and google.protobuf both ways.
- The field numbers and RPC paths clients depend on are those of the published definitions
  (triton-inference-server/common protobuf/grpc_service.proto and model_config.proto,
  NetEase-Media/grps apis/grps_apis/grps.proto).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import betterproto2
import grpclib.const
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor

import tensorgate.proto.grpc.health.v1  # noqa: F401 (registers its messages in the pool)
import tensorgate.proto.grpc.reflection.v1  # noqa: F401
import tensorgate.proto.grpc.reflection.v1alpha  # noqa: F401
import tensorgate.proto.grps.protos.v1 as grps
import tensorgate.proto.inference as inference
import tensorgate.proto.tensorflow.serving  # noqa: F401 (and tensorflow, tensorflow.error, google.protobuf)
from tensorgate.proto.generate import PROTO_DIR, REPO_ROOT, SOURCES, generate
from tensorgate.proto.message_pool import default_message_pool

Make = Callable[..., Any]


# --- the committed modules are what the generator produces -------------------------------------------


def test_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    generated = generate(tmp_path / "out")
    assert Path("inference/__init__.py") in generated
    assert Path("grps/protos/v1/__init__.py") in generated
    stale = [
        f"proto/{rel}"
        for rel in generated
        if not (PROTO_DIR / rel).is_file()
        or (PROTO_DIR / rel).read_bytes() != (tmp_path / "out" / rel).read_bytes()
    ]
    assert not stale, f"stale generated modules, run `make proto`: {stale}"


def test_no_committed_module_is_left_over_from_an_older_generation(tmp_path: Path) -> None:
    generated = set(generate(tmp_path / "out"))
    committed = {
        p.relative_to(PROTO_DIR)
        for p in PROTO_DIR.rglob("*")
        if p.is_file() and p.suffix in (".py", ".typed", ".binpb") and "__pycache__" not in p.parts
    }
    leftovers = sorted(str(p) for p in committed - generated - {Path("generate.py")})
    assert not leftovers, f"files under proto/ that `make proto` no longer generates: {leftovers}"


# --- protoc's reading of the same .proto files ------------------------------------------------------------


@pytest.fixture(scope="module")
def pb_pool(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pool.DescriptorPool:
    """protoc's descriptors for proto/*.proto, in a private pool (the global one stays untouched)."""
    out = tmp_path_factory.mktemp("protoc") / "descriptors.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *(str(PROTO_DIR / name) for name in SOURCES),
        ],
        cwd=REPO_ROOT,
        check=True,
    )
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(file)
    return pool


def pb_class(pool: descriptor_pool.DescriptorPool, full_name: str) -> type:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def bp_class(full_name: str) -> type[betterproto2.Message]:
    return default_message_pool.url_to_type[f"type.googleapis.com/{full_name}"]


def all_messages(pool: descriptor_pool.DescriptorPool) -> list[Any]:
    found = []

    def walk(descriptor: Any) -> None:
        if descriptor.GetOptions().map_entry:
            return
        found.append(descriptor)
        for nested in descriptor.nested_types:
            walk(nested)

    for name in SOURCES:
        for descriptor in pool.FindFileByName(name).message_types_by_name.values():
            walk(descriptor)
    return found


PB_TYPE_NAMES = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def test_every_message_has_protocs_fields(pb_pool: descriptor_pool.DescriptorPool) -> None:
    messages = all_messages(pb_pool)
    assert len(messages) > 100
    for descriptor in messages:
        cls = bp_class(descriptor.full_name)
        ours = {}
        for field in dataclasses.fields(cls):
            meta = betterproto2.FieldMetadata.get(field)
            ours[meta.number] = (meta.proto_type, bool(meta.repeated))
        theirs = {}
        for field in descriptor.fields:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                theirs[field.number] = ("map", False)
            else:
                theirs[field.number] = (PB_TYPE_NAMES[field.type], field.is_repeated)
        assert ours == theirs, descriptor.full_name


# Each sample is built twice from the same description: `make(full_name, **fields)` makes either a
# betterproto2 or a google.protobuf message. Zero values inside oneofs are there on purpose: they are set
# (present), so they must cross the wire.


def sample_infer_request(make: Make) -> Any:
    def param(**kw: Any) -> Any:
        return make("inference.InferParameter", **kw)

    contents = make(
        "inference.InferTensorContents",
        bool_contents=[True, False, True],
        int_contents=[-1, 0, 2**31 - 1, -(2**31)],
        int64_contents=[-(2**63), 2**63 - 1],
        uint_contents=[0, 2**32 - 1],
        uint64_contents=[2**64 - 1],
        fp32_contents=[0.5, -1.25, 3.0],
        fp64_contents=[1e-300, -2.5],
        bytes_contents=[b"", b"\x00\xff", "é".encode()],
    )
    raw = bytes(range(64))
    return make(
        "inference.ModelInferRequest",
        model_name="simple",
        model_version="1",
        id="req-7",
        parameters={
            "flag": param(bool_param=False),
            "n": param(int64_param=0),
            "s": param(string_param="x"),
            "d": param(double_param=0.25),
            "u": param(uint64_param=2**64 - 1),
        },
        inputs=[
            make(
                "inference.ModelInferRequest.InferInputTensor",
                name="INPUT0",
                datatype="INT32",
                shape=[1, 16],
                parameters={"binary_data_size": param(int64_param=64)},
            ),
            make(
                "inference.ModelInferRequest.InferInputTensor",
                name="INPUT1",
                datatype="BYTES",
                shape=[-1, 3],
                contents=contents,
            ),
        ],
        outputs=[
            make(
                "inference.ModelInferRequest.InferRequestedOutputTensor",
                name="OUTPUT0",
                parameters={"binary_data": param(bool_param=True)},
            )
        ],
        raw_input_contents=[raw, b""],
    )


def sample_infer_response(make: Make) -> Any:
    return make(
        "inference.ModelInferResponse",
        model_name="simple",
        model_version="1",
        id="req-7",
        parameters={"sequence_end": make("inference.InferParameter", bool_param=False)},
        outputs=[
            make(
                "inference.ModelInferResponse.InferOutputTensor",
                name="OUTPUT0",
                datatype="INT32",
                shape=[1, 16],
            ),
            make(
                "inference.ModelInferResponse.InferOutputTensor",
                name="OUTPUT1",
                datatype="FP32",
                shape=[2],
                contents=make("inference.InferTensorContents", fp32_contents=[1.5, -0.0]),
            ),
        ],
        raw_output_contents=[bytes(64), b""],
    )


def sample_stream_response(make: Make) -> Any:
    return make(
        "inference.ModelStreamInferResponse",
        error_message="",
        infer_response=make("inference.ModelInferResponse", model_name="m", id="1"),
    )


def sample_model_config(make: Make) -> Any:
    config = make(
        "inference.ModelConfig",
        name="simple",
        backend="python",
        max_batch_size=8,
        input=[make("inference.ModelInput", name="INPUT0", data_type=8, dims=[16], optional=True)],
        output=[make("inference.ModelOutput", name="OUTPUT0", data_type=11, dims=[-1])],
        dynamic_batching=make(
            "inference.ModelDynamicBatching",
            preferred_batch_size=[4, 8],
            max_queue_delay_microseconds=100,
            priority_levels=2,
            default_queue_policy=make("inference.ModelQueuePolicy", timeout_action=1, max_queue_size=16),
            priority_queue_policy={
                1: make("inference.ModelQueuePolicy"),
                2: make("inference.ModelQueuePolicy"),
            },
        ),
        instance_group=[make("inference.ModelInstanceGroup", kind=2, count=2)],
        parameters={"k": make("inference.ModelParameter", string_value="v")},
        version_policy=make("inference.ModelVersionPolicy", all=make("inference.ModelVersionPolicy.All")),
    )
    return make("inference.ModelConfigResponse", config=config)


def sample_grps_tensors(make: Make) -> Any:
    tensors = [
        make(
            "grps.protos.v1.GenericTensor",
            name="f",
            dtype=7,
            shape=[2, 2],
            flat_float32=[1.0, -2.5, 0.0, 4.0],
        ),
        make("grps.protos.v1.GenericTensor", name="i", dtype=5, shape=[2], flat_int64=[-(2**63), 7]),
        make("grps.protos.v1.GenericTensor", name="u", dtype=1, shape=[3], flat_uint8=[0, 255, 1]),
        make("grps.protos.v1.GenericTensor", name="s", dtype=9, shape=[2], flat_string=["a", "ü"]),
        make("grps.protos.v1.GenericTensor", name="d", dtype=8, shape=[1], flat_float64=[0.1]),
    ]
    return make(
        "grps.protos.v1.GrpsMessage",
        status=make("grps.protos.v1.Status", code=200, msg="OK", status=1),
        model="simple-1",
        gtensors=make("grps.protos.v1.GenericTensorData", tensors=tensors),
    )


def sample_grps_map(make: Make) -> Any:
    gmap = make(
        "grps.protos.v1.GenericMapData",
        s_s={"a": "b"},
        s_b={"bin": b"\x00\x01"},
        s_i32={"n": -3},
        s_i64={"big": 2**40},
        s_f={"f": 0.5},
        s_d={"d": 1e100},
    )
    return make("grps.protos.v1.GrpsMessage", gmap=gmap)


def sample_grps_scalars(make: Make) -> list[Any]:
    return [
        make("grps.protos.v1.GrpsMessage", bin_data=b""),
        make("grps.protos.v1.GrpsMessage", bin_data=b"\x89PNG"),
        make("grps.protos.v1.GrpsMessage", str_data=""),
        make("grps.protos.v1.GrpsMessage", str_data="simple"),
        make("grps.protos.v1.GrpsMessage", ndarray=make("grps.protos.v1.NDArrayData")),
        make(
            "grps.protos.v1.GrpsMessage", status=make("grps.protos.v1.Status", code=400, msg="bad", status=2)
        ),
    ]


SAMPLES = {
    "ModelInferRequest": sample_infer_request,
    "ModelInferResponse": sample_infer_response,
    "ModelStreamInferResponse": sample_stream_response,
    "ModelConfigResponse": sample_model_config,
    "GrpsMessage-gtensors": sample_grps_tensors,
    "GrpsMessage-gmap": sample_grps_map,
    "GrpsMessage-oneofs": sample_grps_scalars,
}


@pytest.mark.parametrize("sample", SAMPLES.values(), ids=SAMPLES.keys())
def test_messages_round_trip_between_betterproto2_and_protobuf(
    pb_pool: descriptor_pool.DescriptorPool, sample: Callable[[Make], Any]
) -> None:
    def bp_make(full_name: str, **fields: Any) -> Any:
        return bp_class(full_name)(**fields)

    def pb_make(full_name: str, **fields: Any) -> Any:
        return pb_class(pb_pool, full_name)(**fields)

    ours, theirs = sample(bp_make), sample(pb_make)
    if not isinstance(ours, list):
        ours, theirs = [ours], [theirs]
    for bp_msg, pb_msg in zip(ours, theirs, strict=True):
        pb_cls = type(pb_msg)
        # betterproto2 -> protobuf
        assert pb_cls.FromString(bytes(bp_msg)) == pb_msg
        # protobuf -> betterproto2
        parsed = type(bp_msg).parse(pb_msg.SerializeToString())
        assert parsed == bp_msg
        # and the oneof choice survives, zero values included
        for oneof in pb_msg.DESCRIPTOR.oneofs:
            expected = pb_msg.WhichOneof(oneof.name) or ""
            assert betterproto2.which_one_of(parsed, oneof.name)[0] == expected


def test_fields_protobuf_does_not_know_survive_a_betterproto2_round_trip(
    pb_pool: descriptor_pool.DescriptorPool,
) -> None:
    # A newer client may send fields our .proto lacks; betterproto2 keeps them when re-serializing.
    pb_msg = pb_class(pb_pool, "inference.ModelInferRequest")(model_name="m", id="1")
    extra = (
        betterproto2.encode_varint(99 << 3 | 2) + betterproto2.encode_varint(3) + b"new"
    )  # field 99: "new"
    parsed = inference.ModelInferRequest.parse(pb_msg.SerializeToString() + extra)
    assert parsed.model_name == "m"
    assert bytes(parsed).endswith(extra)


# --- pinned against the published definitions --------------------------------------------------------------

PUBLISHED_FIELDS = [
    # (message, field, number, wire-level type) as in Triton's grpc_service.proto
    (inference.ModelInferRequest, "model_name", 1, "string"),
    (inference.ModelInferRequest, "model_version", 2, "string"),
    (inference.ModelInferRequest, "id", 3, "string"),
    (inference.ModelInferRequest, "parameters", 4, "map"),
    (inference.ModelInferRequest, "inputs", 5, "message"),
    (inference.ModelInferRequest, "outputs", 6, "message"),
    (inference.ModelInferRequest, "raw_input_contents", 7, "bytes"),
    (inference.ModelInferRequestInferInputTensor, "name", 1, "string"),
    (inference.ModelInferRequestInferInputTensor, "datatype", 2, "string"),
    (inference.ModelInferRequestInferInputTensor, "shape", 3, "int64"),
    (inference.ModelInferRequestInferInputTensor, "parameters", 4, "map"),
    (inference.ModelInferRequestInferInputTensor, "contents", 5, "message"),
    (inference.ModelInferRequestInferRequestedOutputTensor, "parameters", 2, "map"),
    (inference.ModelInferResponse, "model_name", 1, "string"),
    (inference.ModelInferResponse, "id", 3, "string"),
    (inference.ModelInferResponse, "outputs", 5, "message"),
    (inference.ModelInferResponse, "raw_output_contents", 6, "bytes"),
    (inference.ModelStreamInferResponse, "error_message", 1, "string"),
    (inference.ModelStreamInferResponse, "infer_response", 2, "message"),
    (inference.InferParameter, "bool_param", 1, "bool"),
    (inference.InferParameter, "int64_param", 2, "int64"),
    (inference.InferParameter, "string_param", 3, "string"),
    (inference.InferParameter, "double_param", 4, "double"),
    (inference.InferParameter, "uint64_param", 5, "uint64"),
    (inference.InferTensorContents, "bool_contents", 1, "bool"),
    (inference.InferTensorContents, "int_contents", 2, "int32"),
    (inference.InferTensorContents, "int64_contents", 3, "int64"),
    (inference.InferTensorContents, "uint_contents", 4, "uint32"),
    (inference.InferTensorContents, "uint64_contents", 5, "uint64"),
    (inference.InferTensorContents, "fp32_contents", 6, "float"),
    (inference.InferTensorContents, "fp64_contents", 7, "double"),
    (inference.InferTensorContents, "bytes_contents", 8, "bytes"),
    (inference.ModelMetadataResponse, "platform", 3, "string"),
    (inference.ModelMetadataResponse, "outputs", 5, "message"),
    (inference.ModelConfigResponse, "config", 1, "message"),
    (inference.ModelStatistics, "response_stats", 9, "map"),
    (inference.RepositoryIndexResponseModelIndex, "reason", 4, "string"),
    # model_config.proto
    (inference.ModelConfig, "backend", 17, "string"),
    (inference.ModelConfig, "max_batch_size", 4, "int32"),
    (inference.ModelConfig, "input", 5, "message"),
    (inference.ModelConfig, "output", 6, "message"),
    (inference.ModelConfig, "dynamic_batching", 11, "message"),
    (inference.ModelConfig, "parameters", 14, "map"),
    (inference.ModelConfig, "response_cache", 24, "message"),
    (inference.ModelDynamicBatching, "max_queue_delay_microseconds", 2, "uint64"),
    (inference.ModelDynamicBatching, "priority_queue_policy", 7, "map"),
    (inference.ModelInstanceGroup, "kind", 4, "enum"),
    (inference.ModelOutput, "label_filename", 4, "string"),
    (inference.ModelOutput, "reshape", 5, "message"),
    # grps.proto
    (grps.GrpsMessage, "status", 1, "message"),
    (grps.GrpsMessage, "model", 2, "string"),
    (grps.GrpsMessage, "bin_data", 3, "bytes"),
    (grps.GrpsMessage, "str_data", 4, "string"),
    (grps.GrpsMessage, "gtensors", 5, "message"),
    (grps.GrpsMessage, "ndarray", 6, "message"),
    (grps.GrpsMessage, "gmap", 7, "message"),
    (grps.Status, "code", 1, "int32"),
    (grps.Status, "msg", 2, "string"),
    (grps.Status, "status", 3, "enum"),
    (grps.GenericTensor, "dtype", 2, "enum"),
    (grps.GenericTensor, "shape", 3, "uint32"),
    (grps.GenericTensor, "flat_uint8", 4, "uint32"),
    (grps.GenericTensor, "flat_float16", 9, "float"),
    (grps.GenericTensor, "flat_float32", 10, "float"),
    (grps.GenericTensor, "flat_string", 12, "string"),
    (grps.GenericMapData, "s_b", 2, "map"),
    (grps.GenericMapData, "s_d", 6, "map"),
]


@pytest.mark.parametrize(("cls", "name", "number", "proto_type"), PUBLISHED_FIELDS)
def test_field_numbers_are_the_published_ones(cls: type, name: str, number: int, proto_type: str) -> None:
    meta = {f.name: betterproto2.FieldMetadata.get(f) for f in dataclasses.fields(cls)}[name]
    assert (meta.number, meta.proto_type) == (number, proto_type)


def test_oneofs_group_the_published_choices() -> None:
    groups = {
        (grps.GrpsMessage, "data_oneof"): {"bin_data", "str_data", "gtensors", "ndarray", "gmap"},
        (inference.InferParameter, "parameter_choice"): {
            "bool_param",
            "int64_param",
            "string_param",
            "double_param",
            "uint64_param",
        },
        (inference.ModelConfig, "scheduling_choice"): {
            "dynamic_batching",
            "sequence_batching",
            "ensemble_scheduling",
        },
    }
    for (cls, group), names in groups.items():
        members = {
            f.name for f in dataclasses.fields(cls) if betterproto2.FieldMetadata.get(f).group == group
        }
        assert members == names, cls.__name__


def test_enum_values_are_the_published_ones() -> None:
    assert inference.DataType.TYPE_INT32 == 8
    assert inference.DataType.TYPE_FP32 == 11
    assert inference.DataType.TYPE_STRING == 13
    assert inference.DataType.TYPE_BF16 == 14
    assert grps.DataType.DT_FLOAT32 == 7
    assert grps.DataType.DT_STRING == 9
    assert grps.StatusStatusFlag.SUCCESS == 1
    assert grps.StatusStatusFlag.FAILURE == 2


U, SS = grpclib.const.Cardinality.UNARY_UNARY, grpclib.const.Cardinality.UNARY_STREAM
V2_RPCS = {
    "ServerLive": U,
    "ServerReady": U,
    "ModelReady": U,
    "ServerMetadata": U,
    "ModelMetadata": U,
    "ModelInfer": U,
    "ModelStreamInfer": grpclib.const.Cardinality.STREAM_STREAM,
    "ModelConfig": U,
    "ModelStatistics": U,
    "RepositoryIndex": U,
    "RepositoryModelLoad": U,
    "RepositoryModelUnload": U,
    "SystemSharedMemoryStatus": U,
    "SystemSharedMemoryRegister": U,
    "SystemSharedMemoryUnregister": U,
    "CudaSharedMemoryStatus": U,
    "CudaSharedMemoryRegister": U,
    "CudaSharedMemoryUnregister": U,
    "TraceSetting": U,
    "LogSettings": U,
}
GRPS_RPCS = {
    "Predict": U,
    "PredictStreaming": SS,
    "Online": U,
    "Offline": U,
    "CheckLiveness": U,
    "CheckReadiness": U,
    "ServerMetadata": U,
    "ModelMetadata": U,
}


@pytest.mark.parametrize(
    ("base", "service", "rpcs"),
    [
        (inference.GrpcInferenceServiceBase, "inference.GRPCInferenceService", V2_RPCS),
        (grps.GrpsServiceBase, "grps.protos.v1.GrpsService", GRPS_RPCS),
    ],
    ids=["v2", "grps"],
)
def test_rpc_paths_and_kinds_are_the_published_ones(base: type, service: str, rpcs: dict) -> None:
    mapping = base().__mapping__()
    assert {path: handler.cardinality for path, handler in mapping.items()} == {
        f"/{service}/{name}": kind for name, kind in rpcs.items()
    }
