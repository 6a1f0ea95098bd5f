"""What the sequence batcher writes into a request's inputs before it executes: Triton's control tensors
and the sequence's implicit state; and what it keeps of the answer (the next state).

Control inputs (`sequence_batching { control_input [...] }`), each a tensor of one element per batch
slot ([1, 1] per request with max_batch_size > 0, [1] without), filled as Triton fills them:
- CONTROL_SEQUENCE_START / _END: the request's flags, as `int32_false_true`, `fp32_false_true` or
  `bool_false_true` give the false and true values;
- CONTROL_SEQUENCE_READY: true for a request, false for an empty slot of a direct batch (a "null" row:
  the inputs of another request of the batch, every control false, CORRID 0);
- CONTROL_SEQUENCE_CORRID: the correlation ID, as UINT64, INT64 (its bits), UINT32 / INT32 (its low 32
  bits) or BYTES (a string ID).
Implicit state (`state [...]`): the state input gets the sequence's state, its `initial_state` on the
sequence's START request (zeros, a data_file, or zeros with each variable dimension 1 where none is
given); the state output of each answer is kept as the sequence's next state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tensorgate.codec.datatypes import BY_CONFIG, DataType
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.sequence import END, START
from tensorgate.codec.tensor import as_dtype

if TYPE_CHECKING:
    from tensorgate.batcher.scheduler import Job

CORRID = "CONTROL_SEQUENCE_CORRID"
_BOOLEAN_DTYPES = {"int32_false_true": np.int32, "fp32_false_true": np.float32, "bool_false_true": np.bool_}
_KIND_OF_FLAG = {"CONTROL_SEQUENCE_START": START, "CONTROL_SEQUENCE_END": END}


class _State(NamedTuple):
    input_name: str
    output_name: str
    dtype: DataType
    initial: np.ndarray  # one request's worth: the batch dimension first when the model batches


def added_inputs(config: dict) -> dict[str, str]:
    """Name -> model-config datatype of the inputs the sequence batcher adds to every request of this
    model (its control inputs and state inputs); none for a model without sequence_batching."""
    section = config.get("sequence_batching")
    if section is None:
        return {}
    added = {}
    for entry in section["control_input"]:
        for control in entry["control"]:
            if control["kind"] == CORRID:
                added[entry["name"]] = control["data_type"]
            else:
                form = next(f for f in _BOOLEAN_DTYPES if control.get(f))
                added[entry["name"]] = {"int32_false_true": "TYPE_INT32", "fp32_false_true": "TYPE_FP32"}.get(
                    form, "TYPE_BOOL"
                )
    for state in section["state"]:
        added[state["input_name"]] = state["data_type"]
    return added


def state_outputs(config: dict) -> dict[str, str]:
    """Name -> model-config datatype of the state outputs a stateful model answers besides its outputs."""
    section = config.get("sequence_batching") or {}
    return {state["output_name"]: state["data_type"] for state in section.get("state", ())}


class SequenceInputs:
    """The control tensors and implicit state of one model's sequences (its normalized config)."""

    def __init__(self, config: dict, initial_states: dict[str, np.ndarray]) -> None:
        self.model = config["name"]
        self.batched = config.get("max_batch_size", 0) > 0
        self.shape = (1, 1) if self.batched else (1,)  # one control element per request
        section = config["sequence_batching"]
        values: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}  # kind -> (name, false, true)
        self.corrid: tuple[str, DataType] | None = None
        for entry in section["control_input"]:
            for control in entry["control"]:
                if control["kind"] == CORRID:
                    self.corrid = (entry["name"], BY_CONFIG[control["data_type"]])
                    continue
                form = next(f for f in _BOOLEAN_DTYPES if control.get(f))
                false, true = (self._constant(v, _BOOLEAN_DTYPES[form]) for v in control[form])
                values[control["kind"]] = (entry["name"], false, true)
        # the controls of a request by its flags (START 1, END 2), and of an empty slot
        self._controls: list[dict[str, np.ndarray]] = []
        for flags in range(4):
            chosen = {}
            for kind, (name, false, true) in values.items():
                on = kind == "CONTROL_SEQUENCE_READY" or bool(flags & _KIND_OF_FLAG.get(kind, 0))
                chosen[name] = true if on else false
            self._controls.append(chosen)
        self._not_ready = {name: false for name, false, _ in values.values()}
        if self.corrid is not None:
            self._not_ready[self.corrid[0]] = self._corrid_array(0)
        self.states = []
        for state in section["state"]:
            initial = initial_states[state["input_name"]]
            initial = self._read_only(initial[None] if self.batched else initial)
            self.states.append(
                _State(state["input_name"], state["output_name"], BY_CONFIG[state["data_type"]], initial)
            )

    @staticmethod
    def _read_only(array: np.ndarray) -> np.ndarray:
        array.flags.writeable = False  # shared by every request that gets it: a model must not write it
        return array

    def _constant(self, value: Any, dtype: Any) -> np.ndarray:
        return self._read_only(np.full(self.shape, value, dtype=dtype))

    def corrid_error(self, sequence_id: int | str) -> InferError | None:
        """Triton's refusal of a request whose ID is not of the kind the CORRID control takes."""
        if self.corrid is None:
            return None
        name, dtype = self.corrid
        given = "BYTES" if isinstance(sequence_id, str) else "UINT64"
        if (given == "BYTES") == (dtype.v2 == "BYTES"):
            return None
        return invalid(
            f"sequence batching control '{name}' data-type is '{given}', but model '{self.model}' expects "
            f"'{dtype.v2}'"
        )

    def _corrid_array(self, sequence_id: int | str) -> np.ndarray:
        dtype = self.corrid[1]
        if dtype.v2 == "BYTES":
            array = np.empty(self.shape, dtype=object)
            array[...] = sequence_id.encode() if isinstance(sequence_id, str) else b""
            return array
        unsigned = np.dtype(f"<u{dtype.size}")  # 32-bit types: the low 32 bits, as Triton truncates
        return np.full(self.shape, sequence_id & ((1 << (8 * dtype.size)) - 1), dtype=unsigned).view(
            dtype.numpy
        )

    def fill(self, job: Job, sequence_id: int | str, state: dict[str, np.ndarray] | None) -> None:
        """Adds the controls of `job` (a request of sequence `sequence_id`, whose state is `state`: None
        before its first answer) and its input states to its inputs."""
        flags = job.request.sequence_flags
        inputs = job.inputs
        inputs.update(self._controls[flags & 3])
        if self.corrid is not None:
            inputs[self.corrid[0]] = self._corrid_array(sequence_id)
        if self.states:
            start = state is None or flags & START
            for entry in self.states:
                inputs[entry.input_name] = entry.initial if start else state[entry.input_name]

    def null_inputs(self, representative: dict[str, Any]) -> dict[str, Any]:
        """The inputs of an empty slot of a direct batch: another request's, every control false, a state
        of zeros shaped like that request's (its own state is not touched)."""
        inputs = {**representative, **self._not_ready}
        for entry in self.states:
            like = representative[entry.input_name]
            inputs[entry.input_name] = (
                np.full(like.shape, b"", dtype=object) if like.dtype == object else np.zeros_like(like)
            )
        return inputs

    def next_state(self, answer: dict[str, Any]) -> dict[str, np.ndarray] | InferError:
        """The sequence's state after this answer: its state outputs, as the state's datatype (a copy:
        the batch's outputs are not kept alive by it), or the error when the model left one out."""
        state = {}
        for entry in self.states:
            output = answer.get(entry.output_name)
            if output is None:
                return InferError(
                    ErrorKind.INTERNAL,
                    f"model '{self.model}' did not return its state output '{entry.output_name}' "
                    f"(sequence_batching state '{entry.input_name}')",
                )
            state[entry.input_name] = np.array(as_dtype(output, entry.dtype.numpy), copy=True)
        return state
