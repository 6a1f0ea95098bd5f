"""The stateful ONNX examples (examples/build_sequence_models.py): rebuilt byte for byte by their script,
and computing what they claim per batch row. (The twins were checked against Triton's own files with
`--compare-with`: the closing note of issue 28 says how.)"""

import importlib.util
from pathlib import Path

import numpy as np
from e2e_helpers import need_module

need_module("onnx", "the test extra (make test installs it)")
ort = need_module("onnxruntime", "the onnx extra: pip install -e '.[onnx]' (make test installs it)")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "build_sequence_models.py"
REPOSITORY = ROOT / "examples" / "model_repository"
NAMES = ("simple_sequence", "simple_dyna_sequence", "sequence_accumulator")


def build_script():
    spec = importlib.util.spec_from_file_location("build_sequence_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_script_rebuilds_the_committed_files(tmp_path: Path) -> None:
    written = build_script().build(tmp_path)
    assert written == [tmp_path / n / f for n in NAMES for f in ("config.pbtxt", "1/model.onnx")]
    for path in written:
        assert path.read_bytes() == (REPOSITORY / path.relative_to(tmp_path)).read_bytes(), path


def run(name: str, feed: dict) -> np.ndarray:
    session = ort.InferenceSession(
        str(REPOSITORY / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


def test_each_graph_computes_its_function() -> None:
    rng = np.random.default_rng(28)
    rows = (8, 1)
    value = rng.integers(-1000, 1000, rows, dtype=np.int32)
    start, end, ready = (rng.integers(0, 2, rows, dtype=np.int32) for _ in range(3))
    corrid = rng.integers(0, 1 << 40, rows, dtype=np.uint64)
    (got,) = run("simple_sequence", {"INPUT": value, "START": start, "READY": ready})
    np.testing.assert_array_equal(got, ready * (value + start))
    feed = {"INPUT": value, "START": start, "END": end, "READY": ready, "CORRID": corrid}
    (got,) = run("simple_dyna_sequence", feed)
    np.testing.assert_array_equal(got, ready * (value + start + end * corrid.astype(np.int32)))
    state = rng.integers(-1000, 1000, rows, dtype=np.int32)
    output, output_state = run("sequence_accumulator", {"INPUT": value, "INPUT_STATE": state})
    np.testing.assert_array_equal(output, state + value)
    np.testing.assert_array_equal(output_state, state + value)
    assert output.dtype == np.int32
