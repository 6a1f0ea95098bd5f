"""Python model instances in processes of their own (Triton's stub design): `EXECUTION_MODE process`.

Each instance of the model's instance_group is a process (server/backends/stub.py, started and watched
by server/backends/instance.py) that loads the model.py and runs it; the batcher hands each batch to a
free one, so `count: 4` gets four cores for pure-Python code, and a model that crashes takes only its
own requests with it. Messages: codec/messages.py; the shared-memory arena:
server/backends/channel.py. The server gathers a large batch's rows straight into the instance's arena
(RegionStaging: one copy), the process writes the outputs after them, and the server reads them as views
of the arena; the next batch is written after the views still in use (BatchArena.lend). A small batch (up
to INLINE_BYTES of inputs) travels in the messages instead, both ways, which costs less than the arena for
a few KiB and lets it wait in a busy instance's socket: without the dynamic batcher (`max_batch_size 0`,
or no `dynamic_batching`), each instance holds up to DEPTH such batches, so it starts the next one as soon
as it answers one rather than after the server's turn-around (with `count: 2` on the 2-core VM, 2520
against 2221 req/s). Another batch waits for an instance while every one holds DEPTH, while the instance
it would queue behind is making a BLS call (a call back into the same model must not wait behind its
caller), or while EXECUTE_TIMEOUT_MS is set (a batch's time would count its wait).

Faults: an instance whose process ends (a signal, an exit, the OOM killer) fails the requests it holds at
once ("model 'x' instance 1 exited (signal 6: SIGABRT)") and is started again after a backoff (0.1 s,
doubling to 10 s while it keeps failing); the model stays ready while any instance runs. With
`EXECUTE_TIMEOUT_MS`, an instance whose execute runs longer is killed and restarted, its requests failed
with a timeout error. `restarts` counts the restarts (the statistics' `instance_restarts`, and the
metric tensorgate_python_instance_restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import numpy as np

import tensorgate.server.backends.channel as channel
import tensorgate.server.backends.pb_utils as pb_utils
from tensorgate.batcher.staging import HostStaging, instance_count
from tensorgate.batcher.stats import ResponseStats
from tensorgate.codec import messages as msg
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import custom_parameters
from tensorgate.server.backends.base import Backend, stream_only_error
from tensorgate.server.backends.instance import Instance, NotStarted, interpreter, on_loop
from tensorgate.server.backends.triton_python import mark_cancelled
from tensorgate.server.model_config import parameter

if TYPE_CHECKING:
    from tensorgate.batcher.scheduler import Job
    from tensorgate.server.backends.base import Host

log = logging.getLogger("tensorgate.python")
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 10.0
DEPTH = 2  # small batches an instance holds at once: the one executing, and the next, in its socket
INLINE_BYTES = 64 << 10  # a batch's inputs up to this size travel in the messages, not the arena


class RegionStaging(HostStaging):
    """A batch's rows are gathered where its instance reads them: each input's parts go to execute as
    channel.Rows, which the instance's Region receives side by side (one copy, not a gather and then a
    copy)."""

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        return channel.rows(parts)


class ProcessBackend(Backend):
    is_async = True  # execute sends the batch and awaits the answer on the event loop

    def __init__(self, version_dir: Path, config: dict, version: int, host: Host | None = None) -> None:
        self.name = config["name"]
        self.version = version
        self.version_dir = version_dir
        self.config = config
        self.host = host
        self.label = f"model '{self.name}' version {version}"
        self.restarts = 0
        timeout = parameter(config, "EXECUTE_TIMEOUT_MS", "0")
        try:
            self.timeout = float(timeout) / 1000  # 0: none
        except ValueError:
            self.timeout = -1.0
        if not self.timeout >= 0:  # NaN too
            raise ValueError(f"EXECUTE_TIMEOUT_MS is a number of milliseconds (0: none), not {timeout!r}")
        if host is not None:  # the BLS calls of the model's processes go through this server
            pb_utils.attach_host(host)
        self.python, self._unpacked = interpreter(config, version_dir.parent)
        self.instances = instance_count(config, "cpu")
        self.staging = RegionStaging()  # on the host, whatever the instance group's kind: no CUDA IPC yet
        self.queued = 1 if self.timeout else DEPTH  # batches an instance holds without the dynamic batcher
        self._all = [Instance(self, i) for i in range(self.instances)]
        self._waiters: deque[tuple[asyncio.Future, bool]] = deque()  # (its future, a small batch)
        self.traced: dict[int, Any] = {}  # the traces of requests in its processes, by id (BLS children)
        self._closed = False
        try:
            self._on_loop_thread(lambda: [instance.spawn() for instance in self._all])
            infos = [instance.handshake() for instance in self._all]
        except BaseException:
            self.close()
            raise
        self._watch()
        info = infos[0]
        self.per_request = info["triton"]
        self.response_stats: ResponseStats | None = None
        if self.per_request:
            decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
            self.stream_only = decoupled
            self.execute = self._refuse if decoupled else self._execute_triton
            self.execute_stream = self._stream_triton if decoupled else None
            self.response_stats = ResponseStats() if decoupled else None
        else:
            self.with_parameters = info["with_parameters"]
            self.stream_only = not info["execute"]
            self.execute = self._execute_ours if info["execute"] else self._refuse
            self.execute_stream = self._stream_ours if info["stream"] else None

    def _watch(self) -> None:
        """The instances' sockets handed to the server's loop now, so that one dying while idle (the OOM
        killer, a kill) is restarted at once. Without a running server, the loop of their first use."""
        loop = self.host.loop if self.host is not None else None
        if loop is None or not loop.is_running():
            return

        async def attach_all() -> None:
            for instance in self._all:
                if instance.alive and instance.link is None:
                    await instance.attach()

        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            loop.create_task(attach_all())
        else:
            asyncio.run_coroutine_threadsafe(attach_all(), loop).result()

    def _on_loop_thread(self, action: Callable[[], Any]) -> Any:
        """Runs `action` on the event loop's thread when the server runs (a loading thread may end; the
        processes it forked would die with it), else here."""
        return on_loop(self.host.loop if self.host is not None else None, action)

    # ---------------------------------------------------------------------------------- instances

    def _free(self, small: bool) -> Instance | None:
        """The running instance this batch may go to now, held for it; None: it waits. A large batch
        needs an instance that holds nothing (it writes the arena); a small one may queue behind the
        batches of one that holds fewer than `queued`."""
        room = self.queued if small else 1
        best = min(
            (i for i in self._all if i.alive and i.held < room and not (i.held and i.bls)),
            key=lambda i: i.held,
            default=None,
        )
        if best is not None:
            best.held += 1
        return best

    async def _take(self, small: bool) -> Instance:
        """An instance for a batch (its socket handed to this loop the first time it is taken): a free
        one, or for a small batch one that has room for it behind the batch it executes."""
        while True:
            instance = None if self._waiters else self._free(small)
            if instance is None:
                if not any(instance.alive for instance in self._all):
                    raise InferError(
                        ErrorKind.UNAVAILABLE, f"{self.label}: no instance is running (restarting)"
                    )
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append((waiter, small))
                try:
                    instance = await waiter
                except asyncio.CancelledError:  # its caller went away: an instance it was given goes back
                    if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                        self._give(waiter.result())
                    raise
            if instance.alive and instance.link is None:
                await instance.attach()
            if instance.alive and instance.link is not None:
                if instance.held > 1:
                    log.debug("%s: a batch waits behind instance %d's", self.label, instance.index)
                return instance
            self._give(instance)

    def _give(self, instance: Instance) -> None:
        """A batch's hold on an instance ends (answered, or the instance died): waiting batches served."""
        instance.held -= 1
        self._serve_waiters()

    def _serve_waiters(self) -> None:
        """The waiting batches given instances, in their order, as far as instances are free for them."""
        while self._waiters:
            waiter, small = self._waiters[0]
            if waiter.done():  # its caller went away
                self._waiters.popleft()
                continue
            instance = self._free(small)
            if instance is None:
                return
            self._waiters.popleft()
            waiter.set_result(instance)

    def lost(self, instance: Instance) -> None:
        """An instance died: started again after its backoff."""
        if self._closed:
            return
        if not any(i.alive for i in self._all):  # nothing left to wait for until the restart
            error = InferError(ErrorKind.UNAVAILABLE, f"{self.label}: no instance is running (restarting)")
            while self._waiters:
                waiter, _ = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error)
        asyncio.get_running_loop().create_task(self._restart(instance))

    async def _restart(self, instance: Instance) -> None:
        instance.failures += 1
        await asyncio.sleep(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (instance.failures - 1)))
        if self._closed:
            return
        instance.cause = ""
        try:
            instance.spawn()
            await asyncio.to_thread(instance.handshake)
            await instance.attach()
        except Exception as e:  # noqa: BLE001 (the model may fail to load now: try again later)
            log.error("%s instance %d: restart failed: %s", self.label, instance.index, e)
            instance.kill()
            if not self._closed:
                asyncio.get_running_loop().create_task(self._restart(instance))
            return
        if self._closed:
            instance.stop()
            return
        self.restarts += 1
        log.warning("%s instance %d: restarted", self.label, instance.index)
        self._serve_waiters()

    async def _run(
        self, small: bool, build: Callable[[Instance, int], list], read: Callable[[Instance, list], Any]
    ) -> Any:
        """One call on an instance: its message built for that instance, its answer read by `read` as it
        arrives (before the instance's arena is another batch's), awaited with the execute timeout, if
        any. A batch whose instance died before beginning it is sent again to the next free one."""
        while True:
            instance = await self._take(small)
            try:
                future = instance.call(build(instance, instance.new_call()), read)
            except BaseException:
                self._give(instance)
                raise
            # Held until its answer is in (or it died), even when this call is cancelled meanwhile: the
            # next batch must not overwrite the arena while the process still reads and writes it.
            future.add_done_callback(lambda _, instance=instance: self._give(instance))
            if self.timeout:
                timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, instance, future)
                future.add_done_callback(lambda _, timer=timer: timer.cancel())
            try:
                answer = await asyncio.shield(future)
            except NotStarted:
                log.info(
                    "%s: instance %d died before it began a batch: sent again", self.label, instance.index
                )
                continue
            instance.failures = 0  # it serves: a later death starts the backoff again
            return answer

    def _expire(self, instance: Instance, future: asyncio.Future) -> None:
        if not future.done():
            instance.cause = (
                f"timed out: execute ran past EXECUTE_TIMEOUT_MS ({self.timeout * 1000:g} ms); "
                "the instance is restarted"
            )
            instance.kill()

    def _failed(self, raised: msg.Raised) -> InferError:
        if raised.kind is not None:
            return InferError(ErrorKind[raised.kind], raised.message)
        log.error("%s: execute failed: %s\n%s", self.label, raised.message, raised.traceback)
        return InferError(ErrorKind.INTERNAL, f"{self.label} failed: {raised.message}")

    # ---------------------------------------------------------------------------------- Triton's API

    async def _execute_triton(self, jobs: list[Job]) -> list:
        small = sum(array.nbytes for job in jobs for array in job.inputs.values()) <= INLINE_BYTES
        sent: list[tuple[Instance, int]] = []  # where the batch went, for its requests' cancels
        gone: set[int] = set()  # the requests whose callers went away

        def cancel(index: int) -> None:
            """A request's caller went away: its model's process is told (request.is_cancelled())."""
            if index not in gone:
                gone.add(index)
                if sent:
                    sent[-1][0].send(channel.Dropped(sent[-1][1], index))

        for index, job in enumerate(jobs):
            mark_cancelled(getattr(job, "future", None), lambda index=index: cancel(index))

        def build(instance: Instance, call: int) -> msg.Execute:
            sent.append((instance, call))
            loop = asyncio.get_running_loop()
            for index in gone:  # cancelled while it waited for an instance: told once the batch is sent
                loop.call_soon(instance.send, channel.Dropped(call, index))
            if small:
                requests = [msg.Batched(channel.inline_all(job.inputs), _meta(job.request)) for job in jobs]
                return msg.Execute(call, instance.arena.size, requests, -1, None)
            arena, requests = instance.arena, []
            end = arena.start  # after the outputs of earlier batches still in use
            for job in jobs:
                tensors, end = arena.write(job.inputs, end)
                requests.append(msg.Batched(tensors, _meta(job.request)))
            return msg.Execute(call, arena.size, requests, end, None)

        def read(instance: Instance, answer: Any) -> list:
            if type(answer) is msg.Raised:
                raise self._failed(answer)
            arena = instance.arena
            arena.follow(answer.arena_size)
            return [
                arena.lend(entry.outputs)
                if entry.outputs is not None
                else pb_utils.as_infer_error(pb_utils.TritonError(entry.message, entry.code))
                for entry in answer.answers or ()
            ]

        with self._tracing([job.request.trace for job in jobs if job.request is not None]):
            try:
                return await self._run(small, build, read)
            except asyncio.CancelledError:
                for index in range(len(jobs)):
                    cancel(index)
                raise

    @contextlib.contextmanager
    def _tracing(self, traces: list[Any]) -> Iterator[None]:
        """While requests run in a process, their traces are found by key: a BLS call the model makes
        with `request.trace()` is traced as its request's child (_answer_bls)."""
        traces = [trace for trace in traces if trace is not None]
        for trace in traces:
            self.traced[id(trace)] = trace
        try:
            yield
        finally:
            for trace in traces:
                self.traced.pop(id(trace), None)

    def _refuse(self, *_: Any) -> Any:
        raise stream_only_error(self.name)

    async def _stream_triton(self, inputs: dict[str, Any], request: Any = None) -> AsyncIterator[dict]:
        tensors = [channel.inline(name, array) for name, array in inputs.items()]
        with self._tracing([request.trace if request is not None else None]):
            async for outputs in self._stream(tensors, _meta(request), None, self.response_stats):
                yield outputs

    # ---------------------------------------------------------------------------------- our API

    async def _execute_ours(self, inputs: dict[str, Any], parameters: Any = None) -> dict:
        small = sum(array.nbytes for array in inputs.values()) <= INLINE_BYTES

        def build(instance: Instance, call: int) -> msg.Execute:
            if small:
                batch = msg.Batched(channel.inline_all(inputs), None)
                return msg.Execute(call, instance.arena.size, [batch], -1, parameters)
            tensors, end = instance.arena.write(inputs, instance.arena.start)
            return msg.Execute(call, instance.arena.size, [msg.Batched(tensors, None)], end, parameters)

        def read(instance: Instance, answer: Any) -> dict:
            if type(answer) is msg.Raised:
                raise self._failed(answer)
            if answer.outputs is None:
                raise InferError(
                    ErrorKind.INTERNAL, f"{self.label} returned {answer.returned}, not a dict of outputs"
                )
            arena = instance.arena
            arena.follow(answer.arena_size)
            return arena.lend(answer.outputs)

        return await self._run(small, build, read)

    async def _stream_ours(self, inputs: dict[str, Any], parameters: Any = None) -> AsyncIterator[dict]:
        tensors = [channel.inline(name, array) for name, array in inputs.items()]
        async for outputs in self._stream(tensors, None, parameters):
            yield outputs

    # ---------------------------------------------------------------------------------- streams

    async def _stream(
        self,
        tensors: list[msg.Tensor],
        meta: msg.Meta | None,
        parameters: dict | None,
        counted: ResponseStats | None = None,
    ) -> AsyncIterator[dict]:
        """One streamed request on an instance (streams share instances with batches: their tensors
        travel in the messages, not in the arena); its responses `counted` (Triton's response_stats):
        each one's compute_infer from the previous one until its arrival, its compute_output the reading
        of its outputs here (the process made them)."""
        start, index = perf_counter_ns(), 0
        instance = await self._take(True)
        self._give(instance)  # not held: a stream does not occupy the instance between its answers
        call = instance.new_call()
        queue = instance.open_stream(msg.Open(call, tensors, meta, parameters))
        finished = False
        taken = 0  # answers taken since the last MORE: granted back in halves (credit flow, as the links')
        try:
            while True:
                message = await queue.get()
                taken += 1
                if taken == msg.AHEAD // 2:
                    instance.send(msg.More(call, taken))
                    taken = 0
                now = perf_counter_ns()
                match message:
                    case msg.Part(answer=msg.Answered(outputs=None) as failed):  # a response with an error
                        finished = True
                        if counted is not None:
                            counted.record(index, "fail", now - start)
                        raise pb_utils.as_infer_error(pb_utils.TritonError(failed.message, failed.code))
                    case msg.Part(answer=answer):
                        outputs = {t.name: channel.inline_array(t) for t in answer.outputs}
                        if counted is not None:
                            ready = perf_counter_ns()
                            counted.record(index, "success", now - start, ready - now)
                            start, index = ready, index + 1
                        yield outputs
                    case msg.End(payload=payload):
                        finished = True
                        if counted is not None and payload == channel.EMPTY:
                            counted.record(index, "empty_response", now - start)
                        return
                    case _:
                        finished = True
                        raise self._failed(message)
        finally:
            if not finished:
                if counted is not None:
                    counted.record(index, "cancel", perf_counter_ns() - start)
                instance.calls.pop(call, None)
                instance.send(msg.Cancel(call))

    # ---------------------------------------------------------------------------------- BLS

    def record(self, name: str, aggregation: str, value: float) -> None:
        """A value the model's process recorded with grps's app_monitor, in the server's."""
        if self.host is None:
            return
        try:
            self.host.app_monitor.record(name, aggregation, value)
        except ValueError as e:  # checked in the process already: a disagreement between processes
            log.warning("%s: app_monitor: %s", self.label, e)

    def bls(self, instance: Instance, message: msg.Call) -> None:
        """A BLS request from a model's process: answered through the server's schedulers."""
        instance.bls.add(message.call)
        asyncio.get_running_loop().create_task(_answer_bls(self, instance, message))

    def control(self, instance: Instance, message: channel.Control) -> None:
        """load_model, unload_model or is_model_ready from a model's process: run on this server."""

        async def answer() -> None:
            instance.send(await _controlled(self.host, message))

        asyncio.get_running_loop().create_task(answer())

    def control_now(self, message: channel.Control) -> channel.Controlled:
        """The same from initialize, on a loading thread: run on the server's loop, waited for here."""
        loop = self.host.loop if self.host is not None else None
        if self.host is None or loop is None or not loop.is_running():
            return channel.Controlled(message.call, None, "the server is not running")
        try:
            on_the_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_the_loop = False
        if on_the_loop:  # waiting here would block the loop that runs the call
            return channel.Controlled(message.call, None, "not available while the server loads this model")
        return asyncio.run_coroutine_threadsafe(_controlled(self.host, message), loop).result()

    def close(self) -> None:
        self._closed = True
        for instance in self._all:
            instance.stop()
        for instance in self._all:
            instance.arena.close()
        if self._unpacked is not None:
            shutil.rmtree(self._unpacked, ignore_errors=True)


def _meta(request: Any) -> msg.Meta:
    """What a Triton model reads of a request besides its tensors; its trace by its key in `traced`."""
    if request is None:
        return msg.Meta("", 0, 0, "{}", None, None)
    parameters = json.dumps(custom_parameters(request.parameters)) if request.parameters else "{}"
    requested = None if request.outputs is None else [o.name for o in request.outputs]
    trace = request.trace
    traced = None if trace is None else msg.TraceRef(id(trace), trace.traceparent)
    return msg.Meta(
        request.id or "", request.sequence_id, request.sequence_flags, parameters, requested, traced
    )


async def _controlled(host: Host | None, message: channel.Control) -> channel.Controlled:
    if host is None:
        return channel.Controlled(message.call, None, "the server is not running")
    try:
        result = await pb_utils.control(host, message.operation, message.arguments)
    except InferError as e:
        return channel.Controlled(message.call, None, e.message)
    except Exception as e:  # noqa: BLE001 (a bad call from the model: its call fails, not the server)
        return channel.Controlled(message.call, None, f"{type(e).__name__}: {e}")
    return channel.Controlled(message.call, result, None)


async def _answer_bls(owner: ProcessBackend, instance: Instance, call: msg.Call) -> None:
    """A model process's BLS request run as the in-thread mode runs it (pb_utils, on this server), its
    responses sent back in a Reply."""
    parent = owner.traced.get(call.trace) if call.trace is not None else None
    try:
        inputs = [pb_utils.Tensor(t.name, channel.inline_array(t)) for t in call.inputs]
        request = pb_utils.InferenceRequest(
            call.model, inputs, call.requested, call.version, call.correlation_id, call.request_id,
            call.flags, parameters=call.parameters, trace=pb_utils.InferenceTrace(parent),
        )  # fmt: skip
        if call.decoupled:
            responses = [r async for r in await request.async_exec(decoupled=True)]
        else:
            responses = [await request.async_exec()]
    except Exception as e:  # noqa: BLE001 (a bad request from the model: its call fails, not the server)
        responses = [pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(e).__name__}: {e}"))]
    instance.bls.discard(call.call)
    instance.send(msg.Reply(call.call, [channel.answered(response) for response in responses]))
