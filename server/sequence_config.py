"""`sequence_batching` (model_config.proto's ModelSequenceBatching) validated as Triton validates it, with
Triton's texts, and its defaults filled; the initial states of implicit state read from the model folder.

The normalized section, what batcher/sequence*.py read:
- `max_sequence_idle_microseconds` (0 -> Triton's default, 1000000);
- `control_input`: each `{name, control: [{kind, int32_false_true | fp32_false_true | bool_false_true
  | data_type}]}`, the kind as its enum name;
- `state`: each `{input_name, output_name, data_type, dims, initial_state: [at most one]}`;
- `direct` or `oldest` (neither: direct, Triton's default), `oldest.preferred_batch_size` defaulting to
  [max_batch_size] and `oldest.max_candidate_sequences` to max(1, max_batch_size) per instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tensorgate.codec.bytes_tensor import decode_bytes
from tensorgate.codec.datatypes import BY_CONFIG

IDLE_DEFAULT_US = 1_000_000  # Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS
KINDS = (
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_CORRID",
)
BOOLEAN_FORMS = ("int32_false_true", "fp32_false_true", "bool_false_true")
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
INITIAL_STATE_FOLDER = "initial_state"


class SequenceConfigError(ValueError):
    """A `sequence_batching` section Triton would refuse; the message names the field."""


def _require(ok: object, message: str) -> None:
    if not ok:
        raise SequenceConfigError(message)


def _int(message: dict, field: str, what: str, default: int = 0) -> int:
    value = message.get(field, default)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    _require(ok, f"{what} {field} must be an integer >= 0, got {value!r}")
    return value


def normalize(section: Any, config: dict) -> dict:
    """The `sequence_batching` of `config` (normalized but for this section) checked, defaults filled."""
    model = config["name"]
    max_batch_size = config.get("max_batch_size", 0)
    _require(isinstance(section, dict), "sequence_batching must be a message")
    _require(
        "dynamic_batching" not in config,
        "dynamic_batching and sequence_batching cannot both be set (model_config.proto's scheduling_choice "
        "is a oneof)",
    )
    _require(
        "ensemble_scheduling" not in config and config.get("platform") != "ensemble",
        "an ensemble cannot have sequence_batching (model_config.proto's scheduling_choice is a oneof)",
    )
    _require(not section.get("iterative_sequence"), "sequence_batching iterative_sequence is not supported")
    decoupled = (config.get("model_transaction_policy") or {}).get("decoupled")
    _require(not decoupled, "sequence_batching is not supported for decoupled models")
    _require(
        not ("direct" in section and "oldest" in section),
        "sequence_batching sets both 'direct' and 'oldest': the strategy is one of them",
    )
    out = dict(section)
    idle = _int(section, "max_sequence_idle_microseconds", "sequence_batching")
    out["max_sequence_idle_microseconds"] = idle or IDLE_DEFAULT_US
    out["control_input"] = _controls(section.get("control_input", []), model)
    out["state"] = _states(section.get("state", []), max_batch_size)
    if "oldest" in section:
        out["oldest"] = _oldest(section["oldest"], model, max_batch_size)
    else:
        out["direct"] = _direct(section.get("direct") or {}, model)
    return out


def _controls(entries: Any, model: str) -> list[dict]:
    _require(isinstance(entries, list), "sequence_batching control_input must be a list")
    seen_tensors: set[str] = set()
    seen_kinds: set[str] = set()
    out = []
    for entry in entries:
        _require(isinstance(entry, dict), "sequence_batching control_input entries must be messages")
        name = entry.get("name")
        _require(
            name and isinstance(name, str), f"sequence batching control tensor must have a name for {model}"
        )
        controls = entry.get("control", [])
        _require(
            name not in seen_tensors and len(controls) <= 1,
            f"sequence batching control tensor '{name}' is specified for multiple control kinds for {model}",
        )
        seen_tensors.add(name)
        filled = []
        for control in controls:
            _require(
                isinstance(control, dict),
                f"sequence_batching control_input '{name}' control must be a message",
            )
            kind = control.get("kind", KINDS[0])
            if isinstance(kind, int) and not isinstance(kind, bool) and 0 <= kind < len(KINDS):
                kind = KINDS[kind]  # protobuf JSON may give enums as numbers
            _require(kind in KINDS, f"sequence_batching control_input '{name}' has unknown kind {kind!r}")
            _require(
                kind not in seen_kinds, f"sequence batching specifies multiple {kind} tensors for {model}"
            )
            seen_kinds.add(kind)
            filled.append(_control(control, kind, model))
        out.append({**entry, "control": filled})
    return out


def _control(control: dict, kind: str, model: str) -> dict:
    given = [form for form in BOOLEAN_FORMS if control.get(form)]
    if kind == "CONTROL_SEQUENCE_CORRID":
        _require(
            not given,
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind} for {model}",
        )
        data_type = control.get("data_type", "TYPE_INVALID")
        _require(
            data_type in CORRID_TYPES,
            f"unexpected data type for control {kind} for {model}. Allowed data types are TYPE_UINT64, "
            "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        )
        return {**control, "kind": kind}
    _require(
        given,
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
        f"for {kind} for {model}",
    )
    _require(
        len(given) == 1,
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
        f"'bool_false_true' for {kind} for {model}",
    )
    form = given[0]
    values = control[form]
    _require(
        isinstance(values, list) and len(values) == 2,
        f"sequence batching control '{form}' must have exactly 2 entries for {kind} for {model}",
    )
    wanted = {"int32_false_true": int, "fp32_false_true": (int, float), "bool_false_true": (bool, int)}[form]
    ok = all(isinstance(v, wanted) for v in values) and (form == "bool_false_true" or not any(
        isinstance(v, bool) for v in values
    ))  # fmt: skip
    _require(ok, f"sequence_batching control {kind} '{form}' must hold two numbers, got {values!r}")
    return {**control, "kind": kind}


def _dims(value: Any, what: str) -> list[int]:
    ok = isinstance(value, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and (d == -1 or d >= 1) for d in value
    )
    _require(ok, f"{what} must be a list of integers >= 1 or -1 (variable size), got {value!r}")
    return value


def _states(entries: Any, max_batch_size: int) -> list[dict]:
    _require(isinstance(entries, list), "sequence_batching state must be a list")
    out, inputs = [], set()
    for entry in entries:
        _require(isinstance(entry, dict), "sequence_batching state entries must be messages")
        name, output = entry.get("input_name"), entry.get("output_name")
        _require(name and isinstance(name, str), "sequence_batching state must specify 'input_name'")
        _require(
            output and isinstance(output, str), f"sequence_batching state '{name}' must specify 'output_name'"
        )
        _require(name not in inputs, f"State input name '{name}' specified more than once.")
        inputs.add(name)
        data_type = entry.get("data_type")
        _require(
            data_type in BY_CONFIG, f"sequence_batching state '{name}' has unknown data_type {data_type!r}"
        )
        dims = _dims(entry.get("dims", []), f"sequence_batching state '{name}' dims")
        initial = entry.get("initial_state", [])
        _require(
            isinstance(initial, list) and len(initial) <= 1,
            f"initial_state field for state input '{name}' must contain exactly one or zero element. "
            f"Found '{len(initial) if isinstance(initial, list) else initial!r}' elements.",
        )
        if initial:
            _initial_state(initial[0], name, data_type, dims)
        out.append({**entry, "dims": dims, "initial_state": initial})
    return out


def _initial_state(initial: Any, name: str, data_type: str, dims: list[int]) -> None:
    _require(isinstance(initial, dict), f"sequence_batching state '{name}' initial_state must be a message")
    _require(
        initial.get("data_type") == data_type,
        f"The data type used for 'initial_state' field of state '{name}' does not match the state data type.",
    )
    _require(
        initial.get("name"), f"Field 'name' must be set when using initial_state for state input '{name}'."
    )
    initial_dims = _dims(initial.get("dims", []), f"sequence_batching state '{name}' initial_state dims")
    _require(
        len(initial_dims) == len(dims),
        f"Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state "
        f"input '{name}'. {len(initial_dims)} != {len(dims)}",
    )
    for got, want in zip(initial_dims, dims, strict=True):
        _require(
            got != -1, f"'initial_state' field for state input name '{name}' contains variable dimensions."
        )
        _require(
            want in (-1, got),
            f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. "
            f"{got} != {want}",
        )
    data_file = initial.get("data_file")
    _require(
        "zero_data" in initial or data_file,
        f"initial_state setting expects state'{name}' to have state_data set",
    )
    if data_file is not None:
        ok = (
            isinstance(data_file, str)
            and data_file not in (".", "..")
            and not {"/", "\\", "\0"} & set(data_file)
        )
        _require(
            ok,
            f"sequence_batching state '{name}' initial_state data_file must be a file name in "
            f"{INITIAL_STATE_FOLDER}/, got {data_file!r}",
        )


def _oldest(section: Any, model: str, max_batch_size: int) -> dict:
    what = "sequence_batching oldest"
    _require(isinstance(section, dict), f"{what} must be a message")
    sizes = section.get("preferred_batch_size", [])
    _require(isinstance(sizes, list), f"{what} preferred_batch_size must be a list of integers")
    for size in sizes:
        ok = isinstance(size, int) and not isinstance(size, bool) and size > 0
        _require(ok, f"sequence batching preferred batch size must be positive for {model}")
        _require(
            size <= max_batch_size,
            f"sequence batching preferred batch size must be <= max batch size for {model}",
        )
    preserve = section.get("preserve_ordering", False)
    _require(
        preserve in (True, False, 0, 1), f"{what} preserve_ordering must be true or false, got {preserve!r}"
    )
    return {
        **section,
        "max_candidate_sequences": _int(section, "max_candidate_sequences", what) or max(1, max_batch_size),
        "preferred_batch_size": sizes or ([max_batch_size] if max_batch_size else []),
        "max_queue_delay_microseconds": _int(section, "max_queue_delay_microseconds", what),
        "preserve_ordering": bool(preserve),
    }


def _direct(section: Any, model: str) -> dict:
    what = "sequence_batching direct"
    _require(isinstance(section, dict), f"{what} must be a message")
    utilization = section.get("minimum_slot_utilization", 0.0)
    ok = (
        isinstance(utilization, int | float)
        and not isinstance(utilization, bool)
        and 0.0 <= utilization <= 1.0
    )
    _require(ok, f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model}")
    return {
        **section,
        "max_queue_delay_microseconds": _int(section, "max_queue_delay_microseconds", what),
        "minimum_slot_utilization": float(utilization),
    }


def check_names(config: dict) -> None:
    """The tensors the sequence batcher fills (control inputs, state inputs) must not be inputs of the
    config, whose inputs clients send; a state output the config lists must have the state's datatype.
    Called once the backend has completed the config's inputs and outputs."""
    section = config.get("sequence_batching")
    if section is None:
        return
    model = config["name"]
    inputs = {entry["name"] for entry in config["input"]}
    outputs = {entry["name"]: entry for entry in config["output"]}
    for entry in section["control_input"]:
        _require(
            entry["name"] not in inputs,
            f"sequence batching control tensor '{entry['name']}' of {model} is also in 'input': the sequence "
            "batcher fills it, clients do not send it",
        )
    for state in section["state"]:
        _require(
            state["input_name"] not in inputs,
            f"sequence_batching state input '{state['input_name']}' of {model} is also in 'input': the "
            "sequence batcher fills it, clients do not send it",
        )
        listed = outputs.get(state["output_name"])
        _require(
            listed is None or listed["data_type"] == state["data_type"],
            f"sequence_batching state output '{state['output_name']}' is {state['data_type']} but the "
            f"'output' of {model} lists it as {listed and listed['data_type']}",
        )


def initial_states(config: dict, model_dir: Path) -> dict[str, np.ndarray]:
    """State input name -> the state a sequence starts with, one row's worth (no batch dimension):
    `initial_state`'s zeros or its data_file (`<model>/initial_state/<file>`, row-major raw elements;
    BYTES as 4-byte little-endian lengths and bytes), else zeros with each variable dimension 1 (Triton
    leaves that state uninitialized)."""
    states = {}
    for state in (config.get("sequence_batching") or {}).get("state", ()):
        name, dtype = state["input_name"], BY_CONFIG[state["data_type"]]
        initial = (state.get("initial_state") or [None])[0]
        dims = initial["dims"] if initial else [1 if d == -1 else d for d in state["dims"]]
        count = int(np.prod(dims))
        data_file = initial.get("data_file") if initial else None
        if data_file is None:
            array = np.full(count, b"", dtype=object) if dtype.v2 == "BYTES" else np.zeros(count, dtype.numpy)
        else:
            data = (model_dir / INITIAL_STATE_FOLDER / data_file).read_bytes()
            if dtype.v2 == "BYTES":
                array = decode_bytes(memoryview(data), count, f"initial_state '{initial['name']}'")
            else:
                wanted = count * dtype.size
                _require(
                    len(data) >= wanted,
                    f"initial_state setting expects {wanted} bytes, but the data provided from {data_file} "
                    f"only has {len(data)} bytes.",
                )
                array = np.frombuffer(data[:wanted], dtype=dtype.numpy).copy()
        states[name] = array.reshape(dims)
    return states
