"""The sequence batcher (batcher/sequence*.py) on a hand-driven clock: both strategies' batches and the
control inputs in them, slots and the backlog, implicit state, idle and backlog timeouts, cancellation,
unload, and Triton's refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from test_batcher import async_test, settle

from tensorgate.batcher.clock import ManualClock
from tensorgate.batcher.execution import Executor
from tensorgate.batcher.scheduler import Job
from tensorgate.batcher.sequence import SequenceBatcher
from tensorgate.batcher.stats import ModelStats
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.sequence import END, START
from tensorgate.codec.tensor import InferRequest
from tensorgate.server.model_config import normalize_config
from tensorgate.server.pbtxt import parse_pbtxt
from tensorgate.server.sequence_config import initial_states

MS = 1_000_000  # ns

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0.5, 2.5 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]
"""
STATE = """
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT64 dims: [ 1 ]
            initial_state: { data_type: TYPE_INT64 dims: [ 1 ] zero_data: true name: "zero" } } ]
"""


class Accumulator:
    """OUTPUT = STATE_OUT = STATE_IN + INPUT, per row; records every batch's inputs. `gated`: each batch
    waits until the test opens it (an async execute)."""

    def __init__(self, gated: bool = False, drop_state: bool = False) -> None:
        self.batches: list[dict[str, np.ndarray]] = []
        self.gates: list[asyncio.Event] = []
        self.drop_state = drop_state
        if gated:
            self.execute = self._gated

    def _compute(self, inputs: dict) -> dict:
        self.batches.append({name: np.array(array) for name, array in inputs.items()})
        total = inputs["INPUT"].astype(np.int64) + inputs.get("STATE_IN", 0)
        return {"OUTPUT": total} if self.drop_state else {"OUTPUT": total, "STATE_OUT": total}

    def execute(self, inputs: dict) -> dict:
        return self._compute(inputs)

    async def _gated(self, inputs: dict) -> dict:
        gate = asyncio.Event()
        self.gates.append(gate)
        outputs = self._compute(inputs)
        await gate.wait()
        return outputs


def make(
    model: Accumulator,
    sequence: str,
    *,
    max_batch_size: int = 4,
    instances: int = 1,
    corrid: str = "TYPE_UINT64",
    state: bool = True,
    tmp: Path | None = None,
    torch_staging: bool = False,
) -> tuple[SequenceBatcher, ManualClock]:
    text = f"""
name: "m"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} }} ]
sequence_batching {{ {sequence} {CONTROLS % corrid} {STATE if state else ""} }}
"""
    config = normalize_config(parse_pbtxt(text), "m")
    staging = None
    if torch_staging:
        from tensorgate.batcher.staging import TorchHostStaging

        staging = TorchHostStaging(config)
    executor = Executor(
        model.execute, label="model 'm' version 1", is_async=asyncio.iscoroutinefunction(model.execute),
        instances=instances, staging=staging,
    )  # fmt: skip
    clock = ManualClock()
    states = initial_states(config, tmp or Path("/nonexistent"))
    return SequenceBatcher(executor, config, ModelStats(), states, clock), clock


def submit(
    batcher: SequenceBatcher, sequence_id: int | str, value: int, flags: int = 0, **job
) -> asyncio.Task:
    request = InferRequest("m", sequence_id=sequence_id, sequence_flags=flags)
    inputs = {"INPUT": np.array([[value]], dtype=np.int64)}
    return asyncio.ensure_future(batcher.run(Job(inputs, 1, request=request, **job)))


def answer(task: asyncio.Task) -> int:
    return int(task.result()["OUTPUT"][0, 0])


def column(batch: dict, name: str) -> list:
    return [row[0] for row in batch[name].tolist()]


# ------------------------------------------------------------------------------------------- direct


@async_test
async def test_direct_binds_each_sequence_to_a_slot_and_empty_slots_are_not_ready() -> None:
    model = Accumulator()
    batcher, _ = make(model, "direct { }")
    a = submit(batcher, 11, 1, START)
    b = submit(batcher, 22, 10, START)
    await settle()
    assert answer(a) == 1 and answer(b) == 10
    # only the second sequence sends: slot 0 (sequence 11) is a null row, READY false and CORRID 0
    c = submit(batcher, 22, 5)
    await settle()
    assert answer(c) == 15
    batch = model.batches[-1]
    assert column(batch, "READY") == [False, True]
    assert column(batch, "CORRID") == [0, 22]
    assert column(batch, "START") == [0, 0] and column(batch, "END") == [0.5, 0.5]
    assert batch["INPUT"].tolist() == [[5], [5]]  # the null row carries another request's inputs
    assert batch["STATE_IN"].tolist() == [[0], [10]]  # and a zero state, not sequence 11's
    d = submit(batcher, 11, 2, END)
    await settle()
    assert answer(d) == 3
    assert column(model.batches[-1], "END") == [2.5] and column(model.batches[-1], "READY") == [True]


@async_test
async def test_direct_backlog_waits_for_a_slot_in_arrival_order() -> None:
    model = Accumulator()
    batcher, _ = make(model, "direct { }", max_batch_size=1)
    first = submit(batcher, 1, 1, START)
    waiting = [submit(batcher, 2, 20, START), submit(batcher, 3, 30, START | END)]
    await settle()
    assert answer(first) == 1 and not any(t.done() for t in waiting)
    assert batcher.pending == 2
    submit(batcher, 1, 1, END)
    await settle()
    assert answer(waiting[0]) == 20 and not waiting[1].done()  # sequence 2 now holds the one slot
    submit(batcher, 2, 1, END)
    await settle()
    assert answer(waiting[1]) == 30
    assert [int(b["CORRID"][0, 0]) for b in model.batches] == [1, 1, 2, 2, 3]


@async_test
async def test_direct_slots_spread_over_instances_and_batches_run_apart() -> None:
    model = Accumulator(gated=True)
    batcher, _ = make(model, "direct { }", max_batch_size=2, instances=2)
    tasks = [submit(batcher, n, n, START) for n in (1, 2, 3)]
    await settle()
    # slot 0 of each instance first: sequences 1 and 2 run in two batches at once, 3 joins 1's instance
    assert [column(b, "CORRID") for b in model.batches] == [[1, 3], [2]]
    for gate in model.gates:
        gate.set()
    await settle()
    assert [answer(t) for t in tasks] == [1, 2, 3]


@async_test
async def test_direct_waits_for_minimum_slot_utilization_or_its_delay() -> None:
    model = Accumulator()
    batcher, clock = make(
        model, "direct { max_queue_delay_microseconds: 5000 minimum_slot_utilization: 0.5 }"
    )
    first = submit(batcher, 1, 1, START)
    await settle()
    assert not model.batches  # 1 of 4 slots ready: waits for a second or for 5 ms
    second = submit(batcher, 2, 2, START)
    await settle()
    assert [column(b, "CORRID") for b in model.batches] == [[1, 2]]
    assert answer(first) == 1 and answer(second) == 2
    third = submit(batcher, 1, 1)
    await settle()
    clock.advance(4 * MS)
    await settle()
    assert not third.done()
    clock.advance(1 * MS)
    await settle()
    assert answer(third) == 2


# ------------------------------------------------------------------------------------------- oldest


@async_test
async def test_oldest_batches_one_request_per_sequence_in_order() -> None:
    model = Accumulator(gated=True)
    batcher, _ = make(model, "oldest { max_candidate_sequences: 8 }", max_batch_size=4)
    tasks = [submit(batcher, 1, 1, START), submit(batcher, 1, 2), submit(batcher, 2, 10, START)]
    tasks += [submit(batcher, 1, 3, END), submit(batcher, 2, 20, END)]
    await settle()
    assert [column(b, "CORRID") for b in model.batches] == [[1, 2]]
    model.gates[0].set()
    await settle()
    assert [column(b, "CORRID") for b in model.batches][1] == [1, 2]
    model.gates[1].set()
    await settle()
    model.gates[2].set()
    await settle()
    assert [column(b, "CORRID") for b in model.batches] == [[1, 2], [1, 2], [1]]
    assert [column(b, "START") for b in model.batches] == [[1, 1], [0, 0], [0]]
    assert [column(b, "END") for b in model.batches] == [[0.5, 0.5], [0.5, 2.5], [2.5]]
    assert [answer(t) for t in tasks] == [1, 3, 10, 6, 30]
    stats = batcher.stats
    assert (stats.inference_count, stats.execution_count, stats.success.count) == (5, 3, 5)


@async_test
async def test_oldest_candidates_past_the_limit_wait_in_the_backlog() -> None:
    model = Accumulator()
    batcher, _ = make(model, "oldest { max_candidate_sequences: 1 }", max_batch_size=4, instances=2)
    tasks = [submit(batcher, n, n, START) for n in (1, 2, 3)]  # 2 candidates: one per instance
    await settle()
    assert [answer(t) for t in tasks[:2]] == [1, 2] and not tasks[2].done()
    submit(batcher, 2, 0, END)
    await settle()
    assert answer(tasks[2]) == 3


@async_test
async def test_oldest_waits_for_its_queue_delay_and_preferred_size() -> None:
    model = Accumulator()
    config = (
        "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 2000 }"
    )
    batcher, clock = make(model, config, max_batch_size=4)
    tasks = [submit(batcher, n, n, START) for n in (1, 2)]
    await settle()
    assert not model.batches
    tasks.append(submit(batcher, 3, 3, START))
    await settle()
    assert [column(b, "CORRID") for b in model.batches] == [[1, 2, 3]]
    tasks.append(submit(batcher, 1, 1))
    await settle()
    clock.advance(2 * MS + 1)
    await settle()
    assert [answer(t) for t in tasks] == [1, 2, 3, 2]


# --------------------------------------------------------------------------------------- the controls


@pytest.mark.parametrize(
    ("corrid", "sequence_id", "expected"),
    [
        ("TYPE_UINT64", (1 << 64) - 2, (1 << 64) - 2),
        ("TYPE_INT64", (1 << 64) - 2, -2),
        ("TYPE_UINT32", (1 << 32) + 5, 5),
        ("TYPE_INT32", (1 << 32) - 3, -3),
        ("TYPE_STRING", "sequence-a", b"sequence-a"),
    ],
)
@async_test
async def test_corrid_of_every_type(corrid: str, sequence_id: int | str, expected: object) -> None:
    model = Accumulator()
    batcher, _ = make(model, "oldest { }", corrid=corrid)
    task = submit(batcher, sequence_id, 4, START)
    await settle()
    assert answer(task) == 4
    got = model.batches[0]["CORRID"]
    assert got.shape == (1, 1) and got[0, 0] == expected
    assert got.dtype == (object if corrid == "TYPE_STRING" else np.dtype(corrid.replace("TYPE_", "").lower()))


@async_test
async def test_controls_without_batching_are_one_element() -> None:
    model = Accumulator()
    batcher, _ = make(model, "direct { }", max_batch_size=0)
    request = InferRequest("m", sequence_id=5, sequence_flags=START)
    task = asyncio.ensure_future(
        batcher.run(Job({"INPUT": np.array([3], dtype=np.int64)}, 1, request=request))
    )
    await settle()
    assert task.result()["OUTPUT"].tolist() == [3]
    assert {name: array.shape for name, array in model.batches[0].items()} == {
        "INPUT": (1,), "START": (1,), "END": (1,), "READY": (1,), "CORRID": (1,), "STATE_IN": (1,),
    }  # fmt: skip


# ----------------------------------------------------------------------------------- implicit state


@async_test
async def test_state_starts_from_its_initial_state_and_a_new_start_resets_it(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "hundred").write_bytes(np.array([100], dtype=np.int64).tobytes())
    state = STATE.replace("zero_data: true", 'data_file: "hundred"')
    model = Accumulator()
    text = f"""name: "m" backend: "python" max_batch_size: 2
input [ {{ name: "INPUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
sequence_batching {{ oldest {{ }} {state} }}"""
    config = normalize_config(parse_pbtxt(text), "m")
    executor = Executor(model.execute, label="model 'm' version 1")
    batcher = SequenceBatcher(executor, config, None, initial_states(config, tmp_path), ManualClock())
    got = []
    for value, flags in ((1, START), (2, 0), (3, START), (4, END), (5, START | END)):
        task = submit(batcher, 9, value, flags)
        await settle()
        got.append(answer(task))
    assert got == [101, 103, 103, 107, 105]


@async_test
async def test_a_model_that_leaves_out_its_state_output_fails_the_request() -> None:
    batcher, _ = make(Accumulator(drop_state=True), "oldest { }")
    task = submit(batcher, 1, 1, START)
    await settle()
    with pytest.raises(InferError, match="did not return its state output 'STATE_OUT'"):
        task.result()


# ------------------------------------------------------------------------------------------ timeouts


@async_test
async def test_an_idle_sequence_is_released_and_its_next_request_refused() -> None:
    model = Accumulator()
    batcher, clock = make(model, "max_sequence_idle_microseconds: 3000 direct { }", max_batch_size=1)
    first = submit(batcher, 1, 1, START)
    await settle()
    waiting = submit(batcher, 2, 2, START)  # no slot until sequence 1 ends or idles out
    await settle()
    clock.advance(3 * MS - 1)
    await settle()
    assert answer(first) == 1 and not waiting.done()
    clock.advance(1)
    await settle()
    assert answer(waiting) == 2
    late = submit(batcher, 1, 1)
    await settle()
    with pytest.raises(InferError) as refused:
        late.result()
    assert refused.value.kind is ErrorKind.INVALID_ARGUMENT
    assert refused.value.message == (
        "inference request for sequence 1 to model 'm' must specify the START flag on the first request of "
        "the sequence (sequence 1 was released after 3000 us without a request: "
        "max_sequence_idle_microseconds)"
    )
    again = submit(batcher, 1, 7, START)  # a new START of that ID waits for the slot again
    await settle()
    clock.advance(3 * MS)
    await settle()
    assert answer(again) == 7


@async_test
async def test_a_backlogged_sequence_past_its_timeout_is_refused() -> None:
    batcher, clock = make(Accumulator(), "direct { }", max_batch_size=1)
    submit(batcher, 1, 1, START)
    await settle()
    waiting = submit(batcher, 2, 2, START, timeout_us=500)
    await settle()
    clock.advance(MS // 2 - 1)
    await settle()
    assert not waiting.done()
    clock.advance(1)
    await settle()
    with pytest.raises(InferError, match="^timeout of the corresponding sequence has been expired$") as e:
        waiting.result()
    assert e.value.kind is ErrorKind.UNAVAILABLE
    assert batcher.stats.fail.count == 1  # it was queued: a failure, as Triton's REJECTED


# ------------------------------------------------------------------------------------------- refusals


@async_test
async def test_triton_refusals() -> None:
    batcher, _ = make(Accumulator(), "oldest { }")
    cases = [
        (0, START, "inference request to model 'm' must specify a non-zero or non-empty correlation ID"),
        ("", START, "inference request to model 'm' must specify a non-zero or non-empty correlation ID"),
        ("s", START, "sequence batching control 'CORRID' data-type is 'BYTES', but model 'm' expects "
                     "'UINT64'"),
        (4, 0, "inference request for sequence 4 to model 'm' must specify the START flag on the first "
               "request of the sequence"),
    ]  # fmt: skip
    for sequence_id, flags, message in cases:
        with pytest.raises(InferError) as refused:
            await submit(batcher, sequence_id, 1, flags)
        assert (refused.value.kind, refused.value.message) == (ErrorKind.INVALID_ARGUMENT, message)
    request = InferRequest("m", sequence_id=4, sequence_flags=START)
    with pytest.raises(InferError, match="must specify batch-size 1 due to requirements of sequence batcher"):
        await batcher.run(Job({"INPUT": np.zeros((2, 1), dtype=np.int64)}, 2, request=request))
    string_model, _ = make(Accumulator(), "oldest { }", corrid="TYPE_STRING")
    with pytest.raises(InferError, match="data-type is 'UINT64', but model 'm' expects 'BYTES'"):
        await submit(string_model, 3, 1, START)
    assert batcher.stats.fail.count == 0  # refused before they queue: not counted, as in Triton


# --------------------------------------------------------------------------------- cancel and unload


@async_test
async def test_a_request_abandoned_before_it_runs_cancels_its_sequence() -> None:
    model = Accumulator(gated=True)
    batcher, _ = make(model, "oldest { }")
    running = submit(batcher, 1, 1, START)
    abandoned, after = submit(batcher, 1, 2), submit(batcher, 1, 3)
    await settle()
    abandoned.cancel()
    await settle()
    with pytest.raises(InferError, match="was cancelled: an earlier request of the sequence was cancelled"):
        after.result()
    model.gates[0].set()
    await settle()
    assert answer(running) == 1  # what already executed is answered
    assert (batcher.stats.success.count, batcher.stats.fail.count) == (1, 2)
    with pytest.raises(InferError, match="must specify the START flag"):
        await submit(batcher, 1, 4)
    fresh = submit(batcher, 1, 5, START)
    await settle()
    model.gates[1].set()
    await settle()
    assert answer(fresh) == 5


@async_test
async def test_drain_refuses_the_backlog_and_answers_what_holds_a_slot() -> None:
    model = Accumulator(gated=True)
    batcher, _ = make(model, "direct { }", max_batch_size=1)
    live = submit(batcher, 1, 1, START)
    queued = submit(batcher, 1, 2)
    backlogged = submit(batcher, 2, 5, START)
    await settle()
    draining = asyncio.ensure_future(batcher.drain())
    await settle()
    with pytest.raises(InferError, match="^Server is stopping, scheduler for model has stopped accepting"):
        backlogged.result()
    assert not draining.done()
    model.gates[0].set()
    await settle()
    model.gates[1].set()
    await settle()
    assert draining.done() and answer(live) == 1 and answer(queued) == 3
    batcher.close()


@async_test
async def test_control_and_state_tensors_reach_a_torch_model() -> None:
    """A model staged as torch tensors (array_module torch; the GPU staging's host twin) gets the control
    and state inputs as tensors, and its state output comes back to the host for the next request."""
    torch = pytest.importorskip("torch")
    seen = []

    class TorchAccumulator(Accumulator):
        def execute(self, inputs: dict) -> dict:
            seen.append({name: type(value).__name__ for name, value in inputs.items()})
            total = inputs["STATE_IN"] + inputs["INPUT"] * inputs["READY"].to(torch.int64)
            return {"OUTPUT": total, "STATE_OUT": total}

    batcher, _ = make(TorchAccumulator(), "direct { }", torch_staging=True)
    got = []
    for value, flags in ((3, START), (4, 0), (5, END)):
        task = submit(batcher, 8, value, flags)
        await settle()
        got.append(answer(task))
    assert got == [3, 7, 12]
    assert set(seen[0].values()) == {"Tensor"}
    assert set(seen[0]) == {"INPUT", "START", "END", "READY", "CORRID", "STATE_IN"}
