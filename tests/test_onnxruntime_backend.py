"""The onnxruntime backend end to end: ONNX graphs built here with the `onnx` package, served by a real
server from a Triton-layout repository (`platform: "onnxruntime_onnx"` and `backend: "onnxruntime"`),
answers over REST and gRPC, dynamic batching, every datatype ONNX and v2 share, and the load failures a
config that disagrees with its graph gets, each naming the tensor."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from e2e_helpers import ServerProcess, need_module, write_model
from grpc_helpers import call, tensor

import tensorgate.proto.inference as pb

onnx = need_module("onnx", "the test extra (make test installs it)")
need_module("onnxruntime", "the onnx extra: pip install -e '.[onnx]' (make test installs it)")
from onnx import TensorProto, helper  # noqa: E402

INT32 = TensorProto.INT32


def graph_file(path: Path, nodes: list, inputs: list, outputs: list) -> None:
    """An ONNX model of `nodes`, its inputs and outputs (name, element type, shape with None or a name for
    a dynamic dim), written to `path` (opset 17)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime 1.17 and later read
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def add_sub_model(repo: Path, name: str, config: str, batch: str | int = "batch") -> Path:
    """`simple`'s graph in ONNX: INPUT0 + INPUT1 and INPUT0 - INPUT1, INT32 [batch, 16]."""
    shape = [batch, 16]
    directory = write_model(repo, name, config, {})
    graph_file(
        directory / "1" / "model.onnx",
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [("INPUT0", INT32, shape), ("INPUT1", INT32, shape)],
        [("OUTPUT0", INT32, shape), ("OUTPUT1", INT32, shape)],
    )
    return directory


def add_sub_config(name: str, *, platform: str = 'platform: "onnxruntime_onnx"', extra: str = "") -> str:
    def entries(*names: str) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 16 ] }}' for n in names)

    return f"""
name: "{name}"
{platform}
max_batch_size: 8
input [ {entries("INPUT0", "INPUT1")} ]
output [ {entries("OUTPUT0", "OUTPUT1")} ]
{extra}
"""


def rest_infer(client: httpx.Client, model: str, a: np.ndarray, b: np.ndarray) -> dict:
    doc = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": list(v.shape), "data": v.ravel().tolist()}
            for n, v in (("INPUT0", a), ("INPUT1", b))
        ]
    }
    response = client.post(f"/v2/models/{model}/infer", json=doc)
    assert response.status_code == 200, response.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


def reason(client: httpx.Client, model: str) -> str:
    [entry] = [e for e in client.post("/v2/repository/index").json() if e["name"] == model]
    assert entry["state"] == "UNAVAILABLE"
    return entry["reason"]


@pytest.fixture(scope="module")
def onnx_server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("onnx") / "models"
    repo.mkdir()
    batching = "dynamic_batching { max_queue_delay_microseconds: 20000 }"
    add_sub_model(repo, "add_sub", add_sub_config("add_sub", extra=batching))
    backend = 'backend: "onnxruntime"'
    add_sub_model(repo, "add_sub_backend", add_sub_config("add_sub_backend", platform=backend))
    threads = 'parameters { key: "intra_op_thread_count" value: { string_value: "many" } }'
    bad = {
        "no_such_input": add_sub_config("no_such_input").replace('"INPUT1" data_type', '"INPUTX" data_type'),
        "wrong_type": add_sub_config("wrong_type").replace("TYPE_INT32", "TYPE_FP32", 1),
        "wrong_dims": add_sub_config("wrong_dims").replace("dims: [ 16 ]", "dims: [ 8 ]", 1),
        "bad_threads": add_sub_config("bad_threads", extra=threads),
    }
    for name, config in bad.items():
        add_sub_model(repo, name, config)
    add_sub_model(repo, "fixed_batch", add_sub_config("fixed_batch"), batch=4)
    log = repo.parent / "server.log"
    server = ServerProcess(repo, log, extra_args=("--strict-readiness", "false")).start()
    yield server
    assert server.stop() == 0


def test_serves_over_rest_with_either_platform_or_backend(onnx_server: ServerProcess) -> None:
    a, b = np.arange(32, dtype=np.int32).reshape(2, 16), np.full((2, 16), 3, dtype=np.int32)
    with httpx.Client(base_url=onnx_server.base_url, timeout=10) as client:
        for model in ("add_sub", "add_sub_backend"):
            out = rest_infer(client, model, a, b)
            np.testing.assert_array_equal(out["OUTPUT0"], a + b)
            np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        metadata = client.get("/v2/models/add_sub").json()
        assert metadata["platform"] == "onnxruntime_onnx"


def test_serves_over_grpc(onnx_server: ServerProcess) -> None:
    a, b = np.arange(16, dtype=np.int32), np.arange(16, dtype=np.int32)[::-1].copy()
    request = pb.ModelInferRequest(
        model_name="add_sub",
        inputs=[tensor("INPUT0", "INT32", [1, 16]), tensor("INPUT1", "INT32", [1, 16])],
        raw_input_contents=[a.tobytes(), b.tobytes()],
    )
    answer = call(onnx_server, lambda stub: stub.model_infer(request))
    got = [np.frombuffer(raw, dtype=np.int32) for raw in answer.raw_output_contents]
    np.testing.assert_array_equal(got[0], a + b)
    np.testing.assert_array_equal(got[1], a - b)


def test_dynamic_batching_batches_concurrent_requests(onnx_server: ServerProcess) -> None:
    rows = [np.full((1, 16), i, dtype=np.int32) for i in range(16)]
    with httpx.Client(base_url=onnx_server.base_url, timeout=30) as client:
        before = client.get("/v2/models/add_sub/stats").json()["model_stats"][0]
        with ThreadPoolExecutor(16) as pool:
            outs = list(pool.map(lambda r: rest_infer(client, "add_sub", r, r), rows))
        after = client.get("/v2/models/add_sub/stats").json()["model_stats"][0]
    for row, out in zip(rows, outs, strict=True):
        np.testing.assert_array_equal(out["OUTPUT0"], row * 2)  # each client its own row
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 16 and executions < 16, (inferences, executions)


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        ("no_such_input", "model.onnx has no input 'INPUTX' (its inputs: INPUT0, INPUT1)"),
        (
            "wrong_type",
            "input 'INPUT0' is TYPE_FP32 in the config but tensor(int32) in model.onnx (TYPE_INT32)",
        ),
        ("wrong_dims", "input 'INPUT0' has dims [8] in the config but [16] in model.onnx"),
        (
            "fixed_batch",
            "has a batch dimension fixed to 4 in model.onnx; max_batch_size > 0 needs it dynamic",
        ),
        ("bad_threads", "parameter intra_op_thread_count must be an integer, got 'many'"),
    ],
)
def test_a_config_that_disagrees_with_its_graph_fails_the_load_naming_the_tensor(
    onnx_server: ServerProcess, model: str, fragment: str
) -> None:
    with httpx.Client(base_url=onnx_server.base_url, timeout=10) as client:
        why = reason(client, model)
        assert fragment in why, why
        assert client.get(f"/v2/models/{model}/ready").status_code == 400
        assert client.get("/v2/models/add_sub/ready").status_code == 200  # the others serve


DTYPES = [  # v2 name, ONNX element type, numpy dtype, a value
    ("BOOL", TensorProto.BOOL, np.bool_, [True, False]),
    ("UINT8", TensorProto.UINT8, np.uint8, [0, 255]),
    ("INT8", TensorProto.INT8, np.int8, [-128, 127]),
    ("INT16", TensorProto.INT16, np.int16, [-7, 7]),
    ("UINT32", TensorProto.UINT32, np.uint32, [0, 2**32 - 1]),
    ("INT64", TensorProto.INT64, np.int64, [-(2**62), 2**62]),
    ("FP16", TensorProto.FLOAT16, np.float16, [0.5, -2.0]),
    ("FP64", TensorProto.DOUBLE, np.float64, [1e300, -1e-300]),
]


def test_every_shared_datatype_round_trips(start_server, repo: Path) -> None:
    """An Identity graph per datatype: what comes back is what went in, bit for bit."""
    for v2, element, _, _ in DTYPES:
        config = f"""
name: "id_{v2.lower()}"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_{v2} dims: [ 2 ] }} ]
output [ {{ name: "y" data_type: TYPE_{v2} dims: [ 2 ] }} ]
"""
        directory = write_model(repo, f"id_{v2.lower()}", config, {})
        graph_file(
            directory / "1" / "model.onnx",
            [helper.make_node("Identity", ["x"], ["y"])],
            [("x", element, [None, 2])],
            [("y", element, [None, 2])],
        )
    server = start_server(repo)
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        for v2, _, dtype, values in DTYPES:
            array = np.array([values], dtype=dtype)
            body = array.tobytes()
            given = {
                "name": "x",
                "datatype": v2,
                "shape": [1, 2],
                "parameters": {"binary_data_size": len(body)},
            }
            wanted = {"name": "y", "parameters": {"binary_data": True}}
            header = orjson.dumps({"inputs": [given], "outputs": [wanted]})
            response = client.post(
                f"/v2/models/id_{v2.lower()}/infer",
                content=header + body,
                headers={"Inference-Header-Content-Length": str(len(header))},
            )
            assert response.status_code == 200, (v2, response.text)
            length = int(response.headers["inference-header-content-length"])
            assert response.content[length:] == body, v2


def test_missing_onnxruntime_is_a_clear_load_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tensorgate.server.backends import load_backend
    from tensorgate.server.model_config import normalize_config
    from tensorgate.server.pbtxt import parse_pbtxt

    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)
    config = normalize_config(parse_pbtxt(add_sub_config("m")), "m")
    with pytest.raises(ImportError, match=r"needs onnxruntime \(pip install 'tensorgate\[onnx\]'\)"):
        load_backend(tmp_path, config, 1)


def test_a_config_without_inputs_and_outputs_is_completed_from_the_graph(start_server, repo: Path) -> None:
    """As Triton completes it: names, datatypes and dims from the graph; a dynamic first dim on every
    tensor is the batch dim (max_batch_size 4, dynamic batching); a fixed one is a plain dim."""
    add_sub_model(repo, "batched", 'name: "batched"\nbackend: "onnxruntime"\n')
    add_sub_model(repo, "fixed", 'name: "fixed"\nplatform: "onnxruntime_onnx"\n', batch=3)
    server = start_server(repo)
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        config = client.get("/v2/models/batched/config").json()
        assert config["max_batch_size"] == 4 and "dynamic_batching" in config
        assert [(e["name"], e["data_type"], e["dims"]) for e in config["input"]] == [
            ("INPUT0", "TYPE_INT32", [16]),
            ("INPUT1", "TYPE_INT32", [16]),
        ]
        assert client.get("/v2/models/batched").json()["outputs"][1] == {
            "name": "OUTPUT1",
            "datatype": "INT32",
            "shape": [-1, 16],
        }
        a, b = np.arange(32, dtype=np.int32).reshape(2, 16), np.ones((2, 16), np.int32)
        out = rest_infer(client, "batched", a, b)
        assert (out["OUTPUT0"] == a + b).all() and (out["OUTPUT1"] == a - b).all()
        fixed = client.get("/v2/models/fixed/config").json()
        assert fixed["max_batch_size"] == 0 and fixed["input"][0]["dims"] == [3, 16]
        a, b = np.arange(48, dtype=np.int32).reshape(3, 16), np.full((3, 16), 2, np.int32)
        assert (rest_infer(client, "fixed", a, b)["OUTPUT0"] == a + b).all()


def test_the_repository_extension_example_loads_as_written(start_server, repo: Path, tmp_path: Path) -> None:
    """Triton's extension_model_repository.md: a `config` in the v2 metadata form (inputs/outputs with
    datatype and shape) on the onnxruntime backend, and the model file as `file:1/model.onnx`."""
    import base64
    import json

    FP32 = TensorProto.FLOAT
    graph_file(
        tmp_path / "model.onnx",
        [helper.make_node("Add", ["INPUT0", "INPUT0"], ["OUTPUT0"])],
        [("INPUT0", FP32, [1])],
        [("OUTPUT0", FP32, [1])],
    )
    config = {
        "name": "mymodel",
        "backend": "onnxruntime",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1]}],
    }
    parameters = {
        "config": json.dumps(config),
        "file:1/model.onnx": base64.b64encode((tmp_path / "model.onnx").read_bytes()).decode(),
    }
    server = start_server(repo, extra_args=("--model-control-mode", "explicit"))
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        load = client.post("/v2/repository/models/mymodel/load", json={"parameters": parameters})
        assert load.status_code == 200, load.text
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.25]}]}
        response = client.post("/v2/models/mymodel/infer", json=body)
        assert response.json()["outputs"][0]["data"] == [2.5]
        metadata = client.get("/v2/models/mymodel").json()
        assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}]
        # the same form with a wrong datatype is refused at load, naming the tensor
        config["inputs"][0]["datatype"] = "INT8"
        parameters["config"] = json.dumps(config)
        load = client.post("/v2/repository/models/mymodel/load", json={"parameters": parameters})
        assert load.status_code == 400 and "input 'INPUT0' is TYPE_INT8 in the config" in load.json()["error"]


# ------------------------------------------------------------------------- the execution provider

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
WITH_CUDA = ["TensorrtExecutionProvider", CUDA, CPU]  # what onnxruntime-gpu offers
WITHOUT_CUDA = ["AzureExecutionProvider", CPU]  # what the CPU build offers


def normalized(groups: str) -> dict:
    from tensorgate.server.model_config import normalize_config
    from tensorgate.server.pbtxt import parse_pbtxt

    return normalize_config(parse_pbtxt(add_sub_config("m", extra=groups)), "m")


PROVIDERS = [
    # (instance_group, providers offered, providers the session is made with)
    ("", WITH_CUDA, [CPU]),  # no group: KIND_CPU
    ("instance_group [ { kind: KIND_CPU } ]", WITH_CUDA, [CPU]),
    ("instance_group [ { kind: KIND_GPU } ]", WITH_CUDA, [(CUDA, {"device_id": 0}), CPU]),
    ("instance_group [ { kind: KIND_GPU gpus: [ 1, 0 ] } ]", WITH_CUDA, [(CUDA, {"device_id": 1}), CPU]),
    ("instance_group [ { kind: KIND_AUTO } ]", WITH_CUDA, [(CUDA, {"device_id": 0}), CPU]),
    (  # the first KIND_GPU group puts it on a GPU, its first gpus the device
        "instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_GPU gpus: [ 2 ] } ]",
        WITH_CUDA,
        [(CUDA, {"device_id": 2}), CPU],
    ),
    ("instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]", WITHOUT_CUDA, [CPU]),
    ("instance_group [ { kind: KIND_AUTO } ]", WITHOUT_CUDA, [CPU]),
]


@pytest.mark.parametrize(("groups", "available", "chosen"), PROVIDERS)
def test_the_cuda_provider_is_chosen_for_a_gpu_group_when_onnxruntime_offers_it(
    groups: str, available: list[str], chosen: list, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/models/onnxruntime.md: CUDA when the instance group is KIND_GPU or KIND_AUTO and onnxruntime-gpu
    is installed (its device: the group's first `gpus`), else the CPU; KIND_GPU on the CPU then logs why."""
    from tensorgate.server.backends.onnxruntime import _providers

    config = normalized(groups)
    assert _providers(config, available) == chosen
    warned = [r.getMessage() for r in caplog.records if r.name == "tensorgate.onnxruntime"]
    if "KIND_GPU" in groups and CUDA not in available:
        assert warned == [
            f"model 'm': instance_group '{config['instance_group'][0]['name']}' asks for KIND_GPU but "
            "onnxruntime offers no CUDA execution provider (install onnxruntime-gpu); running on the CPU"
        ]
    else:
        assert warned == []


def test_the_backend_makes_its_session_with_the_providers_chosen_from_those_offered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The backend asks onnxruntime which providers it offers and makes its session with the choice: with
    CUDA offered (as onnxruntime-gpu would), a KIND_GPU model's session is asked for CUDA on its device.
    (The session itself is the CPU build's, which runs on the CPU whatever it is asked for.)"""
    import onnxruntime

    from tensorgate.server.backends import load_backend

    made: list = []
    real = onnxruntime.InferenceSession

    def session(path: str, options: object = None, providers: list | None = None, **kwargs: object) -> object:
        made.append(providers)
        return real(path, options, providers=[CPU], **kwargs)

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: WITH_CUDA)
    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    add_sub_model(tmp_path, "m", "")
    backend = load_backend(
        tmp_path / "m" / "1", normalized("instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]"), 1
    )
    assert made == [[(CUDA, {"device_id": 1}), CPU]]
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)
    outputs = backend.execute({"INPUT0": a, "INPUT1": b})
    assert outputs["OUTPUT0"].tolist() == (a + b).tolist()
