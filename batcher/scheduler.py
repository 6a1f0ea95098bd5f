"""How a model version's requests reach its backend, written down as Triton's src/scheduler.h writes it
(Enqueue, InflightInferenceCount, Stop): the `Scheduler` interface, and `Job`, one request as a
scheduler takes it.

Three implementations: `batcher.direct.DirectScheduler` without `dynamic_batching` (each request executes
alone), `batcher.dynamic.DynamicBatcher` with it, and `batcher.sequence.SequenceBatcher` with
`sequence_batching` (stateful models). The server (server/model.py) reads nothing else of any.
"""

from __future__ import annotations

from typing import Any, Protocol

from tensorgate.codec.trace import Trace

Arrays = dict[str, Any]


class Job:
    """One request as a scheduler takes it: the arrays the model executes on (input name -> array, the
    batch dimension first when the model batches), its `rows` (its batch size, 1 without batching), the
    request parameters `priority` and `timeout_us` (microseconds in the queue) that the dynamic batcher
    heeds, and the request itself (codec.tensor.InferRequest), which a per-request backend reads beside
    its arrays (Triton's python API, server/backends/triton_python.py), and the request's trace when it
    was sampled (codec/trace.py): the scheduler stamps QUEUE_START and the executor's timestamps into it.

    The other slots are the dynamic batcher's, set while the job waits in its queue (batcher/queue.py):
    a job is the one object per request from the server to the batch that answers it.
    """

    __slots__ = (
        "inputs",
        "rows",
        "priority",
        "timeout_us",
        "request",
        "trace",
        # the dynamic batcher's
        "size",  # what the job counts for against max_batch_size (zero rows count as one, as in Triton)
        "signature",  # what jobs must share to share a batch (batcher/dynamic.py `signature`)
        "arrival_ns",
        "deadline_ns",  # set when the job has a timeout in its queue
        "level",  # its priority level
        "future",  # what its caller awaits
        "where",  # QUEUED, DELAYED or OUT (batcher/queue.py)
        # the sequence batcher's (batcher/sequence.py)
        "sequence",  # the sequence it belongs to
    )

    def __init__(
        self,
        inputs: Arrays,
        rows: int = 1,
        priority: int = 0,
        timeout_us: int = 0,
        request: Any = None,
        trace: Trace | None = None,
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.priority = priority
        self.timeout_us = timeout_us
        self.request = request
        self.trace = trace


class Scheduler(Protocol):
    """What the server reads of a model version's scheduler."""

    now: bool  # `run_now` may stand in for `run`: it never waits (numpy on the event loop)
    pending: int  # requests queued, not yet executing (Triton's nv_inference_pending_request_count)

    async def run(self, job: Job) -> Arrays:
        """Enqueue: the model's outputs for this request (its rows of its batch's outputs); raises the
        InferError that answers it (a full queue, a timeout, the model's failure)."""
        ...

    def run_now(self, inputs: Arrays, rows: int = 1) -> Arrays:
        """`run` as a plain call, where `now` says it never waits: the hot path of small models."""
        ...

    async def drain(self) -> None:
        """Returns once no request is queued or executing (Triton's InflightInferenceCount reaching 0)."""
        ...

    def close(self) -> None:
        """Stop: releases timers; called after `drain`, at unload."""
        ...
