"""The dynamic batcher on a hand-driven clock: batch forming, delays, preferred sizes, shape grouping,
instances, cancellation, error fan-out, output splitting, ordering and statistics.

Helpers here are shared with test_batcher_policies.py.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading

import numpy as np
import pytest

from tensorgate.batcher.clock import ManualClock
from tensorgate.batcher.direct import DirectScheduler
from tensorgate.batcher.dynamic import DynamicBatcher
from tensorgate.batcher.execution import Executor
from tensorgate.batcher.inflight import InFlight
from tensorgate.batcher.scheduler import Job
from tensorgate.codec.errors import ErrorKind, InferError

US = 1000  # ns


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 10))

    return run


async def settle() -> None:
    """Lets every task and callback that is ready run (no time passes on the manual clock)."""
    for _ in range(20):
        await asyncio.sleep(0)


def tagged(tag: int, n: int = 1, width: int = 4) -> dict[str, np.ndarray]:
    """A request of `n` rows, every element `tag`: a batch's rows tell whose they are."""
    return {"X": np.full((n, width), tag, dtype=np.int32)}


class Model:
    """Y = 2 X. Records the tags of each batch it executes; `gated` batches wait until opened."""

    def __init__(self, gated: bool = False, fail: Exception | None = None) -> None:
        self.batches: list[list[int]] = []
        self.outputs: list[np.ndarray] = []
        self.gates: list[asyncio.Event] = []
        self.fail = fail
        if gated:
            self.execute = self._gated

    def _compute(self, inputs: dict) -> dict:
        if self.fail is not None:
            raise self.fail
        self.outputs.append(inputs["X"] * 2)
        return {"Y": self.outputs[-1]}

    def execute(self, inputs: dict) -> dict:
        self.batches.append([int(row[0]) for row in inputs["X"]])
        return self._compute(inputs)

    async def _gated(self, inputs: dict) -> dict:
        self.batches.append([int(row[0]) for row in inputs["X"]])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return self._compute(inputs)


def make_batcher(
    model: Model, *, max_batch_size: int = 8, instances: int = 1, in_thread: bool = False, **batching
) -> tuple[DynamicBatcher, ManualClock]:
    config = {
        "max_batch_size": max_batch_size,
        "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [-1]}],
        "dynamic_batching": batching,
    }
    executor = Executor(
        model.execute,
        label="model 'm' version 1",
        is_async=inspect.iscoroutinefunction(model.execute),
        in_thread=in_thread,
        instances=instances,
    )
    clock = ManualClock()
    return DynamicBatcher(executor, config, clock=clock), clock


def submit(batcher: DynamicBatcher, inputs: dict, priority: int = 0, timeout_us: int = 0) -> asyncio.Task:
    rows = len(next(iter(inputs.values())))
    return asyncio.ensure_future(batcher.run(Job(inputs, rows, priority, timeout_us)))


def answer_tag(task: asyncio.Task) -> list[int]:
    """The tags of the rows in a request's answer (each Y element is 2 x tag)."""
    return [int(row[0]) // 2 for row in task.result()["Y"]]


def error_of(task: asyncio.Task) -> InferError:
    error = task.exception()
    assert isinstance(error, InferError), error
    return error


# ------------------------------------------------------------------------------------------ batch forming


@async_test
async def test_requests_queued_together_execute_as_one_batch_and_each_gets_its_rows():
    model = Model()
    batcher, _ = make_batcher(model)
    tasks = [submit(batcher, tagged(tag, n)) for tag, n in ((1, 1), (2, 3), (3, 2))]
    await settle()
    assert model.batches == [[1, 2, 2, 2, 3, 3]]
    assert [answer_tag(t) for t in tasks] == [[1], [2, 2, 2], [3, 3]]


@async_test
async def test_max_batch_size_counts_rows_not_requests():
    model = Model()
    batcher, _ = make_batcher(model, max_batch_size=8)
    tasks = [submit(batcher, tagged(tag, 3)) for tag in (1, 2, 3)]
    await settle()
    assert model.batches == [[1, 1, 1, 2, 2, 2], [3, 3, 3]]
    assert all(t.done() for t in tasks)


@async_test
async def test_a_request_over_max_batch_size_is_refused():
    batcher, _ = make_batcher(Model(), max_batch_size=4)
    task = submit(batcher, tagged(1, 5))
    await settle()
    error = error_of(task)
    assert error.kind is ErrorKind.INVALID_ARGUMENT and "over max_batch_size 4" in error.message


@async_test
async def test_zero_delay_dispatches_whatever_is_queued_once_an_instance_is_free():
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=8)
    first = submit(batcher, tagged(1))
    await settle()
    assert model.batches == [[1]]  # alone: nothing else was queued
    later = [submit(batcher, tagged(tag)) for tag in (2, 3, 4)]
    await settle()
    assert model.batches == [[1]]  # the only instance is busy: the queue fills
    model.gates[0].set()
    await settle()
    assert answer_tag(first) == [1]
    assert model.batches == [[1], [2, 3, 4]]
    model.gates[1].set()
    await settle()
    assert [answer_tag(t) for t in later] == [[2], [3], [4]]


@async_test
async def test_delay_holds_a_batch_until_the_oldest_request_has_waited_max_queue_delay():
    model = Model()
    batcher, clock = make_batcher(model, max_batch_size=8, max_queue_delay_microseconds=1000)
    first = submit(batcher, tagged(1))
    await settle()
    clock.advance(600 * US)
    second = submit(batcher, tagged(2))
    await settle()
    clock.advance(400 * US - 1)
    await settle()
    assert model.batches == [] and not first.done()
    clock.advance(1)  # 1000 us after the first request (not the second) arrived
    await settle()
    assert model.batches == [[1, 2]]
    assert (answer_tag(first), answer_tag(second)) == ([1], [2])


@async_test
async def test_a_full_batch_goes_at_once_without_waiting_for_the_delay():
    model = Model()
    batcher, _ = make_batcher(model, max_batch_size=4, max_queue_delay_microseconds=10**9)
    for tag in (1, 2, 3):
        submit(batcher, tagged(tag))
    await settle()
    assert model.batches == []
    submit(batcher, tagged(4))
    await settle()
    assert model.batches == [[1, 2, 3, 4]]


@async_test
async def test_the_largest_reachable_preferred_size_goes_at_once_the_rest_waits():
    model = Model()
    batcher, clock = make_batcher(
        model, max_batch_size=8, preferred_batch_size=[2, 4], max_queue_delay_microseconds=500
    )
    tasks = [submit(batcher, tagged(tag)) for tag in range(1, 6)]
    await settle()
    assert model.batches == [[1, 2, 3, 4]]
    clock.advance(500 * US)
    await settle()
    assert model.batches == [[1, 2, 3, 4], [5]]
    assert [answer_tag(t) for t in tasks] == [[1], [2], [3], [4], [5]]


@async_test
async def test_preferred_size_without_delay_still_caps_the_batch():
    # As in Triton: with preferred sizes and no delay, a batch stops at the largest preferred size reached.
    model = Model()
    batcher, _ = make_batcher(model, max_batch_size=8, preferred_batch_size=[2])
    for tag in range(1, 6):
        submit(batcher, tagged(tag))
    await settle()
    assert model.batches == [[1, 2], [3, 4], [5]]


@async_test
async def test_past_its_delay_a_batch_takes_everything_that_fits_beyond_the_preferred_size():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model, max_batch_size=8, preferred_batch_size=[2], max_queue_delay_microseconds=100
    )
    submit(batcher, tagged(1))
    submit(batcher, tagged(2))
    await settle()
    assert model.batches == [[1, 2]]  # preferred size reached
    for tag in (3, 4, 5):
        submit(batcher, tagged(tag))
    await settle()
    clock.advance(200 * US)
    model.gates[0].set()
    await settle()
    assert model.batches == [[1, 2], [3, 4, 5]]


# ------------------------------------------------------------------------------------------ shapes


@async_test
async def test_only_requests_with_equal_non_batch_shapes_share_a_batch():
    model = Model()
    batcher, _ = make_batcher(model, max_batch_size=8)
    shapes = [(1, 4), (2, 4), (3, 5), (4, 4)]
    tasks = [submit(batcher, tagged(tag, width=width)) for tag, width in shapes]
    await settle()
    # In queue order, as Triton forms them: a request of another shape ends the batch before it.
    assert model.batches == [[1, 2], [3], [4]]
    assert [t.result()["Y"].shape for t in tasks] == [(1, 4), (1, 4), (1, 5), (1, 4)]


@async_test
async def test_requests_with_different_inputs_or_datatypes_do_not_share_a_batch():
    seen: list[tuple] = []

    def execute(inputs):
        seen.append(tuple(sorted((name, str(a.dtype), a.shape) for name, a in inputs.items())))
        return {"Y": np.zeros((len(next(iter(inputs.values()))), 1), np.int32)}

    model = Model()
    model.execute = execute
    batcher, _ = make_batcher(model)
    x = np.ones((1, 2), np.int32)
    requests = [{"X": x}, {"X": x, "Z": x}, {"X": x, "Z": x}, {"X": x.astype(np.float32)}]
    for inputs in requests:
        submit(batcher, inputs)
    await settle()
    assert seen == [
        (("X", "int32", (1, 2)),),
        (("X", "int32", (2, 2)), ("Z", "int32", (2, 2))),
        (("X", "float32", (1, 2)),),
    ]


# ------------------------------------------------------------------------------------------ instances


@async_test
async def test_instance_count_is_the_number_of_batches_in_flight():
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=1, instances=2)
    tasks = [submit(batcher, tagged(tag)) for tag in (1, 2, 3)]
    await settle()
    assert model.batches == [[1], [2]]
    model.gates[1].set()
    await settle()
    assert answer_tag(tasks[1]) == [2] and not tasks[0].done()
    assert model.batches == [[1], [2], [3]]
    model.gates[0].set()
    model.gates[2].set()
    await settle()
    assert [answer_tag(t) for t in tasks] == [[1], [2], [3]]


@async_test
async def test_a_thread_backend_executes_off_the_event_loop():
    loop_thread = threading.get_ident()
    release = threading.Event()
    threads: list[int] = []

    def execute(inputs):
        threads.append(threading.get_ident())
        release.wait(10)
        return {"Y": inputs["X"] * 2}

    model = Model()
    model.execute = execute
    batcher, _ = make_batcher(model, in_thread=True)
    first = submit(batcher, tagged(1))
    while not threads:  # the loop keeps running while the model executes
        await asyncio.sleep(0.001)
    second = submit(batcher, tagged(2))
    await settle()
    assert not first.done() and not second.done()
    release.set()
    await asyncio.gather(first, second)
    assert answer_tag(first) == [1] and answer_tag(second) == [2]
    assert threads and loop_thread not in threads


# ------------------------------------------------------------------------------------------ cancellation


@async_test
async def test_a_caller_gone_while_queued_is_dropped_and_the_model_never_sees_its_rows():
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=8)
    submit(batcher, tagged(1))
    await settle()
    kept, gone = submit(batcher, tagged(2)), submit(batcher, tagged(3))
    await settle()
    assert len(batcher.queues) == 2
    gone.cancel()
    await settle()
    assert len(batcher.queues) == 1
    model.gates[0].set()
    await settle()
    assert model.batches == [[1], [2]]
    model.gates[1].set()
    await settle()
    assert answer_tag(kept) == [2] and gone.cancelled()


@async_test
async def test_a_caller_gone_during_execution_leaves_the_rest_of_its_batch_answered():
    model = Model(gated=True)
    batcher, _ = make_batcher(model)
    gone, kept = submit(batcher, tagged(1)), submit(batcher, tagged(2))
    await settle()
    gone.cancel()
    model.gates[0].set()
    await settle()
    assert gone.cancelled() and answer_tag(kept) == [2]


# ---------------------------------------------------------------------------------------- outputs and errors


@async_test
async def test_answers_are_views_of_the_batch_output():
    model = Model()
    batcher, _ = make_batcher(model)
    tasks = [submit(batcher, tagged(tag, 2)) for tag in (1, 2)]
    await settle()
    for task in tasks:
        assert np.shares_memory(task.result()["Y"], model.outputs[0])


@async_test
async def test_an_exception_in_execute_fails_every_request_of_the_batch_and_the_next_batch_runs():
    model = Model(gated=True, fail=ValueError("boom"))
    batcher, _ = make_batcher(model)
    failing = [submit(batcher, tagged(tag)) for tag in (1, 2)]
    await settle()
    after = submit(batcher, tagged(3))
    model.gates[0].set()
    await settle()
    for task in failing:
        error = error_of(task)
        assert error.kind is ErrorKind.INTERNAL
        assert error.message == "model 'm' version 1 failed: ValueError: boom"
    model.fail = None
    model.gates[1].set()
    await settle()
    assert answer_tag(after) == [3]


@async_test
async def test_wrong_number_of_output_rows_fails_the_batch_with_a_clear_error():
    model = Model()
    model.execute = lambda inputs: {"Y": inputs["X"][:-1] * 2}
    batcher, _ = make_batcher(model)
    tasks = [submit(batcher, tagged(tag, 2)) for tag in (1, 2)]
    await settle()
    for task in tasks:
        error = error_of(task)
        assert error.kind is ErrorKind.INTERNAL
        assert "returned 3 rows for output 'Y' where its batch has 4 rows" in error.message


@pytest.mark.parametrize(
    ("returned", "fragment"),
    [
        (lambda x: [1, 2], "returned list, not a dict of outputs"),
        (lambda x: {"Y": np.int32(7)}, "returned a scalar for output 'Y'"),
        (lambda x: {"Y": [[1, 2], [3]]}, "returned outputs that are not arrays"),
    ],
)
@async_test
async def test_outputs_that_cannot_be_split_fail_the_batch(returned, fragment):
    model = Model()
    model.execute = lambda inputs: returned(inputs["X"])
    batcher, _ = make_batcher(model)
    task = submit(batcher, tagged(1))
    await settle()
    assert fragment in error_of(task).message


@async_test
async def test_list_outputs_take_the_configured_datatype():
    model = Model()
    model.execute = lambda inputs: {"Y": [[5, 6]] * len(inputs["X"]), "EXTRA": "ignored"}
    batcher, _ = make_batcher(model)
    tasks = [submit(batcher, tagged(tag)) for tag in (1, 2)]
    await settle()
    for task in tasks:
        assert task.result().keys() == {"Y"}
        y = task.result()["Y"]
        assert y.dtype == np.int32 and y.tolist() == [[5, 6]]


# ------------------------------------------------------------------------------------------ ordering


async def _finish_second_batch_first(preserve_ordering: bool) -> list[int]:
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=1, instances=2, preserve_ordering=preserve_ordering)
    tasks = [submit(batcher, tagged(tag)) for tag in (1, 2)]
    answered: list[int] = []
    for tag, task in zip((1, 2), tasks, strict=True):
        task.add_done_callback(lambda _, tag=tag: answered.append(tag))
    await settle()
    model.gates[1].set()
    await settle()
    model.gates[0].set()
    await settle()
    return answered


@async_test
async def test_without_preserve_ordering_a_batch_is_answered_when_it_finishes():
    assert await _finish_second_batch_first(False) == [2, 1]


@async_test
async def test_preserve_ordering_answers_in_the_order_requests_were_batched():
    assert await _finish_second_batch_first(True) == [1, 2]


# ------------------------------------------------------------------------------------------ statistics


@async_test
async def test_statistics_count_rows_batches_queue_time_and_batch_sizes():
    model = Model()
    batcher, clock = make_batcher(model, max_batch_size=8, max_queue_delay_microseconds=100)
    submit(batcher, tagged(1, 2))
    submit(batcher, tagged(2, 1))
    await settle()
    clock.advance(100 * US)
    await settle()
    submit(batcher, tagged(3, 8))
    await settle()
    stats = batcher.stats.as_dict()
    assert stats["inference_count"] == 11
    assert stats["execution_count"] == 2
    assert stats["last_inference"] > 0
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 3 and inference["fail"]["count"] == 0
    assert inference["queue"] == {"count": 3, "ns": 2 * 100 * US}  # the full batch did not wait
    assert inference["compute_infer"]["count"] == 3
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(3, 1), (8, 1)]


@async_test
async def test_failed_requests_are_counted():
    batcher, _ = make_batcher(Model(fail=RuntimeError("no")))
    for tag in (1, 2):
        submit(batcher, tagged(tag))
    await settle()
    stats = batcher.stats.as_dict()
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 0 and stats["execution_count"] == 0


# ---------------------------------------------------------------------------------------- drain, no batching


@async_test
async def test_drain_waits_for_queued_and_executing_requests():
    model = Model(gated=True)
    batcher, clock = make_batcher(model, max_queue_delay_microseconds=50)
    tasks = [submit(batcher, tagged(tag)) for tag in (1, 2)]
    await settle()
    drained = asyncio.ensure_future(batcher.drain())
    clock.advance(50 * US)
    await settle()
    assert not drained.done()
    model.gates[0].set()
    await settle()
    assert drained.done() and all(t.done() for t in tasks)


@async_test
async def test_every_waiter_wakes_when_the_work_in_flight_ends():
    in_flight = InFlight()
    await in_flight.wait_idle()  # nothing in flight: returns at once
    in_flight.enter()
    in_flight.enter()
    waiters = [asyncio.ensure_future(in_flight.wait_idle()) for _ in range(2)]
    in_flight.leave()
    await settle()
    assert not any(w.done() for w in waiters)
    in_flight.leave()
    await settle()
    assert all(w.done() for w in waiters)


@async_test
async def test_two_drains_at_once_both_return():
    model = Model(gated=True)
    batcher, _ = make_batcher(model)
    task = submit(batcher, tagged(1))
    await settle()
    drains = [asyncio.ensure_future(batcher.drain()) for _ in range(2)]
    await settle()
    assert not any(d.done() for d in drains)
    model.gates[0].set()
    await settle()
    assert task.done() and all(d.done() for d in drains)


@async_test
async def test_drain_is_not_held_by_callers_gone_or_requests_timed_out():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model, max_batch_size=1, default_queue_policy={"default_timeout_microseconds": 10}
    )
    running = submit(batcher, tagged(0))
    await settle()
    gone, timed_out = submit(batcher, tagged(1)), submit(batcher, tagged(2))
    await settle()
    drained = asyncio.ensure_future(batcher.drain())
    gone.cancel()
    await settle()
    clock.advance(11 * US)
    await settle()
    assert gone.cancelled() and error_of(timed_out).message == "Request timeout expired"
    assert not drained.done()
    model.gates[0].set()
    await settle()
    assert drained.done() and answer_tag(running) == [0]


@async_test
async def test_two_drains_of_a_direct_scheduler_both_return():
    gate = asyncio.Event()

    async def execute(inputs):
        await gate.wait()
        return {"Y": inputs["X"] * 2}

    scheduler = DirectScheduler(Executor(execute, label="m", is_async=True))
    task = asyncio.ensure_future(scheduler.run(Job(tagged(1))))
    await settle()
    drains = [asyncio.ensure_future(scheduler.drain()) for _ in range(2)]
    await settle()
    assert not any(d.done() for d in drains)
    gate.set()
    await settle()
    assert answer_tag(task) == [1] and all(d.done() for d in drains)


@async_test
async def test_without_batching_each_request_is_a_batch_of_its_own():
    seen: list[tuple] = []

    def execute(inputs):
        seen.append(inputs["X"].shape)
        return {"Y": inputs["X"] * 2}

    model = Model()
    model.execute = execute
    batcher, _ = make_batcher(model, max_batch_size=0)
    tasks = [submit(batcher, {"X": np.full((3,), tag, np.int32)}) for tag in (1, 2)]
    await settle()
    assert seen == [(3,), (3,)]
    assert [t.result()["Y"].tolist() for t in tasks] == [[2, 2, 2], [4, 4, 4]]


def test_counts_taken_in_one_process_and_added_in_another_read_as_if_counted_there():
    """A worker's statistics reach the engine as ModelStats.take -> STATS (MessagePack) -> ModelStats.add:
    the engine then reports what it would have counted itself, and the worker's counters start over."""
    import msgspec

    from tensorgate.batcher.stats import ModelStats
    from tensorgate.codec import messages as msg

    def count(stats: ModelStats) -> None:
        stats.record_alone(1, 1_000)
        stats.record_alone(3, 2_500)
        stats.record_failure(1, 700)
        stats.record_batch(4, 10, 20, 30)
        stats.record_success(2, 900, 100, 10, 20, 30, [400, 500])
        stats.record_failure(2, 1_400, "REJECTED")

    direct, worker, engine = ModelStats(), ModelStats(), ModelStats()
    count(direct)
    engine.record_alone(2, 5_000)  # the engine's own requests stay counted
    direct.record_alone(2, 5_000)
    count(worker)
    taken = worker.take("m", 1)
    sent = msgspec.msgpack.encode(msg.Stats(7, [taken]))
    received = msgspec.msgpack.Decoder(msg.TO_ENGINE).decode(sent)
    assert isinstance(received, msg.Stats) and received.asked == 7
    engine.add(received.counts[0])
    same = engine.as_dict() | {"last_inference": 0}
    assert same == direct.as_dict() | {"last_inference": 0}
    assert engine.failures == direct.failures
    assert sorted(engine.take_latencies()) == sorted(direct.take_latencies())
    assert worker.take("m", 1) is None  # nothing counted since
    assert worker.as_dict()["inference_count"] == 0 and worker.batch_stats == {}
