"""`sequence_batching` in a model config (server/sequence_config.py): Triton's defaults, its refusals in
its own words (qa/L0_model_config's expected texts among them), and the initial states of implicit state."""

from pathlib import Path

import numpy as np
import pytest

from tensorgate.server.config_error import ConfigError
from tensorgate.server.model_config import check_complete, normalize_config
from tensorgate.server.pbtxt import parse_pbtxt
from tensorgate.server.sequence_config import initial_states

BASE = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def config(sequence: str, extra: str = "") -> dict:
    return normalize_config(parse_pbtxt(BASE + extra + f"sequence_batching {{ {sequence} }}"), "m")


def control(name: str, kind: str, values: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} {values} }} ] }}'


START = control("START", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")


def test_defaults_follow_triton() -> None:
    direct = config("")["sequence_batching"]
    assert direct["max_sequence_idle_microseconds"] == 1_000_000
    assert direct["direct"] == {"max_queue_delay_microseconds": 0, "minimum_slot_utilization": 0.0}
    assert (direct["control_input"], direct["state"]) == ([], [])
    oldest = config("oldest { }")["sequence_batching"]["oldest"]
    assert oldest == {
        "max_candidate_sequences": 8,
        "preferred_batch_size": [8],
        "max_queue_delay_microseconds": 0,
        "preserve_ordering": False,
    }
    numbered = config(
        f"control_input [ {START.replace('CONTROL_SEQUENCE_START', '2')} ]"
    )  # an enum as number
    assert numbered["sequence_batching"]["control_input"][0]["control"][0]["kind"] == "CONTROL_SEQUENCE_END"


END_ON_START = control("START", "CONTROL_SEQUENCE_END", "int32_false_true: [0, 1]")
TWO_FORMS = control("S", "CONTROL_SEQUENCE_START", "int32_false_true: [0] fp32_false_true: [0, 1]")
THREE = control("S", "CONTROL_SEQUENCE_START", "fp32_false_true: [ 0, 1, 2 ]")
FP32_CORRID = control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_FP32")
BOOLEAN_CORRID = control("C", "CONTROL_SEQUENCE_CORRID", "int32_false_true: [0, 1]")
FORMS = "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        (f"control_input [ {START}, {START.replace('START', 'BEGIN', 1)} ]",
         "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
        (f"control_input [ {START}, {END_ON_START} ]",
         "sequence batching control tensor 'START' is specified for multiple control kinds for m"),
        ('control_input [ { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY } ] } ]',
         f"sequence batching must specify either {FORMS} for CONTROL_SEQUENCE_READY for m"),
        (f"control_input [ {TWO_FORMS} ]",
         "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
         "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
        (f"control_input [ {THREE} ]",
         "sequence batching control 'fp32_false_true' must have exactly 2 entries for "
         "CONTROL_SEQUENCE_START for m"),
        (f"control_input [ {FP32_CORRID} ]",
         "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are "
         "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
        (f"control_input [ {BOOLEAN_CORRID} ]",
         f"sequence batching must not specify either {FORMS} for CONTROL_SEQUENCE_CORRID for m"),
        ("control_input [ { control [ { kind: CONTROL_SEQUENCE_READY } ] } ]",
         "sequence batching control tensor must have a name for m"),
        ("oldest { preferred_batch_size: [ 0 ] }",
         "sequence batching preferred batch size must be positive for m"),
        ("oldest { preferred_batch_size: [ 9 ] }",
         "sequence batching preferred batch size must be <= max batch size for m"),
        ("direct { minimum_slot_utilization: 1.5 }",
         "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m"),
        ("direct { } oldest { }",
         "sequence_batching sets both 'direct' and 'oldest': the strategy is one of them"),
        ("max_sequence_idle_microseconds: -1",
         "sequence_batching max_sequence_idle_microseconds must be an integer >= 0, got -1"),
        ("iterative_sequence: true", "sequence_batching iterative_sequence is not supported"),
    ],
)  # fmt: skip
def test_refusals_in_tritons_words(sequence: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        config(sequence)
    assert str(refused.value) == f"model 'm': {message}"


STATE = (
    'state [ {{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ {dims} ] {initial} }} ]'
)


ZERO = "zero_data: true"


@pytest.mark.parametrize(
    ("initial", "message"),
    [
        (f'initial_state: {{ data_type: TYPE_FP32 dims: [ 2 ] {ZERO} name: "z" }}',
         "The data type used for 'initial_state' field of state 'S_IN' does not match the state data type."),
        (f"initial_state: {{ data_type: TYPE_INT32 dims: [ 2 ] {ZERO} }}",
         "Field 'name' must be set when using initial_state for state input 'S_IN'."),
        (f'initial_state: {{ data_type: TYPE_INT32 dims: [ 2, 1 ] {ZERO} name: "z" }}',
         "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state "
         "input 'S_IN'. 2 != 1"),
        (f'initial_state: {{ data_type: TYPE_INT32 dims: [ -1 ] {ZERO} name: "z" }}',
         "'initial_state' field for state input name 'S_IN' contains variable dimensions."),
        (f'initial_state: {{ data_type: TYPE_INT32 dims: [ 3 ] {ZERO} name: "z" }}',
         "'initial_state' dim for input name 'S_IN' doesn't match 'state' dim description. 3 != 2"),
        ('initial_state: { data_type: TYPE_INT32 dims: [ 2 ] name: "z" }',
         "initial_state setting expects state'S_IN' to have state_data set"),
        ('initial_state: { data_type: TYPE_INT32 dims: [ 2 ] name: "z" data_file: "../x" }',
         "sequence_batching state 'S_IN' initial_state data_file must be a file name in initial_state/, "
         "got '../x'"),
        (f'initial_state [ {{ data_type: TYPE_INT32 dims: [ 2 ] name: "a" {ZERO} }}, '
         f'{{ data_type: TYPE_INT32 dims: [ 2 ] name: "b" {ZERO} }} ]',
         "initial_state field for state input 'S_IN' must contain exactly one or zero element. "
         "Found '2' elements."),
    ],
)  # fmt: skip
def test_state_refusals_in_tritons_words(initial: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        config(STATE.format(dims="2", initial=initial))
    assert str(refused.value) == f"model 'm': {message}"


def test_scheduling_is_one_of_three() -> None:
    with pytest.raises(ConfigError, match="dynamic_batching and sequence_batching cannot both be set"):
        config("", extra="dynamic_batching { }\n")
    with pytest.raises(ConfigError, match="sequence_batching is not supported for decoupled models"):
        config("", extra="model_transaction_policy { decoupled: true }\n")


def test_what_the_batcher_fills_is_not_a_client_input() -> None:
    clash = normalize_config(
        parse_pbtxt(BASE + f"sequence_batching {{ control_input [ {START.replace('START', 'INPUT', 1)} ] }}"),
        "m",
    )
    with pytest.raises(
        ConfigError, match="control tensor 'INPUT' of m is also in 'input': the sequence batcher"
    ):
        check_complete(clash)
    listed = config(
        STATE.format(dims="1", initial=""),
        extra='output [ { name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
    )
    with pytest.raises(
        ConfigError, match="state output 'S_OUT' is TYPE_INT32 but the 'output' of m lists it as TYPE_FP32"
    ):
        check_complete(listed)


def test_initial_states(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "ten").write_bytes(np.arange(10, 12, dtype=np.int32).tobytes() + b"extra")
    states = """state [
      { input_name: "A" output_name: "A_OUT" data_type: TYPE_INT32 dims: [ -1, 3 ] },
      { input_name: "B" output_name: "B_OUT" data_type: TYPE_INT32 dims: [ -1 ]
        initial_state: { data_type: TYPE_INT32 dims: [ 2 ] data_file: "ten" name: "ten" } },
      { input_name: "C" output_name: "C_OUT" data_type: TYPE_STRING dims: [ 2 ]
        initial_state: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true name: "empty" } } ]"""
    got = initial_states(config(states), tmp_path)
    assert got["A"].tolist() == [[0, 0, 0]] and got["A"].dtype == np.int32  # variable dims: 1, zeros
    assert got["B"].tolist() == [10, 11]
    assert got["C"].tolist() == [b"", b""]
    short = states.replace('dims: [ 2 ] data_file: "ten"', 'dims: [ 4 ] data_file: "ten"').replace(
        "dims: [ -1 ]\n", "dims: [ 4 ]\n"
    )
    with pytest.raises(
        ValueError,
        match="initial_state setting expects 16 bytes, but the data provided from ten only has 13 bytes.",
    ):
        initial_states(config(short), tmp_path)
