"""The sequence batcher's `oldest` strategy (Triton's OldestSequenceBatch): candidate sequences feed a
dynamic batcher, at most one request of a sequence at a time, so a batch holds at most one request of
each sequence and a sequence's requests execute in order.

`oldest { max_candidate_sequences, preferred_batch_size, max_queue_delay_microseconds,
preserve_ordering }`: up to max_candidate_sequences sequences per instance (instance_group count) are
candidates; the others wait in the backlog. The dynamic batcher (batcher/dynamic.py) forms batches from
the oldest requests of the candidates with the other three settings, as dynamic_batching would, and
counts the statistics as it does. Its answers come back through `finished` (the sequence keeps its state
and sends its next request) before they reach their callers.

Unlike Triton, whose candidates each belong to one model instance with a dynamic batcher of its own, the
candidates here share one dynamic batcher feeding every instance: the instances of a model share one
model object here (server/backends), so a sequence is at home on any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorgate.batcher.dynamic import DynamicBatcher
from tensorgate.batcher.sequence_inputs import state_outputs

if TYPE_CHECKING:
    from tensorgate.batcher.clock import Clock
    from tensorgate.batcher.execution import Executor
    from tensorgate.batcher.scheduler import Job
    from tensorgate.batcher.sequence import Sequence, SequenceBatcher
    from tensorgate.batcher.stats import ModelStats


class OldestStrategy:
    def __init__(
        self, core: SequenceBatcher, executor: Executor, config: dict, stats: ModelStats, clock: Clock
    ) -> None:
        self.core = core
        oldest = config["sequence_batching"]["oldest"]
        listed = {e["name"] for e in config.get("output", ())}
        states = [{"name": n, "data_type": t} for n, t in state_outputs(config).items() if n not in listed]
        batching = {
            "max_batch_size": config.get("max_batch_size", 0),
            "dynamic_batching": {
                "preferred_batch_size": oldest["preferred_batch_size"],
                "max_queue_delay_microseconds": oldest["max_queue_delay_microseconds"],
                "preserve_ordering": oldest["preserve_ordering"],
            },
            "output": [*config.get("output", ()), *states],  # the state outputs come back too
        }
        self.batcher = DynamicBatcher(executor, batching, stats, clock)
        self.batcher.on_answer = core.finished
        self.free = executor.instances * oldest["max_candidate_sequences"]

    @property
    def pending(self) -> int:
        return self.batcher.pending

    def bind(self, sequence: Sequence) -> bool:
        if not self.free:
            return False
        self.free -= 1
        sequence.slot = True  # a candidate
        return True

    def release(self, sequence: Sequence) -> None:
        self.free += 1
        sequence.slot = None

    def ready(self, sequence: Sequence) -> None:
        self.core.prepare(sequence)
        self.batcher.enqueue(self.core.take(sequence))

    def withdraw(self, job: Job) -> bool:
        return self.batcher.withdraw(job)

    async def drain(self) -> None:
        await self.batcher.drain()

    def close(self) -> None:
        self.batcher.close()
