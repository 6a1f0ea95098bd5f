"""A front-end worker (`tensorgate serve --workers N` runs N): our transport, the routers, the codecs and
the inference endpoints on its own event loop and its own core, over listening sockets it shares with
the other workers. The models, their batchers and statistics, client shared-memory regions and every
other route are the engine's (server/engine.py), reached over a Unix socket (server/link.py): the worker's
EngineClient (server/engine_client.py) is `LinkedEngine`.

- Inference (v2 REST infer and generate, ModelInfer and ModelStreamInfer, TF Serving predict / classify /
  regress, grps predict) is decoded and answered here: the request crosses to the engine as tensors
  (codec/ipc.py), its answer comes back as tensors, and a batch there mixes requests from every worker.
  Large tensors cross in shared memory (server/arena.py): a body of a MiB or more is received straight
  into this worker's arena, so its binary tensors reach the engine without a copy.
- With --worker-models inline, a model that runs inline also runs here (server/worker_models.py), and
  its requests are answered without crossing; its statistics go to the engine.
- Every other route and gRPC method (metadata, health, statistics, the repository API, shared-memory
  registration, metrics, the monitor page, grps' customized HTTP, ...) is forwarded whole, its answer
  (streamed ones too) relayed: the engine answers it as the one server it is.
- A worker resolves models in its copy of the engine's model table, which the engine sends at start and
  after every change (a repository call answers only once every worker has the change).
- A client that goes away, or a gRPC deadline, cancels its call in the engine too.
- Tracing: the engine samples and writes every trace (one count, one file). While its tracer is on, a
  worker times the front end of each inference request it serves itself (WorkerTracer); when the
  engine traced one (SAMPLED), the worker sends it the request's front-end timestamps once the answer
  is out (STAMPS), and the engine writes them in the trace (server/worker_link.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import msgspec
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from tensorgate.codec import ipc
from tensorgate.codec import messages as msg
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.framing import FrameReader
from tensorgate.codec.tensor import InferRequest, InferResponse
from tensorgate.codec.trace import TIMESTAMPS, Trace
from tensorgate.server import assembly, kin
from tensorgate.server.arena import Arena, LinkArenas
from tensorgate.server.grpc.inference import RawMessage
from tensorgate.server.http import buffers
from tensorgate.server.http.grpc_call import GrpcCall
from tensorgate.server.http.listener import Offline, raise_fd_limit
from tensorgate.server.link import Inbox, Link
from tensorgate.server.log_settings import LogControl
from tensorgate.server.model import ModelVersion
from tensorgate.server.router import HttpRequest, HttpResponse
from tensorgate.server.tracing.frontend import Timing
from tensorgate.server.worker_models import EngineTable, LocalModels

log = logging.getLogger("tensorgate.worker")
_FROM_ENGINE = msgspec.msgpack.Decoder(msg.TO_WORKER)

ENGINE_GONE = signal.SIGUSR2  # what the kernel sends a worker when its engine dies


def error_of(message: msg.Error) -> InferError:
    return InferError(ErrorKind(message.kind), message.message)


def error_message(call_id: int, error: InferError) -> msg.Error:
    return msg.Error(call_id, error.kind.value, error.message)


# ------------------------------------------------------------------------------ the engine, from here


class LinkedEngine:
    """The engine as this worker reaches it (an EngineClient, server/engine_client.py): its end of the
    link, the calls it makes and what the engine tells it; and the model versions it runs itself
    (--worker-models inline: LocalModels), which answer without the hop.

    No call waits forever: one the engine has not answered within `call_timeout` seconds (a stream:
    since its last message) fails with UNAVAILABLE and is cancelled in the engine. A sweep each second
    looks: the calls' last-heard times, not a timer per call."""

    def __init__(self, arenas: tuple[Arena, Arena] | None = None, call_timeout: float = 0.0) -> None:
        self.link = Link(self._message, self._lost, self._fault, FrameReader(_FROM_ENGINE))
        self.arenas = None if arenas is None else LinkArenas(*arenas, self._release)
        self.calls: dict[int, asyncio.Future | Inbox] = {}
        self.heard: dict[int, float] = {}  # a call's start, or its stream's last message (loop time)
        self.call_timeout = call_timeout  # 0: none
        self.next_id = 0
        self.gone = asyncio.Event()  # the link closed: the engine is gone
        self.local = LocalModels(self.link, self.gone)
        self.table = EngineTable(self.local)
        self.tracer = WorkerTracer(self)
        self.timed: dict[int, Trace] = {}  # inference calls timed here (while tracing is on): their traces
        self.offline = Offline()
        self.loop = asyncio.get_running_loop()
        self.first_table = self.loop.create_future()  # set once the engine's model table is here
        self.logs: LogControl | None = None  # this process's log, following the engine's settings
        if call_timeout:
            self.loop.call_later(1.0, self._sweep)
        self.loop.call_later(1.0, self.local.tick)

    def _call(self, target: asyncio.Future | Inbox) -> int:
        self.next_id += 1
        self.calls[self.next_id] = target
        self.heard[self.next_id] = self.loop.time()
        return self.next_id

    def _release(self, offset: int) -> None:
        self.link.send(msg.Release(offset))

    def _cancel(self, call_id: int) -> None:
        self.heard.pop(call_id, None)
        if self.calls.pop(call_id, None) is not None and self.link.transport is not None:
            self.link.send(msg.Cancel(call_id))

    def _end(self, call_id: int, error: InferError) -> None:
        """Fails a call the engine will not answer, and tells the engine to drop it."""
        target = self.calls.get(call_id)
        self._cancel(call_id)
        if isinstance(target, Inbox):
            target.put(error_message(call_id, error))
        elif target is not None and not target.done():
            target.set_exception(error)

    def _sweep(self) -> None:
        now = self.loop.time()
        late = now - self.call_timeout
        for call_id in [c for c, heard in self.heard.items() if heard < late]:
            target = self.calls.get(call_id)
            if isinstance(target, Inbox) and target.items:  # its reader is behind, not the engine
                self.heard[call_id] = now
                continue
            limit = f"{self.call_timeout:g} s (--worker-call-timeout)"
            self._end(call_id, InferError(ErrorKind.UNAVAILABLE, f"the engine did not answer within {limit}"))
        if self.link.transport is not None or not self.gone.is_set():
            self.loop.call_later(1.0, self._sweep)

    def _fault(self, message: Any, error: Exception) -> None:
        """Handling a message from the engine raised: its call fails, not silently."""
        call_id = getattr(message, "call", 0)
        if call_id in self.calls:
            reason = f"internal error: the engine's answer could not be read ({type(error).__name__})"
            self._end(call_id, InferError(ErrorKind.INTERNAL, reason))

    # ---- inference

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The version a request reaches: as this worker last heard of it from the engine, or this worker's
        own instance of it, unless the engine traces (it samples and writes every trace)."""
        found = self.table.resolve(name, version)
        if self.local.instances and not self.tracer.on:
            return self.local.instances.get(found, found)
        return found

    def infer(self, version: ModelVersion, request: InferRequest) -> Coroutine[Any, Any, InferResponse]:
        if version.scheduler is not None and not request.shared_memory:  # an instance of this worker's
            return version.infer(request)
        return self._infer(version, request)  # the engine's: client regions are its too

    async def _infer(self, version: ModelVersion, request: InferRequest) -> InferResponse:
        if self.link.paused:  # the engine is not reading: wait here, not in memory
            await self.link.drain()
        request.model_version = version.version_str  # the version this worker resolved
        message = ipc.request_out(request, self.arenas)  # raises when the shared memory is full
        future = self.loop.create_future()
        call_id = self._call(future)
        trace = request.trace
        if trace is not None:  # timed here: the engine may trace it (SAMPLED)
            self.timed[call_id] = trace
        self.link.send(msg.Infer(call_id, message))
        try:
            return await future
        except asyncio.CancelledError:  # the client left, or a deadline passed: so does the request
            self._cancel(call_id)
            raise
        finally:
            self._forget(call_id)
            if trace is not None:
                del self.timed[call_id]

    async def infer_stream(
        self, version: ModelVersion, request: InferRequest
    ) -> AsyncIterator[InferResponse]:
        """Always the engine's: a model this worker runs itself runs inline, and does not stream."""
        if self.link.paused:
            await self.link.drain()
        request.model_version = version.version_str
        message = ipc.request_out(request, self.arenas)
        inbox = Inbox()
        call_id = self._call(inbox)
        trace = request.trace
        if trace is not None:
            self.timed[call_id] = trace
        self.link.send(msg.Stream(call_id, message))
        finished = False
        try:
            while True:
                match await inbox.get():
                    case InferResponse() as response:  # read as it arrived (_message)
                        self._more(call_id)
                        yield response
                    case msg.End():
                        finished = True
                        return
                    case failed:
                        finished = True
                        raise _failure(failed)
        finally:
            if not finished:  # closed early: the client left
                self._cancel(call_id)
            self._forget(call_id)
            if trace is not None:
                del self.timed[call_id]

    # ---- forwarded routes and methods

    async def http(self, port: str, request: HttpRequest) -> HttpResponse:
        """A route this worker does not serve itself, answered by the engine."""
        if self.link.paused:
            await self.link.drain()
        inbox = Inbox()
        call_id = self._call(inbox)
        # the body is as the router handed it: inflated already, if it came compressed
        headers = [(k, v) for k, v in request.headers.items() if k != b"content-encoding"]
        forwarded = msg.Http(
            call_id, port, request.method, request.path, request.query, headers, bytes(request.body)
        )
        self.link.send(forwarded)
        try:
            answer = await inbox.get()
        except BaseException:  # cancelled: the client left
            self._cancel(call_id)
            raise
        if not isinstance(answer, msg.Answer):
            self._forget(call_id)
            raise _failure(answer)
        if answer.body is not None:
            self._forget(call_id)
            return HttpResponse(answer.status, answer.headers, [answer.body], answer.trailers)
        response = HttpResponse(answer.status, answer.headers, [], answer.trailers)
        response.chunks = Relayed(self, call_id, inbox, response)
        return response

    async def grpc(self, path: str, call: GrpcCall) -> None:
        """A gRPC method this worker does not serve itself: its messages relayed both ways."""
        if self.link.paused:
            await self.link.drain()
        inbox = Inbox()
        call_id = self._call(inbox)
        self.link.send(msg.Grpc(call_id, path, list(call.metadata.items())))
        pump = self.loop.create_task(self._pump(call_id, call, inbox))
        finished = False
        try:
            while True:
                match await inbox.get():
                    case GRPCError() as refused:  # the client's message, refused here (its size)
                        raise refused
                    case msg.Message(payload=bytes() as payload):
                        await call.send_message(RawMessage(payload))
                        self._more(call_id)
                        continue
                    case msg.End(payload=[status, text]):
                        finished = True
                        if status:
                            raise GRPCError(Status(status), text)
                        return
                    case failed:
                        finished = True
                        raise _failure(failed)
        finally:
            pump.cancel()
            if not finished:
                self._cancel(call_id)
            self._forget(call_id)

    async def _pump(self, call_id: int, call: GrpcCall, inbox: Inbox) -> None:
        """The client's messages to the engine, as they come; then the end of them. A message the
        transport refuses (over --grpc-max-message-bytes) ends the call with that status."""
        try:
            async for message in call:
                self.heard[call_id] = self.loop.time()
                self.link.send(msg.Message(call_id, bytes(message.data)))
        except GRPCError as refused:
            inbox.put(refused)
            return
        self.link.send(msg.End(call_id))

    def _more(self, call_id: int) -> None:
        """A streamed message taken: the engine may send one more (its wait for us is not its silence)."""
        self.heard[call_id] = self.loop.time()
        self.link.send(msg.More(call_id, 1))

    def _forget(self, call_id: int) -> None:
        self.calls.pop(call_id, None)
        self.heard.pop(call_id, None)

    # ---- from the engine

    def _message(self, message: Any) -> None:
        match message:
            case msg.Release(offset):
                self.arenas.mine.release(offset)  # type: ignore[union-attr]
            case msg.Event(name, payload):
                self._event(name, payload)
            case msg.Sampled(call_id):
                self._sampled(call_id)
            case _:
                call_id = message.call
                target = self.calls.get(call_id)
                if target is None:
                    return  # a call cancelled meanwhile
                # An answer's tensors are taken now, before the messages after it in this read: a
                # tensor that lies in this worker's arena is held by the engine's view until its
                # Release, which may come next (an identity model's output is its input).
                if isinstance(target, Inbox):
                    self.heard[call_id] = self.loop.time()
                    if type(message) is msg.Message and type(message.payload) is msg.Response:
                        target.put(ipc.response_in(message.payload, self.arenas))
                    else:
                        target.put(message)
                elif target.done():
                    return  # cancelled in this loop pass: its task has not yet run to forget it
                elif type(message) is msg.Result:
                    target.set_result(ipc.response_in(message.response, self.arenas))
                else:
                    target.set_exception(_failure(message))

    def _sampled(self, call_id: int) -> None:
        """The engine traced this call: its front-end timestamps go to it once the answer is out (the
        trace keeps the call as its key), or now, none, when the call is no longer here."""
        trace = self.timed.get(call_id)
        if trace is None:
            self.link.send(msg.Stamps(call_id, []))
        else:
            trace.id = call_id

    def _event(self, name: str, payload: Any) -> None:
        if name == "models":
            table, sequence = payload
            self.table.apply(table)
            self.link.send(msg.Event("ack", sequence))
            if not self.first_table.done():
                self.first_table.set_result(None)
        elif name == "online":
            self.offline.set(not payload)
        elif name == "logs" and self.logs is not None:
            self.logs.update(payload)
        elif name == "tracing":
            self.tracer.on = Timing.on = payload
        elif name == "stats":
            self.local.send(payload)

    def _lost(self) -> None:
        for target in self.calls.values():
            error = InferError(ErrorKind.UNAVAILABLE, "the server's engine is gone")
            if isinstance(target, Inbox):
                target.put(error_message(0, error))
            elif not target.done():
                target.set_exception(error)
        self.calls.clear()
        self.heard.clear()
        self.gone.set()


class WorkerTracer:
    """What a worker's endpoints see as the tracer: `on` while the engine's is, and then a trace of
    this worker's own for each inference request (its front end's timestamps go on it). The engine
    samples: a call it traced gets the engine's SAMPLED, which keys the trace (`id`, 0 until then), and
    finishing a keyed trace sends its front-end timestamps to the engine (STAMPS); the others are
    dropped. Tracing off, no request gets one."""

    otel = None  # the engine exports in OpenTelemetry mode (its sampling reads no traceparent from here)

    def __init__(self, client: LinkedEngine) -> None:
        self.client = client
        self.on = False  # the engine's tracer's, as it said last (Event "tracing")

    def sample(self, model: str, traceparent: Any = None, tracestate: Any = None) -> Trace:
        return Trace(0, (TIMESTAMPS,))

    def finish(self, trace: Trace | None) -> None:
        if trace is None or not trace.id:
            return
        key, trace.id = trace.id, 0  # sent once
        self.client.link.send(msg.Stamps(key, trace.front))


class Relayed:
    """A streamed answer of a forwarded route, chunk by chunk as the engine sends them; closing it early
    (the client left) cancels the engine's side."""

    def __init__(self, client: LinkedEngine, call_id: int, inbox: Inbox, response: HttpResponse) -> None:
        self.client = client
        self.call_id = call_id
        self.inbox = inbox
        self.response = response  # its trailers come at the end

    def __aiter__(self) -> Relayed:
        return self

    async def __anext__(self) -> bytes:
        if self.call_id not in self.client.calls:
            raise StopAsyncIteration
        message = await self.inbox.get()
        if isinstance(message, msg.Message) and type(message.payload) is bytes:
            self.client._more(self.call_id)
            return message.payload
        self.client._forget(self.call_id)
        if isinstance(message, msg.End):
            if message.payload is not None:
                self.response.trailers = _pairs(message.payload)
            raise StopAsyncIteration
        raise _failure(message)

    async def aclose(self) -> None:
        self.client._cancel(self.call_id)


def _pairs(items: list | None) -> list[tuple[bytes, bytes]] | None:
    return None if items is None else [tuple(pair) for pair in items]


def _failure(message: Any) -> InferError:
    """How a call ends on a message other than its answer: the engine's Error, or a message this call
    cannot receive (an engine that does not match this worker)."""
    if isinstance(message, msg.Error):
        return error_of(message)
    unexpected = type(message).__name__
    return InferError(ErrorKind.INTERNAL, f"internal error: unexpected {unexpected} from the engine")


# ------------------------------------------------------------------------------ the worker process


def die_with_engine() -> None:
    """The kernel sends this process ENGINE_GONE when the engine that started it dies (Linux): a signal
    nobody else sends, so `serve` knows to say so and exit at once (SIGTERM and SIGINT drain)."""
    if not kin.die_with_parent(ENGINE_GONE):
        log.warning("cannot ask to die with the engine (prctl): this worker may outlive it")


def _engine_gone(engine: int) -> None:
    log.error("worker %d: the engine (pid %d) is gone; exiting", os.getpid(), engine)
    os._exit(1)


def inherited(spec: str, arena_bytes: int) -> tuple[socket.socket, tuple[Arena, Arena], dict]:
    """`LINK,ARENA,ARENA;NAME=FD,FD;...` -> the link to the engine, this worker's arena and the engine's,
    and each port's listening sockets."""
    link, *ports = spec.split(";")
    link_fd, mine, yours = (int(fd) for fd in link.split(","))
    listening = {}
    for port in ports:
        name, fds = port.split("=")
        listening[name] = [socket.socket(fileno=int(fd)) for fd in fds.split(",")]
    arenas = (Arena(arena_bytes, mine), Arena(arena_bytes, yours))
    return socket.socket(fileno=link_fd), arenas, listening


async def serve(args: argparse.Namespace, logs: LogControl) -> None:
    engine = os.getppid()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(ENGINE_GONE, _engine_gone, engine)
    die_with_engine()
    if os.getppid() != engine:  # it died before the request took effect
        _engine_gone(engine)
    link_socket, arenas, listening = inherited(args.worker_of, args.worker_arena_bytes)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    client = LinkedEngine(arenas, args.worker_call_timeout)
    buffers.shared = client.arenas.allocate_body  # type: ignore[union-attr]
    client.logs = logs
    await loop.create_unix_connection(lambda: client.link, sock=link_socket)
    await client.first_table
    # The engine samples and writes every trace (one count, one file): this process times its requests.
    parts = assembly.build_worker(args, client, client.tracer, client)
    raise_fd_limit()

    async def shutdown_trigger() -> None:
        await asyncio.wait(
            [loop.create_task(stop.wait()), loop.create_task(client.gone.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if client.gone.is_set() and not stop.is_set():
            _engine_gone(engine)
        parts.grpc_services.begin_shutdown()

    def serving() -> None:
        log.info("worker %d serving", os.getpid())
        client.link.send(msg.Event("serving", None))

    await assembly.serve_ports(args, parts, listening, shutdown_trigger, client.offline, serving)
    await client.local.close()
    client.link.close()
