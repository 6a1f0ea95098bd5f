"""The dynamic batcher's priority levels and queue policies (max_queue_size, timeouts: REJECT, DELAY,
override), on a hand-driven clock."""

from __future__ import annotations

import pytest
from test_batcher import US, Model, answer_tag, async_test, error_of, make_batcher, settle, submit, tagged

from tensorgate.batcher.queue import PriorityQueues, QueuePolicy
from tensorgate.codec.errors import ErrorKind


async def busy(model: Model, batcher) -> None:
    """Occupies the batcher's only instance with a batch (tag 0) until `model.gates[0]` opens."""
    submit(batcher, tagged(0))
    await settle()
    assert model.batches == [[0]]


def policy(**fields) -> dict:
    return fields


# ------------------------------------------------------------------------------------------ priorities


@async_test
async def test_a_higher_priority_request_overtakes_queued_lower_priority_ones():
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=1, priority_levels=3, default_priority_level=3)
    await busy(model, batcher)
    tasks = [submit(batcher, tagged(tag), priority=p) for tag, p in ((1, 3), (2, 2), (3, 1), (4, 2))]
    await settle()
    for gate in range(5):
        model.gates[gate].set()
        await settle()
    # Level 1 first, then 2 (in arrival order), then 3.
    assert model.batches == [[0], [3], [2], [4], [1]]
    assert [answer_tag(t) for t in tasks] == [[1], [2], [3], [4]]


@pytest.mark.parametrize("priority", [0, 4, 10**6])
def test_priority_zero_or_past_the_last_level_means_the_default_level(priority):
    queues = PriorityQueues(priority_levels=3, default_priority_level=2)
    assert queues.level_of(priority) == 2
    assert [queues.level_of(p) for p in (1, 2, 3)] == [1, 2, 3]


def test_without_priority_levels_every_request_shares_one_queue():
    queues = PriorityQueues()
    assert {queues.level_of(p) for p in (0, 1, 7)} == {0}


@async_test
async def test_a_batch_takes_higher_levels_first_and_fills_up_from_lower_ones():
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=3, priority_levels=2, default_priority_level=2)
    await busy(model, batcher)
    for tag, priority in ((1, 2), (2, 2), (3, 1)):
        submit(batcher, tagged(tag), priority=priority)
    await settle()
    model.gates[0].set()
    await settle()
    assert model.batches[1] == [3, 1, 2]


# ------------------------------------------------------------------------------------------ max_queue_size


@async_test
async def test_a_full_queue_refuses_a_request_at_once():
    model = Model(gated=True)
    batcher, _ = make_batcher(model, max_batch_size=1, default_queue_policy=policy(max_queue_size=2))
    await busy(model, batcher)
    queued = [submit(batcher, tagged(tag)) for tag in (1, 2)]
    refused = submit(batcher, tagged(3))
    await settle()
    error = error_of(refused)
    assert (error.kind, error.message) == (ErrorKind.UNAVAILABLE, "Exceeds maximum queue size")
    assert not any(t.done() for t in queued)
    # Executing requests are not in the queue: room again once one leaves it.
    model.gates[0].set()
    await settle()
    again = submit(batcher, tagged(4))
    await settle()
    assert not again.done()
    for gate in range(1, 4):
        model.gates[gate].set()
        await settle()
    assert [answer_tag(t) for t in (*queued, again)] == [[1], [2], [4]]


@async_test
async def test_each_priority_level_has_its_own_queue_size():
    model = Model(gated=True)
    batcher, _ = make_batcher(
        model,
        max_batch_size=1,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=policy(max_queue_size=1),
        priority_queue_policy={"1": policy(max_queue_size=3)},
    )
    await busy(model, batcher)
    low = [submit(batcher, tagged(tag), priority=2) for tag in (1, 2)]
    high = [submit(batcher, tagged(tag), priority=1) for tag in (3, 4, 5, 6)]
    await settle()
    assert [t.done() for t in low] == [False, True]
    assert [t.done() for t in high] == [False, False, False, True]
    assert error_of(high[3]).message == "Exceeds maximum queue size"


# ------------------------------------------------------------------------------------------ timeouts


@async_test
async def test_a_request_past_its_timeout_is_rejected_while_still_queued():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model, max_batch_size=1, default_queue_policy=policy(default_timeout_microseconds=1000)
    )
    await busy(model, batcher)
    waiting = submit(batcher, tagged(1))
    await settle()
    clock.advance(1000 * US)  # on its deadline: not yet past it
    await settle()
    assert not waiting.done()
    clock.advance(1)
    await settle()
    error = error_of(waiting)
    assert (error.kind, error.message) == (ErrorKind.UNAVAILABLE, "Request timeout expired")
    assert len(batcher.queues) == 0
    stats = batcher.stats.as_dict()["inference_stats"]
    assert stats["fail"] == {"count": 1, "ns": 1000 * US + 1}


@async_test
async def test_a_timeout_does_not_apply_once_the_request_is_executing():
    model = Model(gated=True)
    batcher, clock = make_batcher(model, default_queue_policy=policy(default_timeout_microseconds=10))
    task = submit(batcher, tagged(1))
    await settle()
    clock.advance(1000 * US)
    model.gates[0].set()
    await settle()
    assert answer_tag(task) == [1]


@pytest.mark.parametrize(
    ("queue_policy", "requested_us", "times_out_after_us"),
    [
        (policy(default_timeout_microseconds=1000, allow_timeout_override=True), 100, 100),
        (policy(default_timeout_microseconds=1000, allow_timeout_override=True), 5000, 1000),  # only shorter
        (policy(default_timeout_microseconds=1000, allow_timeout_override=True), 0, 1000),
        (policy(default_timeout_microseconds=1000), 100, 1000),  # override not allowed
        (policy(allow_timeout_override=True), 100, None),  # as in Triton: no default timeout, none at all
    ],
)
@async_test
async def test_request_timeout_override(queue_policy, requested_us, times_out_after_us):
    model = Model(gated=True)
    batcher, clock = make_batcher(model, max_batch_size=1, default_queue_policy=queue_policy)
    await busy(model, batcher)
    waiting = submit(batcher, tagged(1), timeout_us=requested_us)
    await settle()
    if times_out_after_us is None:
        clock.advance(10**12)
        await settle()
        assert not waiting.done()
        return
    clock.advance(times_out_after_us * US)
    await settle()
    assert not waiting.done()
    clock.advance(1)
    await settle()
    assert error_of(waiting).message == "Request timeout expired"


@async_test
async def test_delay_action_moves_a_timed_out_request_behind_the_others_of_its_level():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model,
        max_batch_size=1,
        default_queue_policy=policy(timeout_action="DELAY", default_timeout_microseconds=100),
    )
    await busy(model, batcher)
    late = submit(batcher, tagged(1))
    await settle()
    clock.advance(50 * US)
    fresh = submit(batcher, tagged(2))
    await settle()
    clock.advance(51 * US)  # the first is past its timeout, the second not
    await settle()
    assert not late.done()  # delayed, not rejected
    for gate in range(3):
        model.gates[gate].set()
        await settle()
    assert model.batches == [[0], [2], [1]]
    assert (answer_tag(late), answer_tag(fresh)) == ([1], [2])


@async_test
async def test_delayed_requests_still_join_batches():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model,
        max_batch_size=4,
        default_queue_policy=policy(timeout_action="DELAY", default_timeout_microseconds=10),
    )
    await busy(model, batcher)
    tasks = [submit(batcher, tagged(tag)) for tag in (1, 2)]
    await settle()
    clock.advance(20 * US)
    model.gates[0].set()
    await settle()
    assert model.batches == [[0], [1, 2]]
    model.gates[1].set()
    await settle()
    assert [answer_tag(t) for t in tasks] == [[1], [2]]


@async_test
async def test_a_rejected_request_frees_its_place_in_a_full_queue():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model,
        max_batch_size=1,
        default_queue_policy=policy(max_queue_size=1, default_timeout_microseconds=10),
    )
    await busy(model, batcher)
    first = submit(batcher, tagged(1))
    await settle()
    clock.advance(11 * US)
    await settle()
    assert error_of(first).message == "Request timeout expired"
    second = submit(batcher, tagged(2))
    await settle()
    assert not second.done()


@async_test
async def test_levels_apply_their_own_timeout_policy():
    model = Model(gated=True)
    batcher, clock = make_batcher(
        model,
        max_batch_size=1,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=policy(default_timeout_microseconds=100),
        priority_queue_policy={"1": policy()},
    )
    await busy(model, batcher)
    patient = submit(batcher, tagged(1), priority=1)
    hurried = submit(batcher, tagged(2), priority=2)
    await settle()
    clock.advance(200 * US)
    await settle()
    assert not patient.done()
    assert error_of(hurried).message == "Request timeout expired"


def test_queue_policy_defaults_follow_triton():
    assert QueuePolicy.from_config(None) == QueuePolicy("REJECT", 0, False, 0)
    assert QueuePolicy.from_config({"timeout_action": "DELAY", "max_queue_size": 3}).max_queue_size == 3
