"""The engine: the one process of `tensorgate serve`, holding the model repository, the models, their dynamic
batchers and statistics, client shared-memory regions and the monitor, and serving every port. With
`--workers N` it is the first of N front ends: it starts N - 1 worker processes (server/frontend.py) that
accept connections on the same ports beside it, each on its own core, and send it their inference.

The engine binds every port and hands the listening sockets to its workers, which accept on them; it
starts each worker with a Unix socket of its own (server/link.py) and two arenas of shared memory, the
worker's and its own, for the large tensors each sends the other (server/arena.py), and serves what
comes over the socket:
inference requests as tensors (codec/ipc.py; a request that finishes without waiting is answered in the
read callback, with no task), and every other route and gRPC method forwarded whole, answered by the same
routers and services one process serves. It tells every worker its model table at start and after every
change; a repository call answers only once every worker has the change.

A worker that dies is replaced (its requests in flight fail with their connections; the others go on).
Each worker dies with the engine (PR_SET_PDEATHSIG): a dead engine takes the whole server down, so the
orchestrator sees it and restarts it. SIGTERM drains the workers first, then unloads the models.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import socket
import sys
from typing import Any

import msgspec
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from codec import ipc
from codec import messages as msg
from codec.errors import ErrorKind, InferError
from codec.framing import FrameReader
from server import assembly
from server.arena import Arena, LinkArenas
from server.http import eager
from server.http.listener import Offline, raise_fd_limit, rebind
from server.link import Credit, Inbox, Link
from server.log_settings import LogControl, LogSettings
from server.monitor import Monitor
from server.repository import Repository
from server.response_cache import ResponseCache
from server.router import HttpRequest, HttpResponse
from server.shared_memory import SharedMemory
from server.tracing.tracer import Tracer

_FROM_WORKER = msgspec.msgpack.Decoder(msg.TO_ENGINE)
log = logging.getLogger("tensorgate.engine")

RESTART_DELAY = 0.5  # seconds before a worker that died is replaced (a crash loop stays slow)
SYNC_TIMEOUT = 10.0  # seconds a repository change waits for every worker to have it


def model_table(repository: Repository) -> list:
    """What a worker needs of each model to resolve requests (frontend.FrontEndRepository.apply)."""
    return [
        [
            name,
            str(model.directory),
            model.config,
            model.reason,
            model.loading,
            [
                [n, v.state.value, v.reason, v.config, v.streams, v.stream_only]
                for n, v in model.versions.items()
            ],
            [v.version for v in model.newest_first],
        ]
        for name, model in repository.models.items()
    ]


class Engine:
    def __init__(self, args: argparse.Namespace, logs: LogControl, tracer: Tracer) -> None:
        self.args = args
        self.logs = logs
        self.tracer = tracer
        cache = ResponseCache(args.cache_size) if args.cache_size else None
        self.repository = Repository(
            args.model_repository,
            args.model_control_mode,
            args.strict_readiness,
            response_cache=cache,
            python_execution_mode=args.python_execution_mode,
        )
        self.shared_memory = SharedMemory(args.allow_client_shm)
        self.monitor = Monitor(self.repository, args.monitor_log, self.repository.app_monitor)
        self.links: set[WorkerLink] = set()
        self.stopping = False
        self.stop = asyncio.Event()  # set at shutdown: the workers are told to drain
        self.sequence = 0  # of the model tables sent
        self.synced = 0  # the repository generation every worker has
        self.parts: assembly.Parts | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        repository = self.repository
        await repository.start(self.args.load_model)
        assembly.settle_memory()
        try:
            self.parts = assembly.build(
                self.args, repository, self.shared_memory, self.monitor, self.logs, self.tracer
            )
        except ValueError as e:
            log.error("%s", e)
            await repository.unload_all()
            raise SystemExit(2) from None
        raise_fd_limit()
        sockets = assembly.bind_ports(self.args)
        self.monitor.start()
        repository.change_watchers.append(lambda: loop.create_task(self.sync()))
        offline = Offline()  # every port's connections leave at their next idle moment while offline
        repository.online_watchers.append(lambda online: offline.set(not online))
        repository.online_watchers.append(self._online)
        self.logs.watchers.append(self._logs)
        poller = None
        if self.args.model_control_mode == "poll":
            poller = loop.create_task(repository.poll_forever(self.args.repository_poll_secs, stop))

        async def shutdown_trigger() -> None:
            await stop.wait()
            if poller is not None:
                await poller  # returns once a poll under way is done
            self.parts.grpc_services.begin_shutdown()  # open streams end; every port then drains

        # This process serves the ports too (front end 0); each worker is one more front end.
        self.serving = [loop.create_future() for _ in range(self.args.workers)]
        workers = [loop.create_task(self._keep_worker(i, sockets)) for i in range(1, self.args.workers)]
        up = loop.create_task(self._log_when_serving(sockets))
        served = loop.create_task(
            assembly.serve_ports(
                self.args,
                self.parts,
                sockets,
                shutdown_trigger,
                offline,
                lambda: self.serving[0].set_result(None),
            )
        )
        await stop.wait()
        up.cancel()
        self.stopping = True
        self.stop.set()  # the workers drain as this process does, each within the graceful timeout
        await served
        await asyncio.gather(*workers)
        self.monitor.stop()
        await repository.unload_all()
        self.tracer.close()  # traces not yet written go to their files
        log.info("shut down")

    # ---- workers

    async def _keep_worker(self, index: int, ours: dict[str, list[socket.socket]]) -> None:
        """Runs worker `index` until the engine stops, replacing it whenever it dies. It listens on sockets
        of its own on the same ports (SO_REUSEPORT: the kernel spreads the connections over the
        processes; one socket accepted by all would let the first to wake take them all). The engine
        keeps them while the worker runs: connections the kernel gave a worker that died wait for the
        next one."""
        loop = asyncio.get_running_loop()
        sockets = {name: rebind(listening) for name, listening in ours.items()}
        listening = ";".join(
            f"{name}=" + ",".join(str(s.fileno()) for s in ss) for name, ss in sockets.items()
        )
        fds = [s.fileno() for ss in sockets.values() for s in ss]
        while not self.stopping:
            ours, theirs = socket.socketpair()
            # the tensors each side sends the other (server/arena.py): fresh with each worker
            worker_arena = Arena(self.args.worker_arena_bytes)
            engine_arena = Arena(self.args.worker_arena_bytes)
            spec = f"{theirs.fileno()},{worker_arena.fd},{engine_arena.fd};{listening}"
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "server",
                *self.args.argv,
                "--worker-of",
                spec,
                pass_fds=[theirs.fileno(), worker_arena.fd, engine_arena.fd, *fds],
            )
            theirs.close()
            link = WorkerLink(self, index, engine_arena, worker_arena, self.args.worker_max_calls)
            await loop.create_unix_connection(lambda link=link: link.link, sock=ours)
            self.links.add(link)
            link.send_table(model_table(self.repository), self.sequence)
            stopper = loop.create_task(self._stop_worker(process, sockets))
            code = await process.wait()
            stopper.cancel()
            self.links.discard(link)
            link.close()
            if self.stopping:
                if code:
                    log.warning("worker %d exited with %d at shutdown", index, code)
                return
            log.error("worker %d (pid %d) exited with %d: starting another", index, process.pid, code)
            await asyncio.sleep(RESTART_DELAY)

    async def _log_when_serving(self, sockets: dict[str, list[socket.socket]]) -> None:
        await asyncio.gather(*self.serving)
        assembly.log_ports(sockets)  # every worker accepts: the server is up

    async def _stop_worker(
        self, process: asyncio.subprocess.Process, sockets: dict[str, list[socket.socket]]
    ) -> None:
        """At shutdown: SIGTERM (the worker stops listening and drains its connections), SIGKILL past the
        graceful timeout. The engine's copies of its sockets close at once: new connections are refused."""
        await self.stop.wait()
        process.send_signal(signal.SIGTERM)
        for listening in sockets.values():
            for sock in listening:
                sock.close()
        try:
            await asyncio.wait_for(process.wait(), self.args.graceful_timeout + 5)
        except TimeoutError:
            log.warning("worker pid %d did not stop in time: killed", process.pid)
            process.kill()

    async def sync(self) -> None:
        """Sends every worker the model table, and waits until each has it."""
        self.sequence += 1
        generation = self.repository.generation
        table = model_table(self.repository)
        acks = [link.send_table(table, self.sequence) for link in list(self.links)]
        if acks:
            done, late = await asyncio.wait(acks, timeout=SYNC_TIMEOUT)
            if late:
                log.warning("%d workers did not confirm the new model table", len(late))
        self.synced = max(self.synced, generation)

    async def synced_answer(self) -> None:
        """Before a forwarded call answers: every worker has the model table as it is now, so what the
        client asks next, of any worker, sees what this answer saw (a model loading, loaded, gone)."""
        if self.synced != self.repository.generation:
            await self.sync()

    def _online(self, online: bool) -> None:
        for link in self.links:
            link.link.send(msg.Event("online", online))

    def _logs(self, settings: LogSettings) -> None:
        """The log settings a client changed: every worker's log follows."""
        changes = {k: v for k, v in dataclasses.asdict(settings).items() if k != "log_file"}
        for link in self.links:
            link.link.send(msg.Event("logs", changes))


class WorkerLink:
    """The engine's end of one worker's link: what the worker asks, served.

    Every call the worker starts ends with exactly one final message (RESULT, END or ERROR), whatever its
    handling raises; a call the worker cancelled ends with none (it has forgotten it). Past
    `max_waiting` inference calls waiting here (a batch, a model), the link stops reading: the socket
    fills, and the worker's next calls wait in it (Link.drain) until half of them are answered."""

    def __init__(self, engine: Engine, index: int, mine: Arena, yours: Arena, max_waiting: int = 0) -> None:
        self.engine = engine
        self.index = index
        self.link = Link(self._message, self._lost, self._fault, FrameReader(_FROM_WORKER))
        self.max_waiting = max_waiting  # 0: no limit
        self.arenas = LinkArenas(mine, yours, lambda offset: self.link.send(msg.Release(offset)))
        self.tasks: dict[int, asyncio.Task] = {}
        self.inboxes: dict[int, Inbox] = {}  # forwarded gRPC calls: the client's messages
        self.credits: dict[int, Credit] = {}  # streamed answers: how far ahead of the worker they may go
        self.acks: dict[int, asyncio.Future] = {}
        self.loop = asyncio.get_running_loop()

    def send_table(self, table: list, sequence: int) -> asyncio.Future:
        future = self.acks.setdefault(sequence, self.loop.create_future())
        self.link.send(msg.Event("models", [table, sequence]))
        return future

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.link.close()
        self.arenas.close()

    def _lost(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        for future in self.acks.values():
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
            case msg.More(call_id, count):
                credit = self.credits.get(call_id)
                if credit is not None:
                    credit.grant(count)
            case msg.Cancel(call_id):
                task = self.tasks.get(call_id)
                if task is not None:
                    task.cancel()
            case msg.Stream(call_id, request):
                self._start(call_id, self._stream(call_id, request))
            case msg.Http():
                self._start(message.call, self._http(message))
            case msg.Grpc(call_id, path, metadata):
                self.inboxes[call_id] = Inbox()
                self._start(call_id, self._grpc(call_id, path, metadata))
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
                    work = _traced(work, engine.tracer, request.trace)
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

    async def _stream(self, call_id: int, item: msg.Request) -> None:
        engine = self.engine
        request = ipc.request_in(item, self.arenas)
        version = engine.repository.resolve(request.model_name, request.model_version)
        async for response in version.infer_stream(request):
            await self._send_more(call_id, ipc.response_out(response, self.arenas))
        self.link.send(msg.End(call_id))

    # ---- forwarded routes and methods

    async def _http(self, forwarded: msg.Http) -> None:
        engine = self.engine
        call_id = forwarded.call
        router = engine.parts.routers[forwarded.port]
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
        handler = engine.parts.grpc_services.handlers.get(path)
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


async def _traced(work: Any, tracer: Tracer, trace: Any) -> Any:
    try:
        return await work
    finally:
        tracer.finish(trace)


class RelayedCall:
    """A gRPC call a worker forwards, as its handler sees it: the messages the worker relays in, and
    what the handler sends relayed out (the part of grpc_call.GrpcCall servicers use)."""

    def __init__(self, link: WorkerLink, call_id: int, handler: Handler, metadata: dict) -> None:
        self.link = link
        self.call_id = call_id
        self.handler = handler
        self.metadata = metadata
        self.inbox = link.inboxes[call_id]

    async def recv_message(self) -> Any:
        message = await self.inbox.get()
        if isinstance(message, msg.End):
            return None
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
