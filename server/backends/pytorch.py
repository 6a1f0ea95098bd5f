"""The pytorch backend: `<version>/model.pt` (TorchScript) or `<version>/model.pt2` (torch.export).

The module runs under `torch.inference_mode()` on the device its instance_group says: that of the
staging built for it (`staging`, from batcher.staging.make_staging), which the server stages its batches
with. Inputs reach `forward` as Triton's pytorch backend passes them:

- by the names of forward's arguments, when every config input is one of them;
- else by Triton's `<name>__<index>` convention (`INPUT__0`, `INPUT__1`, ...) when every input follows it;
- else positionally, in the config's order.

What forward returns becomes the outputs: a dict by name; a tuple or list in the config's output order
(or by `__<index>`); a single tensor as the one output. The staging hands the backend torch tensors and
takes the output tensors back to the host; numpy inputs are accepted too (staged here).

CPU threads: torch's intra-op thread pool spins between parallel regions, and on a small machine those
spinning threads starve the event loop (measured: batched MLP requests 10x slower at concurrency 8 on
2 cores). The pool is therefore 1 thread unless the config's parameter `INTRA_OP_THREAD_COUNT` (Triton's
name) asks for more; it is set in the thread that executes.
"""

import inspect
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tensorgate.batcher.staging import import_torch, make_staging
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.backends.base import Backend

MODEL_FILES = ("model.pt", "model.pt2")
_INDEXED = re.compile(r".*__(\d+)")


class PyTorchBackend(Backend):
    is_async = False
    in_thread = True  # execute blocks for the whole forward pass: the batcher runs it in a worker thread

    def __init__(self, version_dir: Path, config: dict, version: int) -> None:
        try:
            torch = import_torch()
        except ImportError as e:
            raise ImportError(f"the pytorch backend needs torch: {e}") from None
        self.torch = torch
        self.name: str = config["name"]
        if "sequence_batching" in config:
            raise ValueError(
                "the pytorch backend does not take sequence_batching: its forward() gets the config's inputs "
                "only, not the control and state inputs (serve a stateful model with onnxruntime or python)"
            )
        self.intra_op_threads = _intra_op_threads(config)
        self.staging = make_staging(config)  # the server stages this model's batches with it
        self.device = torch.device(self.staging.device)
        for entry in (*config["input"], *config["output"]):
            if entry["data_type"] == "TYPE_STRING":
                raise ValueError(f"the pytorch backend does not support BYTES tensors ('{entry['name']}')")
        path = _model_path(version_dir, config)
        if path.suffix == ".pt2":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(torch.export.load(str(path)), self.device)
            self.module = program.module()  # an exported graph is already in eval form
            params = list(inspect.signature(self.module.forward).parameters)
        else:
            self.module = torch.jit.load(str(path), map_location=self.device)
            self.module.eval()
            params = [a.name for a in self.module.forward.schema.arguments[1:]]  # [0] is self
        # the batch inputs (ragged batching) are inputs too, as in Triton's pytorch backend
        targets = [t for entry in config.get("batch_input") or () for t in entry["target_name"]]
        self.arguments = _argument_order([e["name"] for e in config["input"]] + targets, params, path)
        self.output_names = _indexed_order([e["name"] for e in config["output"]])

    def execute(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if getattr(_worker, "threads", None) != self.intra_op_threads:
            self.torch.set_num_threads(self.intra_op_threads)
            _worker.threads = self.intra_op_threads
        args = [None if name is None else self._tensor(name, inputs.get(name)) for name in self.arguments]
        with self.torch.inference_mode():
            result = self.module(*args)
        return self._outputs(result)

    def close(self) -> None:
        self.module = None

    def _tensor(self, name: str, value: Any) -> Any:
        """The tensor for one input: staged already, or numpy from a direct caller, staged here."""
        return self.staging.gather(name, [value]) if isinstance(value, np.ndarray) else value

    def _outputs(self, result: Any) -> dict[str, Any]:
        names = self.output_names
        if isinstance(result, dict):
            missing = [n for n in names if n not in result]
            if missing:
                got = ", ".join(map(str, result)) or "nothing"
                raise self._error(f"returned a dict without output(s) {', '.join(missing)} (it has: {got})")
            outputs = {n: result[n] for n in names}
        else:
            if isinstance(result, self.torch.Tensor):
                result = (result,)
            if not isinstance(result, (tuple, list)):
                raise self._error(f"returned {type(result).__name__}; expected tensors")
            if len(result) != len(names):
                listed = f"{len(names)} ({', '.join(names)})"
                raise self._error(f"returned {len(result)} output(s) where its config lists {listed}")
            outputs = dict(zip(names, result, strict=True))
        for name, value in outputs.items():
            if not isinstance(value, self.torch.Tensor):
                raise self._error(f"returned {type(value).__name__} for output '{name}'; expected a tensor")
        return outputs

    def _error(self, problem: str) -> InferError:
        return InferError(ErrorKind.INTERNAL, f"model '{self.name}' {problem}")


def _model_path(version_dir: Path, config: dict) -> Path:
    named = config.get("default_model_filename")
    for file in (named,) if named else MODEL_FILES:
        if (version_dir / file).is_file():
            return version_dir / file
    wanted = named or " or ".join(MODEL_FILES)
    raise FileNotFoundError(f"no {wanted} in {version_dir}")


def _indexed_order(names: list[str]) -> list[str]:
    """`names` ordered by their `__<index>` suffixes when those number them 0..n-1, else as given."""
    found = [_INDEXED.fullmatch(n) for n in names]
    if all(found):
        indices = [int(m.group(1)) for m in found if m]
        if sorted(indices) == list(range(len(names))):
            return [name for _, name in sorted(zip(indices, names, strict=True))]
    return names


def _argument_order(inputs: list[str], params: list[str], path: Path) -> list[str | None]:
    """The config input passed as each positional argument of forward (None: not given)."""
    if set(inputs) <= set(params):
        used = [p if p in inputs else None for p in params]
        while used and used[-1] is None:  # trailing arguments keep their defaults
            used.pop()
        return used
    if len(inputs) > len(params):
        raise ValueError(
            f"{path.name}: forward takes {len(params)} input(s) ({', '.join(params)}) "
            f"but the config lists {len(inputs)}"
        )
    return list(_indexed_order(inputs))


def _intra_op_threads(config: dict) -> int:
    raw = config.get("parameters", {}).get("INTRA_OP_THREAD_COUNT", {}).get("string_value", "1")
    try:
        wanted = int(raw)
    except ValueError:
        raise ValueError(f"parameter INTRA_OP_THREAD_COUNT must be an integer, got {raw!r}") from None
    if wanted < 1:
        raise ValueError(f"parameter INTRA_OP_THREAD_COUNT must be at least 1, got {wanted}")
    return wanted


_worker = threading.local()  # the intra-op thread count is a per-thread (OpenMP) setting
