"""The messages between the server's processes, typed: one `msgspec.Struct` per kind, tagged with the
kind's number, encoded as a MessagePack array `[kind, field, field, ...]` (codec/framing.py frames them).
Each receiver decodes with the union of what it may receive, so a message whose fields do not match its
kind is refused by the decoder with the field's name, not unpacked wrongly; handlers dispatch with
`match`. vLLM's engine messages are the model.

Two links use them: a front-end worker and its engine (server/frontend.py, server/engine.py), and the
server and a python model's process (server/backends/process.py, instance.py, stub.py). A kind means the
same on both; a few carry other fields on each (a RESULT is an inference answer to a worker, a batch's
answers from a model's process), so each link has its own classes for those.

Not compiled (pyproject [tool.tensorgate] compiled): msgspec builds its Structs from class annotations,
and the encoding and decoding run in msgspec's own C code either way.
"""

from __future__ import annotations

from typing import Any

import msgspec

# The kinds: a message's first element.
INFER, STREAM, HTTP, GRPC = 1, 2, 3, 4  # a call starts: inference, a streamed one, a route, a gRPC method
CALL = 5  # a model's process -> the server: a BLS request
MESSAGE, END, CANCEL = 6, 7, 8  # within a call, either way: a piece of a stream, its end, a cancel
RESULT, ERROR, EVENT = 9, 10, 11  # a call's answer, its error; engine -> worker: news for every worker
MORE = 12  # a stream's reader took messages: the sender may send that many more beyond AHEAD
RELEASE = 13  # every view of a region of the receiver's arena is gone
LOAD, READY, FAILED = 14, 15, 16  # server -> a model's process: the model to load; loaded, or why not
EXECUTE = 17  # server -> a model's process: a batch
LOG = 18  # a model's process -> the server: a line for the server's log (pb_utils.Logger)
REPLY = 19  # server -> a model's process: a BLS call's answer
STOP = 20  # server -> a model's process: finalize and exit
COMPLETE = 21  # server -> a model's process: auto_complete_config (answered by READY)
METRIC = 22  # a model's process -> the server: a value for grps's app_monitor
SAMPLED = 23  # engine -> worker: an inference call of its is traced (sent before its answer)
STAMPS = 24  # worker -> engine: a traced call's front-end timestamps, once its answer is out
STATS = 25  # worker -> engine: the statistics of the model instances the worker runs itself
AHEAD = 8  # a stream's messages in flight beyond those its reader took


class Tensor(msgspec.Struct, array_like=True):
    """A tensor on either link: its v2 datatype and shape, and its data: the bytes (the v2 binary
    layout: C order, little-endian, BYTES length-prefixed), or where they lie in shared memory
    ([arena, offset, nbytes]; server/arena.py), or None (a client's shared-memory region, which the engine
    reads). `parameters` only on the workers' link. A python model's process has one Region: its arena is
    always 0."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes | list[int] | None
    parameters: dict[str, Any] | None = None


# ------------------------------------------------------------------------- a worker and its engine


class Output(msgspec.Struct, array_like=True):
    """An output a request asks for."""

    name: str
    binary: bool | None
    parameters: dict[str, Any] | None
    class_count: int


class Request(msgspec.Struct, array_like=True):
    model_name: str
    model_version: str
    id: str | None
    parameters: dict[str, Any] | None
    inputs: list[Tensor]
    outputs: list[Output] | None
    binary_output: bool
    shared_memory: bool
    sequence_id: int | str
    sequence_flags: int


class Response(msgspec.Struct, array_like=True):
    model_name: str
    model_version: str
    id: str | None
    parameters: dict[str, Any] | None
    outputs: list[Tensor]


class Infer(msgspec.Struct, tag=INFER, array_like=True):
    call: int
    request: Request


class Stream(msgspec.Struct, tag=STREAM, array_like=True):
    call: int
    request: Request


class Http(msgspec.Struct, tag=HTTP, array_like=True):
    """A route the worker does not serve itself, forwarded whole (its body inflated already)."""

    call: int
    port: str
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


class Grpc(msgspec.Struct, tag=GRPC, array_like=True):
    """A gRPC method the worker does not serve itself: its messages follow as Message, then End."""

    call: int
    path: str
    metadata: list[tuple[str, Any]]


class Message(msgspec.Struct, tag=MESSAGE, array_like=True):
    """A piece of a stream: a streamed inference answer, a chunk of an HTTP answer, a gRPC message."""

    call: int
    payload: Response | bytes


class End(msgspec.Struct, tag=END, array_like=True):
    """A stream's end: after a forwarded HTTP answer, its trailers; after a gRPC call, [status, text]."""

    call: int
    payload: Any = None


class Cancel(msgspec.Struct, tag=CANCEL, array_like=True):
    call: int


class More(msgspec.Struct, tag=MORE, array_like=True):
    call: int
    count: int


class Release(msgspec.Struct, tag=RELEASE, array_like=True):
    offset: int


class Event(msgspec.Struct, tag=EVENT, array_like=True):
    """News for a worker ("models": the model table; "online"; "logs"; "tracing": whether the engine
    traces; "stats": send your Stats now), or its acks ("ack", "serving")."""

    name: str
    payload: Any


class Result(msgspec.Struct, tag=RESULT, array_like=True):
    call: int
    response: Response


class Answer(msgspec.Struct, tag=HTTP, array_like=True):
    """A forwarded HTTP route's answer: its body whole, or None when chunks follow (Message, then End)."""

    call: int
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    trailers: list[tuple[bytes, bytes]] | None


class Error(msgspec.Struct, tag=ERROR, array_like=True):
    """A call failed: the error kind's value (codec.errors.ErrorKind) and the message for the client."""

    call: int
    kind: str
    message: str


class Sampled(msgspec.Struct, tag=SAMPLED, array_like=True):
    """The engine traced this inference call (Infer or Stream); it writes the trace once the worker
    sends the call's front-end timestamps (Stamps). Only traced calls have one."""

    call: int


class Stamps(msgspec.Struct, tag=STAMPS, array_like=True):
    """A Sampled call's front-end timestamps, (name, ns) in the order taken: after its answer went out,
    or at once, empty, when the worker did not time it (the call was over)."""

    call: int
    stamps: list[tuple[str, int]]


class Counts(msgspec.Struct, array_like=True):
    """One model version's statistics counted since the last Counts (batcher/stats.py ModelStats.take)."""

    model: str
    version: int
    inference_count: int
    execution_count: int
    last_inference: int
    durations: list[tuple[int, int]]  # (count, ns) of each of stats.DURATIONS, in order
    batches: list[list[int]]  # [batch size, then (count, ns) of compute_input, compute_infer, compute_output]
    failures: list[int]  # of each of stats.REASONS, in order
    latencies: list[int]  # ns of each request answered


class Stats(msgspec.Struct, tag=STATS, array_like=True):
    """What the model instances a worker runs itself (--worker-models inline) counted since its last
    Stats: sent each second, and at once when the engine asks (Event "stats", `asked` its number; 0: not
    asked)."""

    asked: int
    counts: list[Counts]


TO_ENGINE = Infer | Stream | Http | Grpc | Message | End | Cancel | More | Release | Event | Stamps | Stats
TO_WORKER = Result | Answer | Error | Message | End | Release | Event | Sampled


# ------------------------------------------------------------------ the server and a model's process


class Load(msgspec.Struct, tag=LOAD, array_like=True):
    """The model a process loads, as instance `instance`; its Region is `arena_size` bytes so far."""

    config: dict[str, Any]
    version: int
    version_dir: str
    instance: int
    arena_size: int


class Complete(msgspec.Struct, tag=COMPLETE, array_like=True):
    """auto_complete_config, run in a short-lived process; answered by Ready with the config as JSON."""

    config: dict[str, Any]
    version_dir: str


class Ready(msgspec.Struct, tag=READY, array_like=True):
    """Loaded: what the model offers ({"triton": ...}); or the completed config (JSON)."""

    info: Any


class Failed(msgspec.Struct, tag=FAILED, array_like=True):
    reason: str


class TraceRef(msgspec.Struct, array_like=True):
    """A traced request's trace as its model's process knows it: the server's key for it (a BLS call
    naming it is traced as its child) and the client's traceparent."""

    key: int
    traceparent: str | None


class Meta(msgspec.Struct, array_like=True):
    """What a Triton-API model reads of a request besides its tensors."""

    id: str
    correlation_id: int | str
    flags: int
    parameters: str  # JSON
    requested: list[str] | None  # None: every output
    trace: TraceRef | None


class Batched(msgspec.Struct, array_like=True):
    """One request of a batch: its tensors, and (Triton's API) what else it carries."""

    inputs: list[Tensor]
    meta: Meta | None


class Execute(msgspec.Struct, tag=EXECUTE, array_like=True):
    """A batch. Triton's API: each request apart; ours: one entry, the batch's arrays, and its custom
    parameters. `end`: where the inputs in the Region end (the outputs go after them), or -1: a small
    batch, whose tensors travel in the message and whose outputs come back the same way."""

    call: int
    arena_size: int
    requests: list[Batched]
    end: int
    parameters: dict[str, Any] | None


class Open(msgspec.Struct, tag=STREAM, array_like=True):
    """A streamed request (its tensors in the message): answered by Parts, then End (or Raised)."""

    call: int
    inputs: list[Tensor]
    meta: Meta | None
    parameters: dict[str, Any] | None


class Answered(msgspec.Struct, array_like=True):
    """One request's answer: its outputs, or (outputs None) a TritonError's code and message."""

    outputs: list[Tensor] | None
    code: int = 0
    message: str = ""


class Outputs(msgspec.Struct, tag=RESULT, array_like=True):
    """A batch's answer. Triton's API: one Answered a request; ours: the outputs, or (None) the type
    name of what execute returned instead of a dict."""

    call: int
    arena_size: int
    answers: list[Answered] | None = None
    outputs: list[Tensor] | None = None
    returned: str = ""


class Raised(msgspec.Struct, tag=ERROR, array_like=True):
    """A batch or stream failed: an InferError's kind name (None: any other exception), its message,
    and the traceback for the server's log."""

    call: int
    kind: str | None
    message: str
    traceback: str = ""


class Part(msgspec.Struct, tag=MESSAGE, array_like=True):
    """One answer of a stream (outputs None: a TritonError's code and message)."""

    call: int
    answer: Answered


class Log(msgspec.Struct, tag=LOG, array_like=True):
    level: int
    text: str


class Metric(msgspec.Struct, tag=METRIC, array_like=True):
    name: str
    aggregation: str
    value: float


class Call(msgspec.Struct, tag=CALL, array_like=True):
    """A BLS request from a model's process, answered by Reply."""

    call: int
    model: str
    version: int
    inputs: list[Tensor]
    requested: list[str]
    request_id: str
    correlation_id: int | str
    flags: int
    parameters: str  # JSON
    decoupled: bool
    trace: int | None  # the key of the trace it is a child of


class Reply(msgspec.Struct, tag=REPLY, array_like=True):
    call: int
    answers: list[Answered]


class Stop(msgspec.Struct, tag=STOP, array_like=True):
    """Finalize and exit."""


TO_MODEL = Load | Complete | Execute | Open | Cancel | More | Reply | Stop
FROM_MODEL = Ready | Failed | Outputs | Raised | Part | End | Log | Metric | Call
