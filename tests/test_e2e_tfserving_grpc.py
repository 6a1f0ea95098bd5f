"""TF Serving's gRPC API end to end: PredictionService and ModelService on the gRPC port (and over HTTP/2 on
the HTTP port), driven with grpcio through the stubs a `tensorflow-serving-api` client imports
(`tensorflow_serving.apis.*_pb2(_grpc)`, `tensorflow.core.framework.tensor_pb2`), generated here at test time
from our wire-identical protos in proto/.

`tensor()` builds TensorProtos as `tf.make_tensor_proto` does for a numpy array (stated here, since the
test cannot install TensorFlow): the dtype, the shape as dims, and the elements' little-endian bytes in
`tensor_content`, or each element in `string_val` for strings.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import numpy as np
import pytest
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, stop_all, write_model
from grpc_helpers import answer, message, messages_of, open_call, status_of
from h2_wire import H2Wire
from test_e2e_tfserving import build_repository

PROTO = ROOT / "proto"
MODULES = {
    "predict": "tensorflow_serving.apis.predict_pb2",
    "service": "tensorflow_serving.apis.prediction_service_pb2_grpc",
    "models": "tensorflow_serving.apis.model_service_pb2_grpc",
    "metadata": "tensorflow_serving.apis.get_model_metadata_pb2",
    "status": "tensorflow_serving.apis.get_model_status_pb2",
    "classification": "tensorflow_serving.apis.classification_pb2",
    "regression": "tensorflow_serving.apis.regression_pb2",
    "inference": "tensorflow_serving.apis.inference_pb2",
    "management": "tensorflow_serving.apis.model_management_pb2",
    "tensor": "tensorflow.core.framework.tensor_pb2",
    "types": "tensorflow.core.framework.types_pb2",
}
TF_DTYPES = {  # numpy dtype -> TensorFlow DataType name
    "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int32": "DT_INT32", "uint8": "DT_UINT8",
    "int16": "DT_INT16", "int8": "DT_INT8", "int64": "DT_INT64", "bool": "DT_BOOL",
    "uint16": "DT_UINT16", "float16": "DT_HALF", "uint32": "DT_UINT32", "uint64": "DT_UINT64",
}  # fmt: skip


@pytest.fixture(scope="module")
def apis(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("tfs_stubs")
    sources = sorted(str(p.relative_to(PROTO)) for p in PROTO.glob("tensorflow*/**/*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}", f"--python_out={out}",
         f"--grpc_python_out={out}", *sources],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    sys.path.insert(0, str(out))
    return SimpleNamespace(**{key: importlib.import_module(name) for key, name in MODULES.items()})


def tensor(apis: SimpleNamespace, array: np.ndarray):
    """A TensorProto of `array`, as tf.make_tensor_proto writes one."""
    proto = apis.tensor.TensorProto()
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if array.dtype.kind in "OSU":
        proto.dtype = apis.types.DT_STRING
        proto.string_val.extend(e if isinstance(e, bytes) else str(e).encode() for e in array.reshape(-1))
    else:
        proto.dtype = apis.types.DataType.Value(TF_DTYPES[array.dtype.name])
        proto.tensor_content = array.astype(array.dtype.newbyteorder("<")).tobytes()
    return proto


def array(apis: SimpleNamespace, proto) -> np.ndarray:
    """What an answer's TensorProto holds (numbers in tensor_content, strings in string_val)."""
    shape = [dim.size for dim in proto.tensor_shape.dim]
    if proto.dtype == apis.types.DT_STRING:
        return np.array(list(proto.string_val), dtype=object).reshape(shape)
    name = apis.types.DataType.Name(proto.dtype)
    dtype = next(np.dtype(d) for d, tf_name in TF_DTYPES.items() if tf_name == name)
    return np.frombuffer(proto.tensor_content, dtype.newbyteorder("<")).reshape(shape)


def predict_request(apis: SimpleNamespace, model: str, inputs: dict, **spec):
    request = apis.predict.PredictRequest()
    request.model_spec.name = model
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(value if not isinstance(value, np.ndarray) else tensor(apis, value))
    return request


# ------------------------------------------------------------------------------------------ servers

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
SLOW_MODEL = """
import time


class Model:
    def execute(self, inputs):
        time.sleep(float(inputs["x"].reshape(-1)[0]))
        return {"y": inputs["x"]}
"""
# one identity model per datatype: what every TensorFlow dtype the REST API serves does through gRPC
DTYPES = ["FP32", "FP64", "INT32", "UINT8", "INT16", "INT8", "INT64", "BOOL", "UINT16", "FP16", "UINT32",
          "UINT64", "BF16", "STRING"]  # fmt: skip
IDENTITY = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"]}
"""
GROW = """
import numpy as np


class Model:
    def execute(self, inputs):
        return {"y": np.tile(inputs["x"], 2)}  # twice the input's size
"""


def identity_config(datatype: str) -> str:
    return f"""
name: "id_{datatype.lower()}"
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_{datatype} dims: [ -1, -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_{datatype} dims: [ -1, -1 ] }} ]
"""


LIMIT = 1 << 20  # the servers' --grpc-max-message-bytes


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    base = tmp_path_factory.mktemp("tfs_grpc")
    repo = build_repository(base / "models")
    write_model(repo, "slow", SLOW_CONFIG, {1: SLOW_MODEL})
    write_model(repo, "grow", identity_config("FP32").replace("id_fp32", "grow"), {1: GROW})
    for datatype in DTYPES:
        write_model(repo, f"id_{datatype.lower()}", identity_config(datatype), {1: IDENTITY})
    limit = ("--grpc-max-message-bytes", str(LIMIT))
    examples = ServerProcess(EXAMPLES, base / "examples.log").start()
    tf = ServerProcess(repo, base / "tf.log", extra_args=limit).start()
    yield SimpleNamespace(examples=examples, tf=tf)
    stop_all([examples, tf])


@pytest.fixture(scope="module")
def stub(apis: SimpleNamespace, servers: SimpleNamespace) -> Iterator:
    with grpc.insecure_channel(f"127.0.0.1:{servers.examples.grpc_port}") as channel:
        yield apis.service.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def tf_stub(apis: SimpleNamespace, servers: SimpleNamespace) -> Iterator:
    with grpc.insecure_channel(f"127.0.0.1:{servers.tf.grpc_port}") as channel:
        yield SimpleNamespace(
            predict=apis.service.PredictionServiceStub(channel), models=apis.models.ModelServiceStub(channel)
        )


def refused(call, code: grpc.StatusCode, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == code, caught.value.details()
    assert fragment in caught.value.details(), caught.value.details()


# ------------------------------------------------------------------------------------------ Predict


def test_predict_half_plus_two(apis, stub) -> None:
    x = np.array([1.0, 2.0, 5.0], dtype=np.float32)
    answer = stub.Predict(predict_request(apis, "half_plus_two", {"x": x}), timeout=30)
    y = answer.outputs["y"]
    assert y.dtype == apis.types.DT_FLOAT and y.tensor_content  # numbers in tensor_content, as TF Serving
    assert array(apis, y).tolist() == [2.5, 3.0, 4.5]
    spec = answer.model_spec
    assert (spec.name, spec.version.value, spec.signature_name) == ("half_plus_two", 1, "serving_default")


def test_typed_values_scalars_and_short_lists_as_tensorflow_reads_them(apis, stub) -> None:
    x = apis.tensor.TensorProto(dtype=apis.types.DT_FLOAT, float_val=[1.0, 3.0])
    x.tensor_shape.dim.add(size=4)  # two values for four elements: the last one repeats
    answer = stub.Predict(predict_request(apis, "half_plus_two", {"x": x}), timeout=30)
    assert array(apis, answer.outputs["y"]).tolist() == [2.5, 3.5, 3.5, 3.5]
    empty = apis.tensor.TensorProto(dtype=apis.types.DT_FLOAT)
    empty.tensor_shape.dim.add(size=2)  # no values: zeros
    answer = stub.Predict(predict_request(apis, "half_plus_two", {"x": empty}), timeout=30)
    assert array(apis, answer.outputs["y"]).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("datatype", DTYPES)
def test_every_dtype_both_ways(apis, tf_stub, datatype: str) -> None:
    rng = np.random.default_rng(7)
    if datatype == "STRING":
        x = np.array([[b"a", b"\x00\xff"], [b"", "é".encode()]], dtype=object)
    elif datatype == "BOOL":
        x = np.array([[True, False], [False, True]])
    elif datatype == "BF16":
        x = np.array([[0x3F80, 0xC000], [0x0000, 0x7F80]], dtype=np.uint16)  # 1, -2, 0, inf
    elif datatype.startswith("FP"):
        x = rng.standard_normal((2, 2)).astype(
            {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
        )
    else:
        x = rng.integers(0, 100, (2, 2)).astype(datatype.lower())
    proto = tensor(apis, x)
    if datatype == "BF16":
        proto.dtype = apis.types.DT_BFLOAT16
    model = f"id_{datatype.lower()}"
    answer = tf_stub.predict.Predict(predict_request(apis, model, {"x": proto}), timeout=30)
    y = answer.outputs["y"]
    assert y.dtype == proto.dtype
    if datatype == "BF16":
        assert np.frombuffer(y.tensor_content, "<u2").reshape(2, 2).tolist() == x.tolist()
    else:
        assert array(apis, y).tolist() == x.tolist()
    # the same tensor in its typed field
    typed = apis.tensor.TensorProto(dtype=proto.dtype, tensor_shape=proto.tensor_shape)
    flat = x.reshape(-1)
    field = {"FP32": "float_val", "FP64": "double_val", "INT64": "int64_val", "BOOL": "bool_val",
             "STRING": "string_val", "UINT32": "uint32_val",
             "UINT64": "uint64_val"}.get(datatype)  # fmt: skip
    if datatype in ("FP16", "BF16"):
        typed.half_val.extend(flat.view(np.uint16).tolist())
    else:
        getattr(typed, field or "int_val").extend(flat.tolist())
    answer = tf_stub.predict.Predict(predict_request(apis, model, {"x": typed}), timeout=30)
    assert (
        answer.outputs["y"].tensor_content == y.tensor_content
        and answer.outputs["y"].string_val == y.string_val
    )


def test_versions_labels_signatures_and_output_filter(apis, tf_stub) -> None:
    feat = np.array([[1.0, 2.0]], dtype=np.float32)
    for spec, total in (({}, 5.0), ({"version": 1}, 4.0), ({"version_label": "canary"}, 5.0)):
        answer = tf_stub.predict.Predict(
            predict_request(apis, "classifier", {"feat": feat}, **spec), timeout=30
        )
        assert array(apis, answer.outputs["scores"]).tolist() == [[1.0, 2.0, total]]
        assert answer.model_spec.version.value == (spec.get("version") or 2)
    only = predict_request(apis, "classifier", {"feat": feat}, signature_name="scores_only")
    answer = tf_stub.predict.Predict(only, timeout=30)
    assert list(answer.outputs) == ["scores"] and answer.model_spec.signature_name == "scores_only"
    filtered = predict_request(apis, "classifier", {"feat": feat})
    filtered.output_filter.append("classes")
    answer = tf_stub.predict.Predict(filtered, timeout=30)
    assert list(answer.outputs) == ["classes"]
    assert array(apis, answer.outputs["classes"]).tolist() == [[b"red", b"green", b"blue"]]


def bad_inputs(apis: SimpleNamespace) -> list:
    wrong_dtype = tensor(apis, np.array([1], dtype=np.int32))
    short = apis.tensor.TensorProto(dtype=apis.types.DT_FLOAT, tensor_content=b"\x00" * 6)
    short.tensor_shape.dim.add(size=2)
    too_many = apis.tensor.TensorProto(dtype=apis.types.DT_FLOAT, float_val=[1.0, 2.0, 3.0])
    too_many.tensor_shape.dim.add(size=2)
    unknown_rank = apis.tensor.TensorProto(dtype=apis.types.DT_FLOAT)
    unknown_rank.tensor_shape.unknown_rank = True
    return [
        ({"x": wrong_dtype}, {}, "Expects arg[0] to be DT_FLOAT but DT_INT32 is provided"),
        ({"x": short}, {}, "tensor parsing error: x (tensor_content holds 6 bytes"),
        ({"x": too_many}, {}, "tensor parsing error: x (it has 3 values"),
        ({"x": unknown_rank}, {}, "tensor parsing error: x (its shape has an unknown rank)"),
        ({"x": np.zeros((2, 3), np.float32)}, {}, "has shape [2, 3], the model expects [-1]"),
        ({"z": np.zeros(2, np.float32)}, {}, "names unknown input(s) 'z'"),
        ({}, {}, "lacks the input(s) 'x'"),
        (
            {"x": np.zeros(1, np.float32)},
            {"signature_name": "nope"},
            'Serving signature name: "nope" not found',
        ),
        (
            {"x": np.zeros(1, np.float32)},
            {"version_label": "nope"},
            "Unrecognized servable version label: nope",
        ),
    ]


def test_bad_requests_are_invalid_argument_and_the_server_serves_on(apis, stub) -> None:
    for inputs, spec, fragment in bad_inputs(apis):
        call = predict_request(apis, "half_plus_two", inputs, **spec)
        refused(lambda call=call: stub.Predict(call, timeout=30), grpc.StatusCode.INVALID_ARGUMENT, fragment)
    filtered = predict_request(apis, "half_plus_two", {"x": np.zeros(1, np.float32)})
    filtered.output_filter.append("nope")
    refused(lambda: stub.Predict(filtered, timeout=30), grpc.StatusCode.INVALID_ARGUMENT,
            "output tensor alias not found in signature: nope")  # fmt: skip
    unknown = predict_request(apis, "no_such_model", {"x": np.zeros(1, np.float32)})
    refused(lambda: stub.Predict(unknown, timeout=30), grpc.StatusCode.NOT_FOUND, "no_such_model")
    test_predict_half_plus_two(apis, stub)


def test_malformed_bytes_are_invalid_argument(servers, stub, apis) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{servers.examples.grpc_port}") as channel:
        raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        for garbage in (b"\x12\x05\x0a\x01", b"\xff\xff\xff", b"\x0a\x10" + b"x" * 3):
            refused(lambda garbage=garbage: raw(garbage, timeout=30), grpc.StatusCode.INVALID_ARGUMENT, "")
    test_predict_half_plus_two(apis, stub)


def test_malformed_tensor_protos_in_raw_frames(apis, servers) -> None:
    """A PredictRequest written byte by byte into HTTP/2 frames: TensorProtos that no client library would
    write (a truncated dim, a packed float_val of 7 bytes, a dtype of 999) each end their call
    INVALID_ARGUMENT, on the same connection, which then answers a good request."""

    def predict(proto: bytes) -> bytes:
        entry = b"\x0a\x01x" + b"\x12" + bytes([len(proto)]) + proto  # the inputs map's entry for alias "x"
        return b"\x0a\x0f\x0a\x0dhalf_plus_two" + b"\x12" + bytes([len(entry)]) + entry

    truncated_dim = b"\x08\x01\x12\x04\x12\x05\x08\x03"  # DT_FLOAT, a Dim said 5 bytes long, 2 there
    short_floats = b"\x08\x01\x12\x04\x12\x02\x08\x02\x2a\x07" + bytes(7)  # float_val packed: 7 bytes
    unknown_dtype = b"\x08\xe7\x07\x12\x04\x12\x02\x08\x01"  # DataType 999
    good = tensor(apis, np.array([1.0], dtype=np.float32)).SerializeToString()
    with H2Wire(("127.0.0.1", servers.examples.grpc_port)) as h2:
        h2.open()
        for stream, proto in zip((1, 3, 5), (truncated_dim, short_floats, unknown_dtype), strict=True):
            open_call(h2, stream, "/tensorflow.serving.PredictionService/Predict", message(predict(proto)))
            blocks, _ = answer(h2, stream)
            assert status_of(blocks)[0] == 3, status_of(blocks)  # INVALID_ARGUMENT
        open_call(h2, 7, "/tensorflow.serving.PredictionService/Predict", message(predict(good)))
        blocks, data = answer(h2, 7)
        assert status_of(blocks) == (0, "")
        [(_, body)] = messages_of(data)
        assert array(apis, apis.predict.PredictResponse.FromString(body).outputs["y"]).tolist() == [2.5]


def test_an_answer_up_to_the_message_limit(apis, tf_stub) -> None:
    """`grow` answers twice what it is sent: an answer of the limit less ~100 bytes is sent whole; one
    over the limit is refused, from a request well under it."""
    fits = np.ones((1, (LIMIT - 128) // 8), dtype=np.float32)
    answer = tf_stub.predict.Predict(predict_request(apis, "grow", {"x": fits}), timeout=60)
    assert answer.ByteSize() > LIMIT - 256
    assert array(apis, answer.outputs["y"]).shape == (1, 2 * fits.size) and answer.outputs["y"].tensor_content
    over = np.ones((1, LIMIT // 8 + 16), dtype=np.float32)
    refused(lambda: tf_stub.predict.Predict(predict_request(apis, "grow", {"x": over}), timeout=60),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "response message of")  # fmt: skip
    too_big = np.ones((1, LIMIT // 4 + 16), dtype=np.float32)
    refused(lambda: tf_stub.predict.Predict(predict_request(apis, "grow", {"x": too_big}), timeout=60),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "--grpc-max-message-bytes")  # fmt: skip


def test_deadline_and_cancellation(apis, tf_stub, servers) -> None:
    slow = predict_request(apis, "slow", {"x": np.array([[1.5]], dtype=np.float32)})
    refused(lambda: tf_stub.predict.Predict(slow, timeout=0.3), grpc.StatusCode.DEADLINE_EXCEEDED, "")
    future = tf_stub.predict.Predict.future(slow, timeout=30)
    time.sleep(0.2)  # the call is on its way; cancelling it must leave the server serving
    assert future.cancel()
    quick = predict_request(apis, "slow", {"x": np.array([[0.0]], dtype=np.float32)})
    assert array(apis, tf_stub.predict.Predict(quick, timeout=30).outputs["y"]).tolist() == [[0.0]]


def test_predict_on_the_http_port_too(apis, servers) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{servers.examples.port}") as channel:
        stub = apis.service.PredictionServiceStub(channel)
        test_predict_half_plus_two(apis, stub)
    rest = httpx.post(
        f"{servers.examples.base_url}/v1/models/half_plus_two:predict", json={"instances": [1.0]}
    )
    assert rest.json() == {"predictions": [2.5]}


def successes(server: ServerProcess) -> int:
    stats = httpx.get(f"{server.base_url}/v2/models/half_plus_two/stats", timeout=10).json()
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


def test_many_threads_at_once_batched_and_counted(apis, stub, servers) -> None:
    """32 threads at once through the dynamic batcher: each gets its own answer, and the model's
    statistics count each request, as for every other protocol."""
    before = successes(servers.examples)
    answers: list = []

    def one(i: int) -> None:
        request = predict_request(apis, "half_plus_two", {"x": np.array([float(i)], dtype=np.float32)})
        answers.append((i, array(apis, stub.Predict(request, timeout=30).outputs["y"]).tolist()))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == [(i, [0.5 * i + 2]) for i in range(32)]
    assert successes(servers.examples) - before == 32


# ------------------------------------------------------------------------------------------ examples


def examples_input(apis: SimpleNamespace, message, rows: list[dict]) -> None:
    for row in rows:
        example = message.input.example_list.examples.add()
        for name, values in row.items():
            example.features.feature[name].float_list.value.extend(values)


def test_classify_regress_and_multi_inference(apis, stub, tf_stub) -> None:
    classify = apis.classification.ClassificationRequest()
    classify.model_spec.name = "classifier"
    examples_input(apis, classify, [{"feat": [1.0, 2.0]}, {"feat": [0.5, 0.5]}])
    answer = tf_stub.predict.Classify(classify, timeout=30)
    got = [[(c.label, c.score) for c in row.classes] for row in answer.result.classifications]
    assert got == [
        [("red", 1.0), ("green", 2.0), ("blue", 5.0)],
        [("red", 0.5), ("green", 0.5), ("blue", 3.0)],
    ]
    assert answer.model_spec.version.value == 2

    regress = apis.regression.RegressionRequest()
    regress.model_spec.name = "half_plus_two"
    examples_input(apis, regress, [{"x": [3.0]}, {"x": [-4.0]}])
    assert [r.value for r in stub.Regress(regress, timeout=30).result.regressions] == [3.5, 0.0]

    multi = apis.inference.MultiInferenceRequest()
    for method, signature in (("tensorflow/serving/regress", ""), ("tensorflow/serving/classify", "other")):
        task = multi.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = (
            "half_plus_two",
            signature,
            method,
        )
    examples_input(apis, multi, [{"x": [3.0]}])
    refused(lambda: stub.MultiInference(multi, timeout=30), grpc.StatusCode.INVALID_ARGUMENT,
            'Serving signature name: "other" not found')  # fmt: skip
    multi.tasks[1].model_spec.signature_name = "tensorflow/serving/classify"
    results = stub.MultiInference(multi, timeout=30).results
    assert results[0].regression_result.regressions[0].value == 3.5
    assert results[1].classification_result.classifications[0].classes[0].score == 3.5


# ------------------------------------------------------------------------------------------ metadata, status


def test_get_model_metadata(apis, stub, tf_stub) -> None:
    request = apis.metadata.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "classifier"
    answer = tf_stub.predict.GetModelMetadata(request, timeout=30)
    defs = apis.metadata.SignatureDefMap()
    assert answer.metadata["signature_def"].Unpack(defs)
    assert set(defs.signature_def) == {"serving_default", "scores_only"}
    default = defs.signature_def["serving_default"]
    assert default.method_name == "tensorflow/serving/predict"
    assert default.inputs["feat"].dtype == apis.types.DT_FLOAT
    assert [d.size for d in default.inputs["feat"].tensor_shape.dim] == [-1, 2]
    assert set(default.outputs) == {"scores", "classes"} and set(
        defs.signature_def["scores_only"].outputs
    ) == {"scores"}
    refused(lambda: stub.GetModelMetadata(apis.metadata.GetModelMetadataRequest(), timeout=30),
            grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")  # fmt: skip
    request.metadata_field[:] = ["other"]
    refused(lambda: tf_stub.predict.GetModelMetadata(request, timeout=30), grpc.StatusCode.INVALID_ARGUMENT,
            "Metadata field other is not supported")  # fmt: skip


def test_get_model_status(apis, tf_stub) -> None:
    request = apis.status.GetModelStatusRequest()
    request.model_spec.name = "classifier"
    answer = tf_stub.models.GetModelStatus(request, timeout=30)
    states = [
        (s.version, apis.status.ModelVersionStatus.State.Name(s.state)) for s in answer.model_version_status
    ]
    assert states == [(2, "AVAILABLE"), (1, "AVAILABLE")]
    request.model_spec.version.value = 1
    assert [s.version for s in tf_stub.models.GetModelStatus(request, timeout=30).model_version_status] == [1]
    broken = apis.status.GetModelStatusRequest()
    broken.model_spec.name = "broken"
    (status,) = tf_stub.models.GetModelStatus(broken, timeout=30).model_version_status
    assert (
        apis.status.ModelVersionStatus.State.Name(status.state) == "END"
        and "no such thing" in status.status.error_message
    )
    missing = apis.status.GetModelStatusRequest()
    missing.model_spec.name = "no_such_model"
    refused(
        lambda: tf_stub.models.GetModelStatus(missing, timeout=30), grpc.StatusCode.NOT_FOUND, "no_such_model"
    )


def test_reload_config_loads_and_unloads_in_explicit_mode(apis, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    for name in ("first", "second"):
        write_model(repo, name, identity_config("FP32").replace("id_fp32", name), {1: IDENTITY})
    explicit = ("--model-control-mode", "explicit", "--load-model", "first")
    server = ServerProcess(repo, tmp_path / "server.log", extra_args=explicit).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            models = apis.models.ModelServiceStub(channel)
            request = apis.management.ReloadConfigRequest()
            entry = request.config.model_config_list.config.add()
            entry.name, entry.base_path, entry.model_platform = "second", "/models/second", "tensorflow"
            assert models.HandleReloadConfigRequest(request, timeout=60).status.error_code == 0

            def state(name: str) -> str:
                status = apis.status.GetModelStatusRequest()
                status.model_spec.name = name
                (found,) = models.GetModelStatus(status, timeout=30).model_version_status
                return apis.status.ModelVersionStatus.State.Name(found.state)

            assert (state("first"), state("second")) == ("END", "AVAILABLE")
            entry.name = "absent"
            reload = lambda: models.HandleReloadConfigRequest(request, timeout=60)  # noqa: E731
            refused(reload, grpc.StatusCode.INVALID_ARGUMENT, "absent")
            assert state("second") == "AVAILABLE"
    finally:
        stop_all([server])


def test_reload_config_outside_explicit_mode_is_refused(apis, servers) -> None:
    request = apis.management.ReloadConfigRequest()
    request.config.model_config_list.config.add(name="half_plus_two")
    with grpc.insecure_channel(f"127.0.0.1:{servers.examples.grpc_port}") as channel:
        models = apis.models.ModelServiceStub(channel)
        refused(lambda: models.HandleReloadConfigRequest(request, timeout=30), grpc.StatusCode.UNAVAILABLE,
                "not allowed in model control mode 'none'")  # fmt: skip


# ------------------------------------------------------------------------------------ reflection, health


def test_reflection_and_health_know_the_services(servers) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{servers.examples.grpc_port}") as channel:
        listing = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
        )
        names = {s.name for s in next(listing).list_services_response.service}
        assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"} <= names
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
