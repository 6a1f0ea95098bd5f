"""Build the example ONNX model into examples/model_repository: `onnx_mlp`.

    .venv/bin/python examples/build_onnx_models.py [--repository DIR]

The graph is written with the onnx package's helper API (no exporter, no torch): FP32 INPUT0[batch, 64]
-> Gemm 128, Relu, Gemm 128, Relu, Gemm 10 -> FP32 OUTPUT0[batch, 10], the same layers as the
TorchScript `mlp` of examples/build_torch_models.py. The weights are drawn the way that script draws
mlp's (numpy's PCG64 with the same seed, each parameter in turn uniform in +-1/sqrt(its first fan-in
dimension)), and each Gemm takes its weight as stored, [out, in], with transB=1, so onnx_mlp computes
the function mlp does, up to float rounding.

The file's bytes are the same on every run: the opset (17), IR version (8: onnxruntime 1.17 and later
read it), producer name and version are fixed, the weights are seeded, and a ModelProto with no map
fields serializes in field order. The model gets `config.pbtxt` and `1/model.onnx`, with dynamic
batching on and an instance group of KIND_AUTO.
"""

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
SEED = 20260522  # mlp's seed in build_torch_models.py: the same weights
OPSET = 17
IR_VERSION = 8  # the IR version of opset 17; onnxruntime 1.17 reads up to 9
LAYERS = ((64, 128), (128, 128), (128, 10))  # (in, out) of each Gemm; Relu between them

ONNX_MLP_CONFIG = """\
# Built by examples/build_onnx_models.py (seeded random weights, the same as mlp's).
name: "onnx_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { kind: KIND_AUTO count: 1 } ]
"""


def mlp_weights(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight [out, in], bias [out]) of each layer, drawn as build_torch_models.seeded draws mlp's."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in LAYERS:
        weight = rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), size=(fan_out, fan_in))
        bias = rng.uniform(-1 / np.sqrt(fan_out), 1 / np.sqrt(fan_out), size=(fan_out,))
        params.append((weight.astype(np.float32), bias.astype(np.float32)))
    return params


def mlp_model(seed: int = SEED) -> onnx.ModelProto:
    nodes, initializers = [], []
    x = "INPUT0"
    for i, (weight, bias) in enumerate(mlp_weights(seed)):
        last = i == len(LAYERS) - 1
        w, b, y = f"layer{i}.weight", f"layer{i}.bias", "OUTPUT0" if last else f"layer{i}.gemm"
        initializers += [numpy_helper.from_array(weight, w), numpy_helper.from_array(bias, b)]
        nodes.append(helper.make_node("Gemm", [x, w, b], [y], name=f"layer{i}.Gemm", transB=1))
        if not last:
            x = f"layer{i}.relu"
            nodes.append(helper.make_node("Relu", [y], [x], name=f"layer{i}.Relu"))
    graph = helper.make_graph(
        nodes,
        "onnx_mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", LAYERS[0][0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", LAYERS[-1][1]])],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tensorgate examples/build_onnx_models.py",
        producer_version="1",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def build(repository: Path) -> list[Path]:
    directory = repository / "onnx_mlp"
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(ONNX_MLP_CONFIG)
    (directory / "1" / "model.onnx").write_bytes(mlp_model().SerializeToString())
    return [directory / "config.pbtxt", directory / "1" / "model.onnx"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repository", type=Path, default=REPOSITORY, help="default examples/model_repository"
    )
    args = parser.parse_args()
    for path in build(args.repository):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
