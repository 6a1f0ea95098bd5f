"""The pytorch backend on TorchScript and torch.export models built here: how config names reach forward,
how what forward returns becomes the outputs, and the load errors a user would meet."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgate.batcher.staging import make_staging
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.backends import load_backend
from tensorgate.server.model_config import load_model_config

torch = pytest.importorskip("torch")
from torch import Tensor, nn  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")  # torch 2.10+


def tensor_spec(name: str, dims: str = "[ 3 ]", dtype: str = "TYPE_FP32", extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: {dims} {extra} }}'


def write(
    root: Path,
    module: nn.Module | None,
    inputs: list[str],
    outputs: list[str],
    *,
    example: tuple | None = None,
    header: str = 'backend: "pytorch"',
    name: str = "m",
) -> tuple[Path, dict]:
    """`<root>/<name>/config.pbtxt` and `1/model.pt` (TorchScript), or `1/model.pt2` when `example` inputs
    are given (torch.export, batch dimension dynamic). Returns the version folder and the config."""
    directory = root / name
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(
        f'name: "{name}"\n{header}\nmax_batch_size: 8\n'
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n"
    )
    if module is not None and example is None:
        torch.jit.save(torch.jit.script(module.eval()), str(directory / "1" / "model.pt"))
    elif module is not None:
        batch = torch.export.Dim("batch", min=1, max=8)
        shapes = tuple({0: batch} for _ in example)
        program = torch.export.export(module.eval(), example, dynamic_shapes=shapes)
        torch.export.save(program, str(directory / "1" / "model.pt2"))
    return directory / "1", load_model_config(directory)


def run(version_dir: Path, config: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request through the staging and the backend, as the batcher runs it."""
    backend = load_backend(version_dir, config, 1)
    staging = make_staging(config)
    batch = {name: staging.gather(name, [array]) for name, array in inputs.items()}
    return staging.to_host(backend.execute(batch))


def floats(*shape: int, start: float = 0) -> np.ndarray:
    return np.arange(start, start + np.prod(shape), dtype=np.float32).reshape(shape)


class SubMul(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return a - b, a * b


def test_inputs_by_forward_argument_names_whatever_the_config_order(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, SubMul(), [tensor_spec("b"), tensor_spec("a")], [tensor_spec("diff"), tensor_spec("prod")]
    )
    a, b = floats(2, 3, start=10), floats(2, 3)
    out = run(version_dir, config, {"b": b, "a": a})
    np.testing.assert_array_equal(out["diff"], a - b)
    np.testing.assert_array_equal(out["prod"], a * b)


def test_inputs_positionally_in_config_order_when_names_differ(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path,
        SubMul(),
        [tensor_spec("FIRST"), tensor_spec("SECOND")],
        [tensor_spec("OUT_A"), tensor_spec("OUT_B")],
    )
    first, second = floats(1, 3, start=5), floats(1, 3)
    out = run(version_dir, config, {"SECOND": second, "FIRST": first})
    np.testing.assert_array_equal(out["OUT_A"], first - second)
    np.testing.assert_array_equal(out["OUT_B"], first * second)


def test_tritons_index_naming_convention_orders_inputs_and_outputs(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path,
        SubMul(),
        [tensor_spec("INPUT__1"), tensor_spec("INPUT__0")],
        [tensor_spec("OUTPUT__1"), tensor_spec("OUTPUT__0")],
    )
    x0, x1 = floats(2, 3, start=100), floats(2, 3)
    out = run(version_dir, config, {"INPUT__0": x0, "INPUT__1": x1})
    np.testing.assert_array_equal(out["OUTPUT__0"], x0 - x1)
    np.testing.assert_array_equal(out["OUTPUT__1"], x0 * x1)


class Stats(nn.Module):
    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"total": x.sum(dim=1, keepdim=True), "peak": x.amax(dim=1, keepdim=True)}


def test_dict_outputs_by_name(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, Stats(), [tensor_spec("x")], [tensor_spec("peak", "[ 1 ]"), tensor_spec("total", "[ 1 ]")]
    )
    x = floats(3, 3)
    out = run(version_dir, config, {"x": x})
    np.testing.assert_array_equal(out["total"], x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(out["peak"], x.max(axis=1, keepdims=True))


def test_dict_output_missing_a_configured_name_is_a_clear_error(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, Stats(), [tensor_spec("x")], [tensor_spec("total", "[ 1 ]"), tensor_spec("mean", "[ 1 ]")]
    )
    with pytest.raises(InferError) as caught:
        run(version_dir, config, {"x": floats(1, 3)})
    assert caught.value.kind is ErrorKind.INTERNAL
    assert caught.value.message == "model 'm' returned a dict without output(s) mean (it has: total, peak)"


class Double(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * 2


def test_single_tensor_to_the_single_output_under_inference_mode(tmp_path: Path) -> None:
    version_dir, config = write(tmp_path, Double(), [tensor_spec("INPUT0")], [tensor_spec("OUTPUT0")])
    backend = load_backend(version_dir, config, 1)
    assert (backend.is_async, backend.in_thread) == (False, True)
    produced = backend.execute({"INPUT0": torch.ones(2, 3, requires_grad=True)})
    assert produced["OUTPUT0"].is_inference() and not produced["OUTPUT0"].requires_grad
    assert torch.equal(produced["OUTPUT0"], torch.full((2, 3), 2.0))


def test_numpy_inputs_are_accepted_without_a_staging(tmp_path: Path) -> None:
    version_dir, config = write(tmp_path, Double(), [tensor_spec("INPUT0")], [tensor_spec("OUTPUT0")])
    backend = load_backend(version_dir, config, 1)
    body = floats(2, 3).tobytes()
    read_only = np.frombuffer(body, dtype=np.float32).reshape(2, 3)
    produced = backend.execute({"INPUT0": read_only})
    np.testing.assert_array_equal(produced["OUTPUT0"].numpy(), floats(2, 3) * 2)


def test_wrong_number_of_outputs_is_a_clear_error(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path,
        Double(),
        [tensor_spec("INPUT0")],
        [tensor_spec("OUTPUT0"), tensor_spec("OUTPUT1")],
    )
    with pytest.raises(InferError) as caught:
        run(version_dir, config, {"INPUT0": floats(1, 3)})
    assert caught.value.kind is ErrorKind.INTERNAL
    assert (
        caught.value.message == "model 'm' returned 1 output(s) where its config lists 2 (OUTPUT0, OUTPUT1)"
    )


class Shapes(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, list[int]]:
        return x, x.shape


def test_an_output_that_is_not_a_tensor_is_a_clear_error(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, Shapes(), [tensor_spec("x")], [tensor_spec("y"), tensor_spec("shape", "[ 1 ]")]
    )
    with pytest.raises(InferError, match="model 'm' returned list for output 'shape'; expected a tensor"):
        run(version_dir, config, {"x": floats(1, 3)})


class WithBias(nn.Module):
    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        return x if bias is None else x + bias


def test_an_optional_input_left_out_keeps_forwards_default(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path,
        WithBias(),
        [tensor_spec("x"), tensor_spec("bias", extra="optional: true")],
        [tensor_spec("y")],
    )
    x = floats(2, 3)
    np.testing.assert_array_equal(run(version_dir, config, {"x": x})["y"], x)
    np.testing.assert_array_equal(run(version_dir, config, {"x": x, "bias": x})["y"], x * 2)


def test_torch_export_program(tmp_path: Path) -> None:
    example = (torch.ones(2, 3), torch.zeros(2, 3))
    version_dir, config = write(
        tmp_path,
        SubMul(),
        [tensor_spec("b"), tensor_spec("a")],
        [tensor_spec("diff"), tensor_spec("prod")],
        example=example,
        header='platform: "pytorch_libtorch"',
    )
    assert sorted(p.name for p in version_dir.iterdir()) == ["model.pt2"]
    for rows in (1, 5):  # the batch dimension was exported dynamic
        a, b = floats(rows, 3, start=3), floats(rows, 3)
        out = run(version_dir, config, {"a": a, "b": b})
        np.testing.assert_array_equal(out["diff"], a - b)
        np.testing.assert_array_equal(out["prod"], a * b)


def test_missing_model_file(tmp_path: Path) -> None:
    version_dir, config = write(tmp_path, None, [tensor_spec("x")], [tensor_spec("y")])
    with pytest.raises(FileNotFoundError, match=r"no model\.pt or model\.pt2 in .*m/1"):
        load_backend(version_dir, config, 1)


def test_default_model_filename(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, None, [tensor_spec("x")], [tensor_spec("y")], header='backend: "pytorch"'
    )
    config["default_model_filename"] = "doubler.pt"
    with pytest.raises(FileNotFoundError, match=r"no doubler\.pt in"):
        load_backend(version_dir, config, 1)
    torch.jit.save(torch.jit.script(Double()), str(version_dir / "doubler.pt"))
    np.testing.assert_array_equal(run(version_dir, config, {"x": floats(1, 3)})["y"], floats(1, 3) * 2)


def test_a_file_that_is_not_torchscript_fails_to_load(tmp_path: Path) -> None:
    version_dir, config = write(tmp_path, None, [tensor_spec("x")], [tensor_spec("y")])
    (version_dir / "model.pt").write_bytes(b"not a zip archive")
    with pytest.raises(RuntimeError, match="not a ZIP archive"):
        load_backend(version_dir, config, 1)


def test_more_config_inputs_than_forward_takes(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, Double(), [tensor_spec("P"), tensor_spec("Q")], [tensor_spec("y")], name="two"
    )
    with pytest.raises(
        ValueError, match=r"model\.pt: forward takes 1 input\(s\) \(x\) but the config lists 2"
    ):
        load_backend(version_dir, config, 1)


def test_bytes_tensors_are_refused_at_load(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path, Double(), [tensor_spec("x", dtype="TYPE_STRING")], [tensor_spec("y")], name="strings"
    )
    with pytest.raises(ValueError, match="the pytorch backend does not support BYTES tensors \\('x'\\)"):
        load_backend(version_dir, config, 1)


def test_torch_missing_is_a_clear_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version_dir, config = write(tmp_path, Double(), [tensor_spec("x")], [tensor_spec("y")])
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets where it is not installed
    with pytest.raises(ImportError) as caught:
        load_backend(version_dir, config, 1)
    assert str(caught.value) == (
        "the pytorch backend needs torch: torch is not installed (pip install 'tensorgate[torch]')"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_kind_gpu_without_cuda_runs_on_the_cpu(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path,
        Double(),
        [tensor_spec("x")],
        [tensor_spec("y")],
        header='backend: "pytorch"\ninstance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]',
    )
    backend = load_backend(version_dir, config, 1)
    assert backend.device.type == "cpu"
    np.testing.assert_array_equal(run(version_dir, config, {"x": floats(2, 3)})["y"], floats(2, 3) * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_kind_gpu_runs_on_cuda(tmp_path: Path) -> None:
    version_dir, config = write(
        tmp_path,
        SubMul(),
        [tensor_spec("a"), tensor_spec("b")],
        [tensor_spec("diff"), tensor_spec("prod")],
        header='backend: "pytorch"\ninstance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]',
    )
    backend = load_backend(version_dir, config, 1)
    assert backend.device == torch.device("cuda:0")
    staging = make_staging(config)
    a, b = floats(4, 3, start=1), floats(4, 3)
    produced = backend.execute({"a": staging.gather("a", [a]), "b": staging.gather("b", [b])})
    assert produced["diff"].device.type == "cuda"
    out = staging.to_host(produced)
    np.testing.assert_array_equal(out["diff"], a - b)
    np.testing.assert_array_equal(out["prod"], a * b)


def test_intra_op_threads_are_one_per_worker_unless_the_config_asks(tmp_path: Path) -> None:
    """torch's spinning intra-op pool starves the event loop on small machines: 1 thread by default, set
    in the thread that executes; INTRA_OP_THREAD_COUNT (Triton's parameter) asks for more."""
    import threading

    seen: dict[str, int] = {}
    for name, parameter, expected in (("default", "", 1), ("two", "2", 2)):
        extra = f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "{parameter}" }} }}'
        version_dir, config = write(tmp_path, Double(), [tensor_spec("x")], [tensor_spec("y")], name=name)
        if parameter:
            (version_dir.parent / "config.pbtxt").write_text(
                (version_dir.parent / "config.pbtxt").read_text() + extra
            )
            config = load_model_config(version_dir.parent)

        def worker(config: dict = config, version_dir: Path = version_dir, name: str = name) -> None:
            run(version_dir, config, {"x": floats(1, 3)})
            seen[name] = torch.get_num_threads()

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert seen[name] == expected


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_intra_op_thread_count_fails_the_load(tmp_path: Path, value: str) -> None:
    version_dir, _ = write(tmp_path, Double(), [tensor_spec("x")], [tensor_spec("y")])
    config_path = version_dir.parent / "config.pbtxt"
    config_path.write_text(
        config_path.read_text()
        + f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "{value}" }} }}'
    )
    with pytest.raises(ValueError, match="INTRA_OP_THREAD_COUNT"):
        load_backend(version_dir, load_model_config(version_dir.parent), 1)
