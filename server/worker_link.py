"""The engine's service of one front-end worker's link (`--workers`; server/engine.py starts, watches and
replaces the workers, this answers what each asks): inference requests as tensors (codec/ipc.py; a
request that finishes without waiting is answered in the read callback, with no task), streamed ones
under credit flow, and every other route and gRPC method forwarded whole, answered by the same routers and
services one process serves. Every call ends with exactly one final message; past `max_waiting` calls
waiting, the link stops reading.

Tracing: the engine samples every worker's inference requests (one count, one file). A traced call is
answered with SAMPLED ahead of its answer, and its trace is held until the worker sends the front end's
timestamps (STAMPS: when it received the request and sent the answer), then written with them; a call
the worker cancelled is written as it is, and so is every trace held when the link goes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import msgspec
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from tensorgate.codec import ipc
from tensorgate.codec import messages as msg
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.framing import FrameReader
from tensorgate.codec.tensor import InferRequest
from tensorgate.codec.trace import Trace
from tensorgate.server import assembly
from tensorgate.server.arena import Arena, LinkArenas
from tensorgate.server.http import eager
from tensorgate.server.http.grpc_call import NO_REQUEST
from tensorgate.server.link import Credit, Inbox, Link
from tensorgate.server.repository import Repository
from tensorgate.server.router import HttpRequest, HttpResponse
from tensorgate.server.shared_memory import SharedMemory
from tensorgate.server.tracing.tracer import Tracer

_FROM_WORKER = msgspec.msgpack.Decoder(msg.TO_ENGINE)
log = logging.getLogger("tensorgate.engine")


class Served(Protocol):
    """What a worker's link reaches of the engine (server/engine.py Engine)."""

    repository: Repository
    shared_memory: SharedMemory
    tracer: Tracer
    parts: assembly.Parts | None
    serving: list[asyncio.Future]

    async def synced_answer(self) -> None:
        """Returns once every worker has the model table a repository call changed (at once if none)."""
        ...


class WorkerLink:
    """The engine's end of one worker's link: what the worker asks, served.

    Every call the worker starts ends with exactly one final message (RESULT, END or ERROR), whatever its
    handling raises; a call the worker cancelled ends with none (it has forgotten it). Past
    `max_waiting` inference calls waiting here (a batch, a model), the link stops reading: the socket
    fills, and the worker's next calls wait in it (Link.drain) until half of them are answered."""

    def __init__(self, engine: Served, index: int, mine: Arena, yours: Arena, max_waiting: int = 0) -> None:
        self.engine = engine
        self.index = index
        self.link = Link(self._message, self._lost, self._fault, FrameReader(_FROM_WORKER))
        self.max_waiting = max_waiting  # 0: no limit
        self.arenas = LinkArenas(mine, yours, lambda offset: self.link.send(msg.Release(offset)))
        self.tasks: dict[int, asyncio.Task] = {}
        self.inboxes: dict[int, Inbox] = {}  # forwarded gRPC calls: the client's messages
        self.credits: dict[int, Credit] = {}  # streamed answers: how far ahead of the worker they may go
        self.acks: dict[int, asyncio.Future] = {}
        self.asked: dict[int, asyncio.Future] = {}  # statistics asked for (Event "stats"), by number
        self.held: dict[int, Trace] = {}  # traced calls answered: their traces, until the worker's STAMPS
        self.loop = asyncio.get_running_loop()

    def send_table(self, table: list, sequence: int) -> asyncio.Future:
        future = self.acks.setdefault(sequence, self.loop.create_future())
        self.link.send(msg.Event("models", [table, sequence]))
        return future

    def ask_stats(self, number: int) -> asyncio.Future:
        """Asks the worker for the statistics of the models it runs itself: done once they are added."""
        future = self.asked[number] = self.loop.create_future()
        self.link.send(msg.Event("stats", number))
        return future

    def _counted(self, counts: list[msg.Counts]) -> None:
        """The worker's counts, added to those of the engine's versions (a version gone since: dropped)."""
        for each in counts:
            model = self.engine.repository.models.get(each.model)
            version = None if model is None else model.versions.get(each.version)
            if version is not None:
                version.stats.add(each)

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.link.close()
        self.arenas.close()
        self._write_held()

    def _lost(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        self._write_held()
        for future in [*self.acks.values(), *self.asked.values()]:
            if not future.done():
                future.set_result(None)

    def _fault(self, message: Any, error: Exception) -> None:
        """Handling a message raised: its call (if it names one) ends with an error now."""
        call_id = getattr(message, "call", 0)
        if not call_id:
            return
        task = self.tasks.pop(call_id, None)
        if task is not None:
            task.cancel()
        self._fail(call_id, _internal(error))

    def _throttle(self) -> None:
        """Reading paused while too many inference calls wait here, resumed once half are answered."""
        waiting = len(self.tasks)
        if self.link.reading and waiting >= self.max_waiting > 0:
            self.link.pause_reading()
        elif not self.link.reading and waiting <= self.max_waiting // 2:
            self.link.resume_reading()

    def _message(self, message: Any) -> None:
        match message:
            case msg.Infer(call_id, request):
                self._infer(call_id, request)
            case msg.Message(call_id) | msg.End(call_id):
                inbox = self.inboxes.get(call_id)
                if inbox is not None:
                    inbox.put(message)
            case msg.Release(offset):
                self.arenas.mine.release(offset)
            case msg.Stamps(call_id, stamps):
                self._stamped(call_id, stamps)
            case msg.More(call_id, count):
                credit = self.credits.get(call_id)
                if credit is not None:
                    credit.grant(count)
            case msg.Cancel(call_id):
                task = self.tasks.get(call_id)
                if task is not None:
                    task.cancel()
            case msg.Stream(call_id, request):  # its tensors taken now, as an Infer's (frontend.py)
                self._start(call_id, self._stream(call_id, ipc.request_in(request, self.arenas)))
            case msg.Http():
                self._start(message.call, self._http(message))
            case msg.Grpc(call_id, path, metadata):
                self.inboxes[call_id] = Inbox()
                self._start(call_id, self._grpc(call_id, path, metadata))
            case msg.Stats(asked, counts):
                self._counted(counts)
                future = self.asked.pop(asked, None)
                if future is not None and not future.done():
                    future.set_result(None)
            case msg.Event("ack", sequence):
                future = self.acks.pop(sequence, None)
                if future is not None and not future.done():
                    future.set_result(None)
            case msg.Event("serving"):
                serving = self.engine.serving[self.index]
                if not serving.done():
                    serving.set_result(None)

    def _start(self, call_id: int, work: Any) -> None:
        self.credits[call_id] = Credit(msg.AHEAD)
        task = self.loop.create_task(self._final(call_id, work))
        self.tasks[call_id] = task
        task.add_done_callback(lambda _, call_id=call_id: self._forget(call_id))

    async def _final(self, call_id: int, work: Any) -> None:
        """A streamed or forwarded call, ended with an ERROR when it raises before its END."""
        try:
            await work
        except InferError as e:
            self._fail(call_id, e)
        except Exception as e:
            log.exception("unexpected error serving a call from a worker")
            self._fail(call_id, _internal(e))

    def _forget(self, call_id: int) -> None:
        self.tasks.pop(call_id, None)
        self.inboxes.pop(call_id, None)
        self.credits.pop(call_id, None)

    async def _send_more(self, call_id: int, payload: Any) -> None:
        """A message of a streamed answer, once the worker has taken all but AHEAD of those before it (a
        client that stops reading stops the model's generator, as in one process)."""
        await self.credits[call_id].spend()
        self.link.send(msg.Message(call_id, payload))

    def _fail(self, call_id: int, error: InferError) -> None:
        self.link.send(msg.Error(call_id, error.kind.value, error.message))

    # ---- inference

    def _infer(self, call_id: int, item: msg.Request) -> None:
        """A request, run at once; a task only if it has to wait (a batch, a worker thread)."""
        engine = self.engine
        try:
            request = ipc.request_in(item, self.arenas)
            version = engine.repository.resolve(request.model_name, request.model_version)
            if request.shared_memory:
                work = engine.shared_memory.infer(version, request)
            else:
                work = version.infer(request)
            if engine.tracer.on:  # the engine samples every worker's requests: one count, one file
                request.trace = engine.tracer.sample(request.model_name)
                if request.trace is not None:
                    work = self._traced(call_id, work, request.trace)
            finished, outcome = eager.step(work, self.loop)
        except InferError as e:
            return self._fail(call_id, e)
        except Exception as e:
            log.exception("unexpected error serving an inference request")
            return self._fail(call_id, _internal(e))
        if finished:
            self._answer(call_id, outcome)
            return
        self.tasks[call_id] = outcome
        outcome.add_done_callback(lambda task, call_id=call_id: self._answered(call_id, task))
        if self.max_waiting:
            self._throttle()

    def _answer(self, call_id: int, response: Any) -> None:
        try:
            answer = ipc.response_out(response, self.arenas)
        except InferError as e:  # the shared memory is full
            return self._fail(call_id, e)
        except Exception as e:  # a value that cannot cross (a model's parameters): an answer all the same
            log.exception("an answer could not be sent to the worker")
            return self._fail(call_id, _internal(e))
        self.link.send(msg.Result(call_id, answer))

    def _answered(self, call_id: int, task: asyncio.Task) -> None:
        if self.tasks.pop(call_id, None) is not None and not self.link.reading:
            self._throttle()
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._answer(call_id, task.result())
        elif isinstance(error, InferError):
            self._fail(call_id, error)
        else:
            log.error("unexpected error serving an inference request", exc_info=error)
            self._fail(call_id, _internal(error))

    async def _stream(self, call_id: int, request: InferRequest) -> None:
        engine = self.engine
        version = engine.repository.resolve(request.model_name, request.model_version)
        if engine.tracer.on:
            request.trace = engine.tracer.sample(request.model_name)
            if request.trace is not None:
                await self._traced(call_id, self._stream_answers(call_id, version, request), request.trace)
                self.link.send(msg.End(call_id))
                return
        await self._stream_answers(call_id, version, request)
        self.link.send(msg.End(call_id))

    async def _stream_answers(self, call_id: int, version: Any, request: InferRequest) -> None:
        async for response in version.infer_stream(request):
            await self._send_more(call_id, ipc.response_out(response, self.arenas))

    # ---- traces

    async def _traced(self, call_id: int, work: Any, trace: Trace) -> Any:
        """A traced call's work. Answered (its error too), the trace is held for the worker's STAMPS,
        which SAMPLED asks for ahead of the answer; cancelled (the worker forgot the call), it is written."""
        try:
            result = await work
        except asyncio.CancelledError:
            self.engine.tracer.finish(trace)
            raise
        except BaseException:
            self._hold(call_id, trace)
            raise
        self._hold(call_id, trace)
        return result

    def _hold(self, call_id: int, trace: Trace) -> None:
        self.held[call_id] = trace
        self.link.send(msg.Sampled(call_id))

    def _stamped(self, call_id: int, stamps: list[tuple[str, int]]) -> None:
        """The worker's front-end timestamps of a traced call: its trace is written with them."""
        trace = self.held.pop(call_id, None)
        if trace is not None:
            for name, ns in stamps:
                trace.stamp_front(name, ns)
            self.engine.tracer.finish(trace)

    def _write_held(self) -> None:
        """The worker is gone: the traces that waited for it are written as they are."""
        held, self.held = self.held, {}
        for trace in held.values():
            self.engine.tracer.finish(trace)

    # ---- forwarded routes and methods

    async def _http(self, forwarded: msg.Http) -> None:
        engine = self.engine
        call_id = forwarded.call
        router = engine.parts.routers[forwarded.port]  # type: ignore[union-attr]  # built before workers start
        found = router.find(forwarded.method, forwarded.path)
        if isinstance(found, HttpResponse):
            response = found
        else:
            route, params = found
            headers = dict(forwarded.headers)
            request = HttpRequest(
                forwarded.method, forwarded.path, forwarded.query, headers, forwarded.body, params
            )
            response = await router.call(route, request)
        await engine.synced_answer()
        chunks = response.chunks
        if isinstance(chunks, list):
            body = b"".join(chunks)
            self.link.send(msg.Answer(call_id, response.status, response.headers, body, response.trailers))
            return
        self.link.send(msg.Answer(call_id, response.status, response.headers, None, response.trailers))
        try:
            async for chunk in chunks:
                await self._send_more(call_id, bytes(chunk))
        finally:
            await chunks.aclose()
        self.link.send(msg.End(call_id, response.trailers))

    async def _grpc(self, call_id: int, path: str, metadata: list) -> None:
        engine = self.engine
        handler = engine.parts.grpc_services.handlers.get(path)  # type: ignore[union-attr]
        status, message = Status.OK, None
        try:
            if handler is None:
                raise GRPCError(Status.UNIMPLEMENTED, f"method {path} is not served here")
            await handler.func(RelayedCall(self, call_id, handler, dict(metadata)))
        except GRPCError as e:
            status, message = e.status, e.message
        except Exception:
            log.exception("unexpected error serving %s", path)
            status, message = Status.INTERNAL, f"internal error serving {path}"
        await engine.synced_answer()
        self.link.send(msg.End(call_id, [status.value, message]))


def _internal(error: BaseException) -> InferError:
    return InferError(ErrorKind.INTERNAL, f"internal error: {type(error).__name__}")


class RelayedCall:
    """A gRPC call a worker forwards, as its handler sees it: the messages the worker relays in, and
    what the handler sends relayed out (the part of grpc_call.GrpcCall servicers use)."""

    def __init__(self, link: WorkerLink, call_id: int, handler: Handler, metadata: dict) -> None:
        self.link = link
        self.call_id = call_id
        self.handler = handler
        self.metadata = metadata
        self.inbox = link.inboxes[call_id]
        self.received = 0

    async def recv_message(self) -> Any:
        """The next message the worker relayed; None after the last. The worker relays every call as a
        stream: a unary method's missing request is found here."""
        message = await self.inbox.get()
        if isinstance(message, msg.End):
            if self.received == 0 and not self.handler.cardinality.value.client_streaming:
                raise GRPCError(Status.INTERNAL, NO_REQUEST)
            return None
        self.received += 1
        return self.handler.request_type.FromString(message.payload)

    async def send_message(self, message: Any) -> None:
        await self.link._send_more(self.call_id, message.SerializeToString())

    def __aiter__(self) -> RelayedCall:
        return self

    async def __anext__(self) -> Any:
        message = await self.recv_message()
        if message is None:
            raise StopAsyncIteration
        return message
