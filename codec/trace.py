"""A request's trace (Triton's trace extension): what the server records of one sampled request, and how
Triton's JSON trace output writes it.

A `Trace` rides on the request (`InferRequest.trace`, None for the requests not sampled). Whoever handles
the request stamps it where it records its statistics: the model version REQUEST_START and REQUEST_END
(server/model.py), the schedulers QUEUE_START and the executor's COMPUTE_START, COMPUTE_INPUT_END,
COMPUTE_OUTPUT_START and COMPUTE_END (batcher/). Times are nanoseconds of the monotonic clock
(time.perf_counter_ns and time.monotonic_ns are CLOCK_MONOTONIC on Linux), as Triton's steady clock.
A model called for the request (an ensemble's step, a BLS call given `trace=request.trace()`) gets a
child trace, with this one's id as its parent_id; they are written together, as Triton writes them.
Its front end adds Triton's front-end timestamps (HTTP_RECV_START ... GRPC_SEND_END, named in
server/tracing/frontend.py) to the top trace (`front`); they are written in the same trace, as Triton's
CaptureTimestamp writes them.

Plain data (ints, strings, lists, tuples): a trace can be sent between processes with its request.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TIMESTAMPS, TENSORS = "TIMESTAMPS", "TENSORS"
LEVELS = (TIMESTAMPS, TENSORS)  # the order Triton lists them in
REQUEST_START, QUEUE_START, REQUEST_END = "REQUEST_START", "QUEUE_START", "REQUEST_END"
COMPUTE_START, COMPUTE_INPUT_END = "COMPUTE_START", "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START, COMPUTE_END = "COMPUTE_OUTPUT_START", "COMPUTE_END"
QUEUE_INPUT, BACKEND_OUTPUT = "TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"

_ids = itertools.count(1)  # trace ids, unique in the process, as Triton numbers its traces from 1


@dataclass(slots=True)
class Trace:
    id: int
    level: tuple[str, ...]  # what is recorded: TIMESTAMPS, TENSORS or both
    parent_id: int = 0  # the trace of the request that called this model (0: none)
    model_name: str = ""  # set when the request reaches its model version
    model_version: int = 0
    request_id: str = ""
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    # (activity, tensor name, datatype, shape, data as Triton writes it)
    tensors: list[tuple[str, str, str, tuple[int, ...], str]] = field(default_factory=list)
    children: list[Trace] = field(default_factory=list)
    front: list[tuple[str, int]] = field(default_factory=list)  # its front end's timestamps
    traceparent: str = ""  # the W3C trace context the client sent, when valid (OpenTelemetry's parent)
    tracestate: str = ""
    sampled_by: str | None = None  # the setting that took it: "" the global one, else its model's

    @classmethod
    def new(cls, level: tuple[str, ...], traceparent: str = "", tracestate: str = "") -> Trace:
        return cls(next(_ids), level, traceparent=traceparent, tracestate=tracestate)

    def child(self) -> Trace:
        """The trace of a model called for this request."""
        spawned = Trace(next(_ids), self.level, parent_id=self.id)
        self.children.append(spawned)
        return spawned

    def stamp(self, name: str, ns: int) -> None:
        if TIMESTAMPS in self.level:
            self.timestamps.append((name, ns))

    def stamp_front(self, name: str, ns: int) -> None:
        """A front-end timestamp (the request's receipt or its answer's sending)."""
        if TIMESTAMPS in self.level:
            self.front.append((name, ns))

    def compute(self, start_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """An execution's four timestamps, from its start and the length of each phase (the executor's
        Result, batcher/execution.py)."""
        if TIMESTAMPS in self.level:
            input_end = start_ns + input_ns
            output_start = input_end + infer_ns
            self.timestamps += (
                (COMPUTE_START, start_ns),
                (COMPUTE_INPUT_END, input_end),
                (COMPUTE_OUTPUT_START, output_start),
                (COMPUTE_END, output_start + output_ns),
            )

    @property
    def records_tensors(self) -> bool:
        return TENSORS in self.level

    def tensor(self, activity: str, name: str, datatype: str, data: Any) -> None:
        array = np.asarray(data)
        self.tensors.append((activity, name, datatype, tuple(array.shape), tensor_text(array, datatype)))

    def walk(self) -> list[Trace]:
        """This trace and every trace spawned under it, parents first."""
        found = [self]
        for spawned in self.children:
            found += spawned.walk()
        return found


def tensor_text(array: np.ndarray, datatype: str) -> str:
    """A tensor's elements as Triton's trace writes them: comma separated; BYTES each in double quotes;
    FP16 and BF16 empty (Triton writes none for them); BOOL as 1 and 0."""
    if datatype in ("FP16", "BF16"):
        return ""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        texts = (e.decode("utf-8", "replace") if isinstance(e, bytes) else str(e) for e in flat)
        return ",".join(f'"{text}"' for text in texts)
    if datatype == "BOOL":
        return ",".join("1" if e else "0" for e in flat)
    if datatype in ("FP32", "FP64"):
        return ",".join(f"{float(e):g}" for e in flat)  # C++'s default stream precision, as Triton's
    return ",".join(str(int(e)) for e in flat)


def triton_json(trace: Trace) -> list[dict[str, Any]]:
    """The trace and its children as the objects of Triton's JSON trace output: per trace, its
    model_name / model_version (request_id, parent_id when set), each timestamp, each tensor. A trace
    that never reached a model (the request failed first) writes nothing. Front-end timestamps taken
    before the request reached its model come before its own, the others after (Triton's order)."""
    entries: list[dict[str, Any]] = []
    for one in trace.walk():
        if not one.model_name:
            continue
        head: dict[str, Any] = {"id": one.id, "model_name": one.model_name}
        head["model_version"] = one.model_version
        if one.request_id:
            head["request_id"] = one.request_id
        if one.parent_id:
            head["parent_id"] = one.parent_id
        entries.append(head)
        stamps = one.timestamps
        if one.front:
            first = stamps[0][1] if stamps else 0
            before = [stamp for stamp in one.front if stamp[1] < first]
            stamps = before + stamps + [stamp for stamp in one.front if stamp[1] >= first]
        entries += ({"id": one.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in stamps)
        entries += (
            {
                "id": one.id,
                "activity": activity,
                "tensor": {"name": name, "data": data, "shape": ",".join(map(str, shape)), "dtype": datatype},
            }
            for activity, name, datatype, shape, data in one.tensors
        )
    return entries


# W3C trace context, version 00 and later: version-traceid-parentid-flags, lowercase hex
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def valid_traceparent(value: str) -> bool:
    """Whether a `traceparent` header holds a usable W3C trace context (not version ff, no all-zero id)."""
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return False
    version, trace_id, parent_id, _, rest = found.groups()
    if version == "ff" or (version == "00" and rest):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16
