"""examples/model_repository/onnx_mlp: rebuilt byte for byte by its script, the MLP it claims, its config."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import need_module

onnx = need_module("onnx", "the test extra (make test installs it)")
from onnx import TensorProto, numpy_helper  # noqa: E402

from tensorgate.server.model_config import normalize_config  # noqa: E402
from tensorgate.server.pbtxt import parse_pbtxt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "build_onnx_models.py"
MODEL_DIR = ROOT / "examples" / "model_repository" / "onnx_mlp"
MODEL = MODEL_DIR / "1" / "model.onnx"
ELEMENT_TYPES = {"TYPE_FP32": TensorProto.FLOAT}


def build_script():
    spec = importlib.util.spec_from_file_location("build_onnx_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_script_rebuilds_the_committed_bytes(tmp_path: Path) -> None:
    written = build_script().build(tmp_path)
    built = tmp_path / "onnx_mlp"
    assert written == [built / "config.pbtxt", built / "1" / "model.onnx"]
    assert (built / "1" / "model.onnx").read_bytes() == MODEL.read_bytes()
    assert (built / "config.pbtxt").read_text() == (MODEL_DIR / "config.pbtxt").read_text()


def test_committed_model_loads_in_onnxruntime_1_17_and_later() -> None:
    model = onnx.load(str(MODEL))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 9  # what onnxruntime 1.17 reads
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]


def test_committed_model_is_the_mlp() -> None:
    """onnxruntime's answer on a seeded batch is numpy's: Gemm (x @ W.T + b) with Relu between, 3 layers."""
    ort = need_module("onnxruntime", "the onnx extra: pip install -e '.[onnx]' (make test installs it)")
    graph = onnx.load(str(MODEL)).graph
    assert [n.op_type for n in graph.node] == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    x = np.random.default_rng(7).standard_normal((13, 64), dtype=np.float32)
    expected = x
    for i in range(3):
        weight, bias = weights[f"layer{i}.weight"], weights[f"layer{i}.bias"]
        assert weight.dtype == bias.dtype == np.float32
        expected = expected @ weight.T + bias
        if i < 2:
            expected = np.maximum(expected, 0)
    assert expected.shape == (13, 10)

    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    (got,) = session.run(["OUTPUT0"], {"INPUT0": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    (one,) = session.run(["OUTPUT0"], {"INPUT0": x[:1]})  # the batch dimension is free
    np.testing.assert_allclose(one, expected[:1], rtol=1e-5, atol=1e-6)


def test_graph_signature_matches_the_config() -> None:
    config = normalize_config(parse_pbtxt((MODEL_DIR / "config.pbtxt").read_text()), "onnx_mlp")
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] > 0 and "dynamic_batching" in config
    graph = onnx.load(str(MODEL)).graph

    def signature(values) -> list[tuple]:
        out = []
        for value in values:
            tensor = value.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
            assert isinstance(dims[0], str), f"{value.name}: the batch dimension must be symbolic"
            out.append((value.name, tensor.elem_type, [-1, *dims[1:]]))
        return out

    def configured(tensors: list[dict]) -> list[tuple]:
        return [(t["name"], ELEMENT_TYPES[t["data_type"]], [-1, *t["dims"]]) for t in tensors]

    assert signature(graph.input) == configured(config["input"])
    assert signature(graph.output) == configured(config["output"])
    assert not {t.name for t in graph.initializer} & {v.name for v in graph.input}


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")  # torch 2.10+
def test_weights_are_the_torchscript_mlps() -> None:
    """The build script draws mlp's weights (examples/build_torch_models.py), so both serve one function."""
    torch = need_module("torch", "the torch extra: pip install -e '.[torch]' (make test installs it)")
    state = torch.jit.load(str(MODEL_DIR.parent / "mlp" / "1" / "model.pt")).state_dict()
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(MODEL)).graph.initializer}
    assert len(weights) == len(state) == 6
    for i, layer in enumerate((0, 2, 4)):  # nn.Sequential indexes: the ReLUs sit between
        for kind in ("weight", "bias"):
            torch_weight = state[f"layers.{layer}.{kind}"].numpy()
            np.testing.assert_array_equal(weights[f"layer{i}.{kind}"], torch_weight)
