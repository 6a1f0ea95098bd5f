"""The onnxruntime backend: `<version>/model.onnx` (or `default_model_filename`) through ONNX Runtime.

`platform: "onnxruntime_onnx"` or `backend: "onnxruntime"`, as in Triton. The batcher hands it numpy
batches (host staging) and runs it in worker threads, one per instance; ONNX Runtime copies to the
device itself when it runs on CUDA.

- Execution provider: CUDA (device: the instance_group's first `gpus`, else 0) when the model's group is
  KIND_GPU or KIND_AUTO and onnxruntime-gpu offers it; else the CPU (with a warning when KIND_GPU asked
  for a GPU).
- Threads: the config parameters `intra_op_thread_count` and `inter_op_thread_count` (Triton's
  onnxruntime backend names them so). Unlike Triton, intra-op defaults to 1 thread, not ONNX Runtime's
  one-per-core: its spinning threads starve the event loop on a small machine, as torch's do (see the
  pytorch backend); ask for more where cores are to spare.
- The config is checked against the graph at load: every config input and output must be one of the
  graph's, of the same datatype, with dims the graph accepts (a symbolic graph dim accepts any); with
  max_batch_size > 0 the graph's first dim is the batch dim and must not be fixed to another size. A
  mismatch fails the load with a message naming the tensor.
- A config that leaves out its inputs and outputs has them completed from the graph (`complete`).
"""

import logging
from pathlib import Path
from typing import Any

import numpy as np

from tensorgate.batcher.sequence_inputs import added_inputs, state_outputs
from tensorgate.batcher.staging import HostStaging, gpu_group
from tensorgate.codec.datatypes import BY_CONFIG, BY_ONNX
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.backends import backend_setting
from tensorgate.server.backends.base import Backend

log = logging.getLogger("tensorgate.onnxruntime")

MODEL_FILE = "model.onnx"


class OnnxRuntimeBackend(Backend):
    is_async = False
    in_thread = True  # session.run blocks for the whole graph: the batcher runs it in a worker thread

    def __init__(self, version_dir: Path, config: dict, version: int) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(
                "the onnxruntime backend needs onnxruntime (pip install 'tensorgate[onnx]')"
            ) from None
        self.name: str = config["name"]
        self.staging = HostStaging()  # numpy in and out; onnxruntime stages onto a GPU itself
        path = version_dir / (config.get("default_model_filename") or MODEL_FILE)
        if not path.is_file():
            raise FileNotFoundError(f"no {path.name} in {version_dir}")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = _thread_count(config, "intra_op_thread_count", 1)
        options.inter_op_num_threads = _thread_count(config, "inter_op_thread_count", 0)
        self.session = onnxruntime.InferenceSession(
            str(path), options, providers=_providers(config, onnxruntime.get_available_providers())
        )
        graph_inputs = {arg.name: arg for arg in self.session.get_inputs()}
        graph_outputs = {arg.name: arg for arg in self.session.get_outputs()}
        batched = config.get("max_batch_size", 0) > 0
        for entry in config["input"]:
            if batched and entry.get("allow_ragged_batch"):  # the batch gives it 1-D, the requests in a row
                ragged = {"name": entry["name"], "data_type": entry["data_type"], "dims": [-1]}
                _check_tensor("input", ragged, graph_inputs, False, path.name, "allow_ragged_batch")
            else:
                _check_tensor("input", entry, graph_inputs, batched, path.name)
        for entry in config.get("batch_input") or ():
            for target in entry["target_name"]:
                made = {"name": target, "data_type": entry["data_type"], "dims": []}
                _check_tensor("input", made, graph_inputs, False, path.name, "batch_input", rank=False)
        for entry in config["output"]:
            _check_tensor("output", entry, graph_outputs, batched, path.name)
        # what the sequence batcher feeds (control and state inputs) and reads back (state outputs)
        states = state_outputs(config)
        for kind, graph, tensors in (
            ("input", graph_inputs, added_inputs(config)),
            ("output", graph_outputs, states),
        ):
            for name, data_type in tensors.items():
                entry = {"name": name, "data_type": data_type, "dims": []}
                _check_tensor(kind, entry, graph, batched, path.name, "sequence_batching", rank=False)
        self.output_names = [e["name"] for e in config["output"]]
        self.output_names += [name for name in states if name not in self.output_names]

    def execute(self, inputs: dict[str, Any]) -> dict[str, Any]:
        feed = {
            name: _strings(name, array) if array.dtype == object else np.ascontiguousarray(array)
            for name, array in inputs.items()
        }
        try:
            results = self.session.run(self.output_names, feed)
        except Exception as e:  # onnxruntime's own errors: a bad shape or value for this graph
            raise InferError(ErrorKind.INTERNAL, f"model '{self.name}': onnxruntime: {e}") from None
        return dict(zip(self.output_names, results, strict=True))

    def close(self) -> None:
        self.session = None


def _strings(name: str, array: np.ndarray) -> np.ndarray:
    """A BYTES input as ONNX Runtime takes a string tensor: `str` elements (given `bytes`, its Cast and
    string ops fail, e.g. "stoll"). ORT strings are UTF-8; other bytes are refused naming the input."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    try:
        for i, element in enumerate(array.reshape(-1)):
            flat[i] = element.decode("utf-8") if isinstance(element, bytes) else str(element)
    except UnicodeDecodeError:
        raise InferError(
            ErrorKind.INVALID_ARGUMENT,
            f"input '{name}' holds bytes that are not UTF-8: onnxruntime takes BYTES tensors as strings",
        ) from None
    return out


def _providers(config: dict, available: list[str]) -> list:
    """CUDA first when the instance group puts the model on a GPU and onnxruntime offers CUDA."""
    group = gpu_group(config.get("instance_group") or [])
    if group is None:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in available:
        device = (group.get("gpus") or [0])[0]
        return [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
    if group.get("kind") == "KIND_GPU":
        log.warning(
            "model '%s': instance_group '%s' asks for KIND_GPU but onnxruntime offers no CUDA execution "
            "provider (install onnxruntime-gpu); running on the CPU",
            config["name"],
            group.get("name", ""),
        )
    return ["CPUExecutionProvider"]


DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=default-max-batch-size, 4 unless set


def complete(version_dir: Path, config: dict) -> dict:
    """The config with its inputs and outputs, left out, read from the graph, as Triton completes an
    ONNX model's config without strict checking: names, datatypes and dims; when every graph tensor's
    first dim is dynamic and the config sets no max_batch_size, that dim is the batch dim, with
    max_batch_size 4 (--backend-config default-max-batch-size) and dynamic batching (Triton's defaults)."""
    import onnxruntime

    path = version_dir / (config.get("default_model_filename") or MODEL_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in {version_dir}: nothing to complete the config from")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph = {"input": session.get_inputs(), "output": session.get_outputs()}
    config = dict(config)
    if config.get("max_batch_size", 0) == 0 and not config["input"] and not config["output"]:
        args = [*graph["input"], *graph["output"]]
        if args and all(
            arg.shape and not isinstance(arg.shape[0], int) or arg.shape[:1] == [-1] for arg in args
        ):
            size = int(backend_setting("onnxruntime", "default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE)))
            if size > 0:
                config["max_batch_size"] = size
            if size > 1:  # Triton's: a batch of one gains nothing from the dynamic batcher
                config.setdefault("dynamic_batching", {})
    batched = config.get("max_batch_size", 0) > 0
    fed = set(added_inputs(config)) | set(state_outputs(config))  # the sequence batcher's, not clients'
    fed |= {t for entry in config.get("batch_input") or () for t in entry.get("target_name", ())}
    for kind, args in graph.items():
        if config[kind]:
            continue
        entries = []
        for arg in args:
            if arg.name in fed:
                continue
            dtype = BY_ONNX.get(arg.type)
            if dtype is None:
                raise ValueError(
                    f"{kind} '{arg.name}' of {path.name} is {arg.type}, which no datatype carries"
                )
            dims = [d if isinstance(d, int) and d > 0 else -1 for d in arg.shape]
            entries.append(
                {"name": arg.name, "data_type": dtype.config, "dims": dims[1:] if batched else dims}
            )
        config[kind] = entries
    return config


def _check_tensor(
    kind: str, entry: dict, graph: dict, batched: bool, file: str, where: str = "", rank: bool = True
) -> None:
    """Raises ValueError naming the tensor (and the config section naming it, `where`) when the config's
    entry is not what the graph has; `rank` False checks only the name, datatype and batch dimension."""
    name = entry["name"]
    arg = graph.get(name)
    section = f"{where} " if where else ""
    if arg is None:
        named = f", which the config's {where} names" if where else ""
        raise ValueError(f"{file} has no {kind} '{name}' (its {kind}s: {', '.join(graph) or 'none'}){named}")
    want = BY_CONFIG[entry["data_type"]]
    have = BY_ONNX.get(arg.type)
    if have is not want:
        raise ValueError(
            f"{section}{kind} '{name}' is {want.config} in the config but {arg.type} in {file}"
            + ("" if have is None else f" ({have.config})")
        )
    dims = list(entry.get("reshape", {}).get("shape") or entry["dims"])
    graph_dims = list(arg.shape)
    if batched:
        if not graph_dims:
            raise ValueError(f"{kind} '{name}' has no batch dimension in {file} but max_batch_size > 0")
        first, graph_dims = graph_dims[0], graph_dims[1:]
        if isinstance(first, int) and first not in (-1, 1):
            raise ValueError(
                f"{kind} '{name}' has a batch dimension fixed to {first} in {file}; max_batch_size > 0 "
                "needs it dynamic"
            )
    if not rank:
        return
    fits = len(dims) == len(graph_dims) and all(
        not isinstance(g, int) or g < 0 or d == -1 or d == g for d, g in zip(dims, graph_dims, strict=True)
    )
    if not fits:
        shape = ["?" if not isinstance(g, int) or g < 0 else g for g in graph_dims]
        raise ValueError(f"{kind} '{name}' has dims {dims} in the config but {shape} in {file}")


def _thread_count(config: dict, key: str, default: int) -> int:
    raw = config.get("parameters", {}).get(key, {}).get("string_value")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"parameter {key} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"parameter {key} must be at least 0 (0: onnxruntime's default), got {value}")
    return value
