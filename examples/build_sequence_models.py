"""Build the stateful ONNX examples into examples/model_repository.

    .venv/bin/python examples/build_sequence_models.py [--repository DIR] [--compare-with TRITON_REPO]

- `simple_sequence` and `simple_dyna_sequence`: twins of the two sequence models of Triton's example
  repository (github.com/triton-inference-server/server, docs/examples/model_repository), with the same
  configs and the same functions of their inputs, per batch row:
      simple_sequence       OUTPUT = READY * (INPUT + START)                        (direct strategy)
      simple_dyna_sequence  OUTPUT = READY * (INPUT + START + END * int32(CORRID))  (oldest strategy)
  Like Triton's, they keep no state: they show what the sequence batcher feeds a model. `--compare-with`
  takes a checkout of Triton's example repository and checks the twins against its files: the configs
  parse to the same normalized config, and onnxruntime answers the same on the same random batches.
- `sequence_accumulator`: implicit state (`sequence_batching { state [...] }`): OUTPUT = OUTPUT_STATE =
  INPUT_STATE + INPUT, the state starting at zero (initial_state zero_data), so each answer is the running
  total of the sequence's inputs; oldest strategy.

The graphs are written with the onnx helper API, as examples/build_onnx_models.py writes onnx_mlp, with a
fixed opset (17), IR version (8) and producer: the bytes are the same on every run.
"""

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
OPSET = 17
IR_VERSION = 8

HEADER = "# Built by examples/build_sequence_models.py: {what}\n"
TWIN = "the ONNX twin of Triton's docs/examples/model_repository/{name}, same config."

SIMPLE_SEQUENCE_CONFIG = """\
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ]
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

SIMPLE_DYNA_SEQUENCE_CONFIG = """\
name: "simple_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "END"
      control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters [ { key: "execute_delay_ms" value: { string_value: "3" } } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

SEQUENCE_ACCUMULATOR_CONFIG = """\
name: "sequence_accumulator"
platform: "onnxruntime_onnx"
max_batch_size: 64
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 256 max_queue_delay_microseconds: 1000 }
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _int32(name: str, elem: int = TensorProto.INT32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, ["batch", 1])


def _model(name: str, nodes: list, inputs: list, outputs: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tensorgate examples/build_sequence_models.py",
        producer_version="1",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def simple_sequence() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["started"]),
        helper.make_node("Mul", ["READY", "started"], ["OUTPUT"]),
    ]
    inputs = [_int32("INPUT"), _int32("START"), _int32("READY")]
    return _model("simple_sequence", nodes, inputs, [_int32("OUTPUT")])


def simple_dyna_sequence() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
        helper.make_node("Mul", ["END", "corrid"], ["ended"]),
        helper.make_node("Add", ["INPUT", "START"], ["started"]),
        helper.make_node("Add", ["started", "ended"], ["total"]),
        helper.make_node("Mul", ["READY", "total"], ["OUTPUT"]),
    ]
    inputs = [
        _int32("INPUT"),
        _int32("START"),
        _int32("END"),
        _int32("READY"),
        _int32("CORRID", TensorProto.UINT64),
    ]
    return _model("simple_dyna_sequence", nodes, inputs, [_int32("OUTPUT")])


def sequence_accumulator() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["INPUT_STATE", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
    ]
    inputs = [_int32("INPUT"), _int32("INPUT_STATE")]
    return _model("sequence_accumulator", nodes, inputs, [_int32("OUTPUT"), _int32("OUTPUT_STATE")])


MODELS = {
    "simple_sequence": (simple_sequence, SIMPLE_SEQUENCE_CONFIG, TWIN.format(name="simple_sequence")),
    "simple_dyna_sequence": (
        simple_dyna_sequence,
        SIMPLE_DYNA_SEQUENCE_CONFIG,
        TWIN.format(name="simple_dyna_sequence") + " Triton's own parameter execute_delay_ms is for its\n"
        "# custom backend; onnxruntime ignores it.",
    ),
    "sequence_accumulator": (
        sequence_accumulator,
        SEQUENCE_ACCUMULATOR_CONFIG,
        "implicit state: each answer is the running total of its sequence's INPUTs.",
    ),
}


def build(repository: Path) -> list[Path]:
    written = []
    for name, (graph, config, what) in MODELS.items():
        directory = repository / name
        (directory / "1").mkdir(parents=True, exist_ok=True)
        (directory / "config.pbtxt").write_text(HEADER.format(what=what) + config)
        (directory / "1" / "model.onnx").write_bytes(graph().SerializeToString())
        written += [directory / "config.pbtxt", directory / "1" / "model.onnx"]
    return written


def compare(ours: Path, triton: Path) -> list[str]:
    """The differences between our twins and Triton's files (none: an empty list)."""
    import onnxruntime

    from tensorgate.server.model_config import load_model_config

    problems = []
    rng = np.random.default_rng(28)
    for name in ("simple_sequence", "simple_dyna_sequence"):
        if load_model_config(ours / name) != load_model_config(triton / name):
            problems.append(f"{name}: the configs differ")
        sessions = [
            onnxruntime.InferenceSession(
                str(root / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
            )
            for root in (ours, triton)
        ]
        for batch in (1, 3, 8):
            feed = {}
            for arg in sessions[1].get_inputs():
                if arg.name == "CORRID":
                    feed[arg.name] = rng.integers(0, 1 << 40, (batch, 1), dtype=np.uint64)
                elif arg.name == "INPUT":
                    feed[arg.name] = rng.integers(-1000, 1000, (batch, 1), dtype=np.int32)
                else:
                    feed[arg.name] = rng.integers(0, 2, (batch, 1), dtype=np.int32)
            got, want = (session.run(["OUTPUT"], feed)[0] for session in sessions)
            if got.dtype != want.dtype or not np.array_equal(got, want):
                problems.append(
                    f"{name}: a batch of {batch} answers {got.ravel()} where Triton's {want.ravel()}"
                )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repository", type=Path, default=REPOSITORY, help="default examples/model_repository"
    )
    parser.add_argument("--compare-with", type=Path, help="a copy of Triton's docs/examples/model_repository")
    args = parser.parse_args()
    for path in build(args.repository):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    if args.compare_with is not None:
        problems = compare(args.repository, args.compare_with)
        print(
            "\n".join(problems) or f"simple_sequence, simple_dyna_sequence: the same as {args.compare_with}'s"
        )
        raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
