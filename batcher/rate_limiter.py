"""Triton's rate limiter (`--rate-limit execution_count`): a model instance executes a batch only once the
resources its instance group asks for (`instance_group { rate_limiter { resources [...] priority: N } }`)
are free, and the instances waiting for resources take turns by priority, across all models.

As Triton's core src/rate_limiter.cc:
- a resource is per device unless `global: true` (one count for the whole server); an instance asks for it
  on its device (KIND_CPU instances: device 0);
- a resource's available count is the largest count any loaded instance asks for, unless
  `--rate-limit-resource` names it (then that count; with any `--rate-limit-resource` given, a resource it
  does not name has count 0). A count below what an instance asks for fails that instance's load;
- an instance asks to execute when its model has a batch for it; the asking instances wait in one queue
  ordered by `executions * max(priority, 1)` (an instance that has executed less, or has a smaller priority
  value, goes first); the head of the queue executes as soon as its resources are free, and the others wait
  behind it (a lower-priority instance never overtakes one whose resources are busy).

Where we differ: a model whose instance groups give no `rate_limiter` is not rate-limited at all (Triton
orders it in the same queue with no resources: it could wait behind an instance waiting for resources);
and after each release every head whose resources are free executes, not just one.

Batches acquire and release instances on the server's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import threading
from collections import deque
from itertools import count

from tensorgate.batcher.staging import placements

GLOBAL = -2  # the device of a global resource
PER_DEVICE = -1  # --rate-limit-resource without a device: every device

ResourceKey = tuple[int, str]  # (device or GLOBAL, name)


class RateLimitError(ValueError):
    """A model's rate_limiter that the server's resources cannot satisfy (its load fails)."""


def parse_resource(text: str) -> tuple[str, int, int]:
    """`<name>:<count>[:<device>]` (--rate-limit-resource) -> (name, count, device or PER_DEVICE)."""
    error = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(error)
    try:
        count_ = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else PER_DEVICE
    except ValueError:
        raise ValueError(error) from None
    if count_ < 0 or device < PER_DEVICE:
        raise ValueError(error)
    return parts[0], count_, device


def resource_flag(text: str) -> tuple[str, int, int]:
    """`parse_resource` as an argparse type (--rate-limit-resource)."""
    try:
        return parse_resource(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Instance:
    """One model instance as the rate limiter sees it: what it holds while it executes, its priority."""

    __slots__ = ("model", "needs", "priority", "executions", "order")

    def __init__(self, model: Limited, needs: dict[ResourceKey, int], priority: int, order: int) -> None:
        self.model = model
        self.needs = needs
        self.priority = max(priority, 1)  # 0 counts as 1, as in Triton
        self.executions = 0
        self.order = order

    def rank(self) -> tuple[int, int]:
        """Its place in a queue: the smaller first (Triton's ScaledPriority), ties in instance order."""
        return self.executions * self.priority, self.order


class Limited:
    """A model version's instances in the rate limiter, and its batches waiting for one of them."""

    def __init__(
        self,
        limiter: RateLimiter,
        label: str,
        instances: list[tuple[dict[ResourceKey, int], int]],
        first: int,
    ) -> None:
        self.limiter = limiter
        self.label = label
        self.instances = [Instance(self, needs, prio, first + i) for i, (needs, prio) in enumerate(instances)]
        self.free = [(i.rank(), i) for i in self.instances]  # a heap of the instances not executing
        heapq.heapify(self.free)
        self.waiting: deque[asyncio.Future] = deque()  # batches waiting for an instance of the model


def instances_of(config: dict) -> list[tuple[dict[ResourceKey, int], int]]:
    """Each instance of a model config (as its instance groups place them, batcher/staging.py): the
    resources it asks for on its device, and its priority."""
    out = []
    for placed in placements(config):
        limiter = placed.group.get("rate_limiter") or {}
        needs = {
            (GLOBAL if r.get("global") else placed.device_id, r["name"]): int(r.get("count", 0))
            for r in limiter.get("resources", ())
        }
        out.append((needs, int(limiter.get("priority", 0))))
    return out


def limits_config(config: dict) -> bool:
    """Whether a model's config gives any instance group a `rate_limiter`."""
    return any("rate_limiter" in group for group in config.get("instance_group") or ())


class RateLimiter:
    def __init__(self, explicit: list[tuple[str, int, int]] | None = None) -> None:
        """`explicit`: the --rate-limit-resource values, (name, count, device or PER_DEVICE)."""
        self.explicit = list(explicit or ())
        self.models: list[Limited] = []
        self.available: dict[ResourceKey, int] = {}
        self.allocated: dict[ResourceKey, int] = {}
        self._staged: list[tuple[tuple[int, int], int, Instance, asyncio.Future]] = []  # a heap
        self._order = count()
        # Models load in threads (--model-load-thread-count): their registrations take turns. The rest
        # runs on the event loop, which only reads `available` (replaced whole).
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------- models

    def register(self, label: str, config: dict) -> Limited:
        """Adds a model version's instances; raises RateLimitError, in Triton's words, where the resources
        cannot satisfy them (nothing is added then)."""
        with self._lock:
            model = Limited(self, label, instances_of(config), next(self._order) * 1_000_000)
            self.available = self._limits([*self.models, model])
            self.models.append(model)
        return model

    def unregister(self, model: Limited) -> None:
        with self._lock:
            if model in self.models:
                self.models.remove(model)
                self.available = self._limits(self.models)

    def _limits(self, models: list[Limited]) -> dict[ResourceKey, int]:
        """Each resource's available count with these models loaded (Triton's ResourceManager)."""
        wanted: dict[ResourceKey, int] = {}
        for model in models:
            for instance in model.instances:
                for key, need in instance.needs.items():
                    wanted[key] = max(wanted.get(key, 0), need)
        global_names = {name for device, name in wanted if device == GLOBAL}
        for device, name in wanted:
            if device != GLOBAL and name in global_names:
                raise RateLimitError(
                    f'Resource "{name}" is present as both global and device-specific resource in the '
                    "model configuration."
                )
        if not self.explicit:
            return wanted
        limits = {}
        for (device, name), need in wanted.items():
            given = [
                c
                for n, c, d in self.explicit
                if n.lower() == name.lower() and (device == GLOBAL or d in (device, PER_DEVICE))
            ]
            limit = max(given, default=0)
            if limit < need:
                raise RateLimitError(
                    f'Resource count for "{name}" is limited to {limit} which will prevent scheduling of '
                    f"one or more model instances, the minimum required count is {need}"
                )
            limits[(device, name)] = limit
        return limits

    # ---------------------------------------------------------------------------------------- execution

    async def acquire(self, model: Limited) -> Instance:
        """An instance of `model` whose resources are now held: its batch may execute. `release` it after."""
        future = asyncio.get_running_loop().create_future()
        model.waiting.append(future)
        self._stage(model)
        self._allocate()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            else:
                self._withdraw(model, future)
            raise

    def release(self, instance: Instance) -> None:
        """The instance's batch is over: its resources are free, and it may take its model's next batch."""
        for key, need in instance.needs.items():
            self.allocated[key] -= need
        instance.executions += 1
        model = instance.model
        heapq.heappush(model.free, (instance.rank(), instance))
        self._stage(model)
        self._allocate()

    def _stage(self, model: Limited) -> None:
        """Pairs the model's waiting batches with its free instances, which then queue for resources."""
        while model.free and model.waiting:
            instance = heapq.heappop(model.free)[1]
            heapq.heappush(
                self._staged, (instance.rank(), next(self._order), instance, model.waiting.popleft())
            )

    def _allocate(self) -> None:
        """The queue's heads execute while their resources are free."""
        staged = self._staged
        while staged:
            instance, future = staged[0][2], staged[0][3]
            available, allocated = self.available, self.allocated
            if any(allocated.get(k, 0) + n > available.get(k, 0) for k, n in instance.needs.items()):
                return
            heapq.heappop(staged)
            for key, need in instance.needs.items():
                allocated[key] = allocated.get(key, 0) + need
            future.set_result(instance)

    def _withdraw(self, model: Limited, future: asyncio.Future) -> None:
        """A batch that stopped waiting (its task was cancelled): its instance, if staged, is free again."""
        if future in model.waiting:
            model.waiting.remove(future)
            return
        for i, entry in enumerate(self._staged):
            if entry[3] is future:
                instance = entry[2]
                self._staged.pop(i)
                heapq.heapify(self._staged)
                heapq.heappush(model.free, (instance.rank(), instance))
                self._stage(model)
                self._allocate()
                return
