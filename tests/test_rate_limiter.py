"""The rate limiter's bookkeeping (batcher/rate_limiter.py) as Triton's core src/rate_limiter.cc keeps it:
available counts, explicit limits, the order of waiting instances, per-device and global resources."""

from __future__ import annotations

import asyncio

import pytest

from tensorgate.batcher.rate_limiter import (
    GLOBAL,
    PER_DEVICE,
    RateLimiter,
    RateLimitError,
    instances_of,
    parse_resource,
)


def config(*groups: dict) -> dict:
    return {"name": "m", "instance_group": list(groups)}


def group(resources: list[tuple[str, int, bool]], priority: int = 0, count: int = 1, **more) -> dict:
    limiter = {
        "resources": [{"name": n, "count": c, "global": g} for n, c, g in resources],
        "priority": priority,
    }
    return {"kind": "KIND_CPU", "count": count, "rate_limiter": limiter, **more}


def test_available_counts_are_the_max_over_instances() -> None:
    # Triton's docs/user_guide/rate_limiter.md example
    limiter = RateLimiter()
    limiter.register("A", config(group([("R1", 4, False), ("R2", 4, False)])))
    limiter.register("B", config(group([("R2", 5, False), ("R3", 10, False), ("R4", 5, False)])))
    c = limiter.register("C", config(group([("R1", 1, False), ("R3", 7, False), ("R4", 2, False)])))
    assert limiter.available == {(0, "R1"): 4, (0, "R2"): 5, (0, "R3"): 10, (0, "R4"): 5}
    limiter.unregister(c)
    assert limiter.available == {(0, "R1"): 4, (0, "R2"): 5, (0, "R3"): 10, (0, "R4"): 5}


def test_explicit_counts_per_device_and_global() -> None:
    explicit = [parse_resource(t) for t in ("R1:10", "R2:5:0", "R2:8:1", "R3:2")]
    limiter = RateLimiter(explicit)
    gpus = {"kind": "KIND_GPU", "gpus": [0, 1]}
    limiter.register("A", config({**group([("R1", 1, False), ("R2", 1, False)]), **gpus}))
    limiter.register("B", config(group([("R3", 1, True)])))
    assert limiter.available == {(0, "R1"): 10, (1, "R1"): 10, (0, "R2"): 5, (1, "R2"): 8, (GLOBAL, "R3"): 2}


def test_limits_refused_in_tritons_words() -> None:
    limiter = RateLimiter([("R1", 1, PER_DEVICE)])
    with pytest.raises(RateLimitError) as e:
        limiter.register("A", config(group([("R1", 2, False)])))
    assert str(e.value) == (
        'Resource count for "R1" is limited to 1 which will prevent scheduling of one or more model '
        "instances, the minimum required count is 2"
    )
    assert limiter.models == []  # nothing was added
    mixed = RateLimiter()
    mixed.register("A", config(group([("R1", 1, True)])))
    with pytest.raises(RateLimitError, match='Resource "R1" is present as both global and device-specific'):
        mixed.register("B", config(group([("R1", 1, False)])))


@pytest.mark.parametrize("text", ["R1", "R1:x", "R1:1:2:3", ":1", "R1:-1"])
def test_bad_flag_values(text: str) -> None:
    with pytest.raises(ValueError, match="--rate-limit-resource option format is"):
        parse_resource(text)


def test_instances_of_groups() -> None:
    gpus = group([("R", 1, False)], count=2, kind="KIND_GPU", gpus=[0, 1])
    found = instances_of(config(gpus, {"kind": "KIND_CPU", "count": 1}))
    # Triton's order (core backend_model.cc): each of a group's `count`, on each of its GPUs
    assert found == [({(0, "R"): 1}, 0), ({(1, "R"): 1}, 0)] * 2 + [({}, 0)]


def test_waiting_instances_go_by_executions_times_priority() -> None:
    async def scenario() -> list[str]:
        limiter = RateLimiter()
        a = limiter.register("a", config(group([("R", 1, False)], priority=1)))
        b = limiter.register("b", config(group([("R", 1, False)], priority=3)))
        order: list[str] = []

        async def run(model, name: str) -> None:
            instance = await limiter.acquire(model)
            order.append(name)
            await asyncio.sleep(0)
            limiter.release(instance)

        held = await limiter.acquire(a)  # R is busy: the others queue
        tasks = [asyncio.create_task(run(m, n)) for m, n in [(b, "b1"), (a, "a1"), (a, "a2"), (b, "b2")]]
        await asyncio.sleep(0)
        limiter.release(held)  # a has executed once (scaled 1 x 1), b never (0 x 3): b first
        await asyncio.gather(*tasks)
        return order

    # then a (1) before b (1 x 3), a again (2) before b, and b last
    assert asyncio.run(scenario()) == ["b1", "a1", "a2", "b2"]


def test_a_cancelled_wait_frees_its_instance() -> None:
    async def scenario() -> None:
        limiter = RateLimiter()
        a = limiter.register("a", config(group([("R", 1, False)])))
        b = limiter.register("b", config(group([("R", 1, False)])))
        held = await limiter.acquire(a)
        gone = asyncio.create_task(limiter.acquire(b))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        limiter.release(held)
        assert limiter.allocated == {(0, "R"): 0}
        instance = await asyncio.wait_for(limiter.acquire(b), 5)  # b's instance is free again
        limiter.release(instance)

    asyncio.run(scenario())
