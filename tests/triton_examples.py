"""Copies of Triton's example model repository (server's docs/examples/model_repository) as the tests
serve them: each config as Triton's repository has it, word for word, and each ONNX graph built here with
the onnx helper API to compute what Triton's file computes (simple_string's is the same graph: Cast to
INT32, Add and Sub, Cast back to STRING; densenet_onnx's is a stand-in of its shapes: a global average
pool and a 1x1 convolution, [1, 3, 224, 224] -> [1, 1000, 1, 1], weighting channel 0 by class index).
"""

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SIMPLE_CONFIG = """name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""
SIMPLE_STRING_CONFIG = SIMPLE_CONFIG.replace('"simple"', '"simple_string"').replace(
    "TYPE_INT32", "TYPE_STRING"
)
DENSENET_CONFIG = """name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""
DENSENET_LABELS = [f"CLASS {k} LABEL" for k in range(1000)]
CLASSES = 1000


def save(model_proto, path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model_proto)
    data = model_proto.SerializeToString()
    path.write_bytes(data)
    return data


def _model(nodes: list, inputs: list, outputs: list, initializers: list = ()) -> "onnx.ModelProto":
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime 1.17 and later read
    return model


def simple_onnx(element: int = TensorProto.INT32) -> "onnx.ModelProto":
    """`simple` (INT32) or `simple_string` (STRING, through Cast to INT32 and back, as Triton's is)."""
    shape = ["batch", 16]
    io = [("INPUT0", element, shape), ("INPUT1", element, shape)]
    outs = [("OUTPUT0", element, shape), ("OUTPUT1", element, shape)]
    if element == TensorProto.INT32:
        nodes = [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ]
        return _model(nodes, io, outs)
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["_INPUT0"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["_INPUT1"], to=TensorProto.INT32),
        helper.make_node("Add", ["_INPUT0", "_INPUT1"], ["CAST0"]),
        helper.make_node("Sub", ["_INPUT0", "_INPUT1"], ["CAST1"]),
        helper.make_node("Cast", ["CAST0"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["CAST1"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    return _model(nodes, io, outs)


def densenet_onnx() -> "onnx.ModelProto":
    """[1, 3, 224, 224] -> [1, 1000, 1, 1]: class k scores k / 1000 times the mean of channel 0."""
    weight = np.zeros((CLASSES, 3, 1, 1), np.float32)
    weight[:, 0, 0, 0] = np.arange(CLASSES, dtype=np.float32) / CLASSES
    nodes = [
        helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
        helper.make_node("Conv", ["pooled", "weight"], ["fc6_1"]),
    ]
    return _model(
        nodes,
        [("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [("fc6_1", TensorProto.FLOAT, [1, CLASSES, 1, 1])],
        [numpy_helper.from_array(weight, "weight")],
    )


def write_examples(repository: Path) -> None:
    """simple, simple_string and densenet_onnx (with its label file), as Triton's repository holds them."""
    for name, config, model in (
        ("simple", SIMPLE_CONFIG, simple_onnx()),
        ("simple_string", SIMPLE_STRING_CONFIG, simple_onnx(TensorProto.STRING)),
        ("densenet_onnx", DENSENET_CONFIG, densenet_onnx()),
    ):
        (repository / name).mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(config)
        save(model, repository / name / "1" / "model.onnx")
    (repository / "densenet_onnx" / "densenet_labels.txt").write_text("\n".join(DENSENET_LABELS) + "\n")
