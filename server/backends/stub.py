"""A python model instance in its own process: `python -m tensorgate.server.backends.stub SOCKET_FD ARENA_FD`.

Started by server/backends/process.py, one per instance. It loads the model.py (either python API), runs
initialize, then answers the server's messages (codec/messages.py) one at a time on its main
thread until STOP (finalize, exit 0) or the end of its socket. A decoupled model's response sender may
answer from any thread; a streaming model of our API runs in a thread of its own. The kernel kills it
when the server dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import queue
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

import tensorgate.server.backends.channel as channel
import tensorgate.server.backends.custom_metrics as custom_metrics
import tensorgate.server.backends.pb_utils as pb_utils
from tensorgate.codec import messages as msg
from tensorgate.codec.datatypes import BY_CONFIG
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.framing import FrameReader, frame, receive
from tensorgate.server import kin
from tensorgate.server.app_monitor import AppMonitor
from tensorgate.server.backends.channel import BatchArena
from tensorgate.server.backends.module import ModelModule, use_app_monitor

_FROM_SERVER = msgspec.msgpack.Decoder(channel.TO_MODEL)


class Link:
    """The process's end of its socket. Until the model needs more, the main thread reads the socket
    itself between batches: one wake-up a message, none handed between threads. The first BLS call or
    streamed request starts a reader thread that reads every message from then on: BLS answers go straight
    to the thread that waits for them (whichever: `execute`, a thread the model started, the event loop of
    an `async def execute`), cancels take effect at once, and the rest waits in the inbox for the main
    thread, which runs the model. One thread reads at a time (`_reading`). Messages are sent from any
    thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._frames = FrameReader(_FROM_SERVER)
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # held by whichever thread reads the socket
        self._reader: threading.Thread | None = None
        self._replies: dict[int, Callable[[list], None]] = {}  # BLS call -> where its answer goes
        self._next = 0
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.on_cancel: Callable[[int], None] = lambda call: None
        self.on_more: Callable[[int, int], None] = lambda call, count: None
        self.on_drop: Callable[[int, int], None] = lambda call, index: None

    def send(self, message: Any) -> None:
        data = frame(message)
        with self._lock:
            self.sock.sendall(data)

    def first(self) -> Any:
        """The first message (the model to load)."""
        return receive(self.sock, self._frames)

    def next(self) -> Any:
        """Blocking, on the main thread: the next message for it (None: the server is gone)."""
        while self._reader is None:
            with self._reading:
                if self._reader is not None:  # started while this thread waited for the socket
                    break
                message = self._receive()
            if message is None or (message := self._dispatch(message)) is not None:
                return message
        return self.inbox.get()

    def start_reader(self) -> None:
        """The reader thread, from now on (once the main thread's read in progress, if any, returns)."""
        with self._lock:
            if self._reader is not None:
                return
            self._reader = threading.Thread(target=self._read_all, name="reader", daemon=True)
        self._reader.start()

    def _read_all(self) -> None:
        with self._reading:
            while (message := self._receive()) is not None:
                if (message := self._dispatch(message)) is not None:
                    self.inbox.put(message)
        self.inbox.put(None)

    def _receive(self) -> Any:
        try:
            message = receive(self.sock, self._frames)
        except OSError:
            message = None
        if message is None:
            self._fail_calls()
        return message

    def _dispatch(self, message: Any) -> Any:
        """A BLS answer, a cancel or a stream's credit taken care of here; any other message returned for
        the main thread."""
        match message:
            case msg.Reply(call) | channel.Controlled(call):
                with self._lock:
                    deliver = self._replies.pop(call, None)
                if deliver is not None:
                    deliver(message)
            case msg.Cancel(call):
                self.on_cancel(call)
            case msg.More(call, count):
                self.on_more(call, count)
            case channel.Dropped(call, index):
                self.on_drop(call, index)
            case _:
                return message
        return None

    def _fail_calls(self) -> None:
        """The server is gone: BLS calls still waiting get an error answer."""
        with self._lock:
            waiting, self._replies = self._replies, {}
        for call, deliver in waiting.items():
            gone = msg.Answered(None, pb_utils.TritonError.UNAVAILABLE, "the server went away")
            deliver(msg.Reply(call, [gone]))

    def call(self, message: msg.Call | channel.Control, deliver: Callable[[Any], None]) -> None:
        """Sends a BLS request or a model loading call (its call number set here); its answer goes to
        `deliver`."""
        self.start_reader()
        with self._lock:
            self._next += 1
            message.call = self._next
            self._replies[self._next] = deliver
        self.send(message)


class Calls:
    """BLS from this process (pb_utils.InferenceRequest.exec / async_exec): each request sent to the
    server, which runs it through the called model's scheduler and answers its responses."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> list[pb_utils.InferenceResponse]:
        done, answer = threading.Event(), []

        def deliver(message: msg.Reply) -> None:
            answer.append(message)
            done.set()

        self.link.call(_bls_message(request, decoupled), deliver)
        done.wait()
        return _bls_responses(answer[0])

    async def async_exec(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> list[pb_utils.InferenceResponse]:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self.link.call(
            _bls_message(request, decoupled),
            lambda message: loop.call_soon_threadsafe(answer.set_result, message),
        )
        return _bls_responses(await answer)

    def control(self, operation: str, arguments: dict) -> Any:
        done, answer = threading.Event(), []

        def deliver(message: Any) -> None:
            answer.append(message)
            done.set()

        self.link.call(channel.Control(0, operation, arguments), deliver)
        done.wait()
        reply = answer[0]
        if not isinstance(reply, channel.Controlled):  # a Reply: the server went away
            raise pb_utils.TritonModelException(pb_utils.CONTROL_FAILED[operation] + "the server went away")
        if reply.error is not None:
            raise pb_utils.TritonModelException(pb_utils.CONTROL_FAILED[operation] + reply.error)
        return reply.result

    def watch_cancels(self) -> None:
        self.link.start_reader()  # a Dropped must arrive while the main thread runs execute


def _bls_message(request: pb_utils.InferenceRequest, decoupled: bool) -> msg.Call:
    tensors = [channel.inline(t.name(), t.as_numpy()) for t in request.inputs()]
    parent = request.trace()._trace  # a RemoteTrace (given a received request's trace()), or None
    return msg.Call(
        0, request.model_name(), request.model_version(), tensors, request.requested_output_names(),
        request.request_id(), request.correlation_id(), request.flags(), request.parameters(), decoupled,
        None if parent is None else parent.key,
    )  # fmt: skip


class RemoteTrace:
    """The server's trace of a request this process executes: a BLS call given it is traced there as
    its child (pb_utils.InferenceTrace holds it)."""

    def __init__(self, key: int, traceparent: str | None) -> None:
        self.key = key
        self.traceparent = traceparent


def _bls_responses(message: msg.Reply) -> list[pb_utils.InferenceResponse]:
    return [_response(answer) for answer in message.answers]


def _response(answer: msg.Answered) -> pb_utils.InferenceResponse:
    if answer.outputs is None:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.message, answer.code))
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor(t.name, channel.inline_array(t)) for t in answer.outputs]
    )


class _ToServer(logging.Handler):
    """pb_utils.Logger's lines (logger `tensorgate.model`), sent to the server's log."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError):
            self.link.send(msg.Log(record.levelno, record.getMessage()))


class _Monitor(AppMonitor):
    """grps's app_monitor in a model's process: each value checked here, recorded by the server's."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link

    def _put(self, name: str, aggregation: str, value: float) -> None:
        self._check(name, aggregation, value)
        self.link.send(msg.Metric(name, aggregation, value))


class Credit:
    """How many more answers a stream may send before its reader takes some (msg.MORE): a model that
    streams faster than its client reads waits in `spend`, as it would in the server's own process."""

    def __init__(self) -> None:
        self.left = msg.AHEAD
        self.ended = False
        self.changed = threading.Condition()

    def spend(self) -> bool:
        """Blocks for one answer's credit; False once the stream ended (cancelled, or the server left)."""
        with self.changed:
            self.changed.wait_for(lambda: self.left > 0 or self.ended)
            self.left -= 1
            return not self.ended

    def grant(self, count: int) -> None:
        with self.changed:
            self.left += count
            self.changed.notify_all()

    def end(self) -> None:
        with self.changed:
            self.ended = True
            self.changed.notify_all()


class Stub:
    def __init__(self, link: Link, arena: BatchArena) -> None:
        self.link = link
        self.arena = arena
        self.streams: dict[int, Any] = {}  # call -> a streamed request's sender, or our API's stop event
        self.credits: dict[int, Credit] = {}  # call -> its stream's credit
        link.on_more = self.grant
        self.loop: asyncio.AbstractEventLoop | None = None  # for `async def execute`, made when needed
        self.executing: tuple[int, list[pb_utils.InferenceRequest]] = (0, [])  # a Triton batch's
        link.on_drop = self.drop

    # ------------------------------------------------------------------------------------- loading

    def load(self, config: dict, version: int, version_dir: str, instance: int) -> dict:
        self.config = config
        self.name = config["name"]
        self.version = version
        self.module = ModelModule(Path(version_dir), config, version)
        self.model = self.module.model_class()
        self.triton = self.module.uses_triton_api
        if self.triton:
            return self._load_triton(config, version, instance)
        return self._load_ours(config)

    def _load_triton(self, config: dict, version: int, instance: int) -> dict:
        from tensorgate.batcher.sequence_inputs import added_inputs
        from tensorgate.server.backends.triton_python import initialize_args

        if getattr(self.model, "execute", None) is None:
            raise TypeError(f"{self.module.path}: TritonPythonModel must define execute(self, requests)")
        self.dtypes = {entry["name"]: BY_CONFIG[entry["data_type"]].v2 for entry in config["input"]}
        self.dtypes.update({name: BY_CONFIG[t].v2 for name, t in added_inputs(config).items()})
        if hasattr(self.model, "initialize"):
            self._call(self.model.initialize, initialize_args(config, version, self.module.path, instance))
        return {"triton": True}

    def _load_ours(self, config: dict) -> dict:
        from tensorgate.server.backends.python import _takes_parameters

        if hasattr(self.model, "initialize"):
            self._call(self.model.initialize, config)
        execute = getattr(self.model, "execute", None)
        stream = getattr(self.model, "execute_stream", None)
        if stream is not None and not inspect.isasyncgenfunction(stream):
            raise TypeError(f"{self.module.path}: execute_stream must be an async generator")
        if getattr(self.model, "handle_http", None) is not None:
            raise TypeError(
                f"{self.module.path}: handle_http runs in the server's process: "
                'set parameters { key: "EXECUTION_MODE" value: { string_value: "thread" } }'
            )
        with_parameters = (execute is not None and _takes_parameters(execute)) or (
            stream is not None and _takes_parameters(stream)
        )
        self.with_parameters = with_parameters
        return {
            "triton": False,
            "execute": execute is not None,
            "stream": stream is not None,
            "with_parameters": with_parameters,
        }

    def _call(self, function: Any, *args: Any) -> Any:
        """A model method, awaited on this process's loop when it is `async def`."""
        result = function(*args)
        if inspect.isawaitable(result):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            result = self.loop.run_until_complete(result)
        return result

    # ------------------------------------------------------------------------------------- serving

    def serve(self) -> None:
        link = self.link
        while True:
            message = link.next()
            if message is None or type(message) is msg.Stop:
                return
            try:
                match message:
                    case msg.Execute():
                        self.arena.follow(message.arena_size)
                        self._execute(message)
                    case msg.Open():
                        link.start_reader()  # its cancel must arrive while the main thread is busy
                        self._stream(message)
            except Exception as e:  # noqa: BLE001 (the model's fault fails its call, not the process)
                link.send(_raised(message.call, e))

    def _execute(self, message: msg.Execute) -> None:
        call, end = message.call, message.end
        if self.triton:
            answers = []
            requests = [self._request(batched.inputs, batched.meta, None) for batched in message.requests]
            self.executing = (call, requests)
            try:
                responses = self._call(self.model.execute, requests)
            finally:
                self.executing = (0, [])
            for outputs in _checked(self.name, len(requests), responses):
                if isinstance(outputs, dict):
                    if end < 0:  # a small batch: its answers in the message too
                        tensors = channel.inline_all(outputs)
                    else:
                        tensors, end = self.arena.write(outputs, end)
                    answers.append(msg.Answered(tensors))
                else:
                    answers.append(msg.Answered(None, outputs.code(), outputs.message()))
            self.link.send(msg.Outputs(call, self.arena.size, answers=answers))
            return
        parameters = message.parameters or {}
        inputs = {t.name: self.arena.read(t, copy=False) for t in message.requests[0].inputs}
        execute = self.model.execute
        produced = (
            self._call(execute, inputs, parameters) if self.with_parameters else self._call(execute, inputs)
        )
        if not isinstance(produced, dict):
            self.link.send(msg.Outputs(call, self.arena.size, returned=type(produced).__name__))
            return
        outputs = {name: channel.as_array(value) for name, value in produced.items()}
        tensors = channel.inline_all(outputs) if end < 0 else self.arena.write(outputs, end)[0]
        self.link.send(msg.Outputs(call, self.arena.size, outputs=tensors))

    def _request(
        self, inputs: list[msg.Tensor], meta: msg.Meta | None, sender: Any
    ) -> pb_utils.InferenceRequest:
        request = pb_utils.InferenceRequest(self.name, model_version=self.version)
        request._inputs = [
            pb_utils.Tensor._of(t.name, self.arena.read(t, copy=False), self.dtypes[t.name]) for t in inputs
        ]
        if meta is not None:
            request._request_id, request._correlation_id, request._flags = (
                meta.id,
                meta.correlation_id,
                meta.flags,
            )
            request._parameters = meta.parameters
            if meta.requested is not None:
                request._requested = meta.requested
            if meta.trace is not None:
                request._trace = pb_utils.InferenceTrace(RemoteTrace(meta.trace.key, meta.trace.traceparent))
        request._sender = sender
        return request

    def _stream(self, message: msg.Open) -> None:
        call, inputs = message.call, message.inputs
        credit = self.credits[call] = Credit()
        if self.triton:
            link = self.link

            def deliver(response: pb_utils.InferenceResponse | None, flags: int) -> None:
                if response is not None and credit.spend():
                    link.send(msg.Part(call, channel.answered(response)))
                if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                    self.streams.pop(call, None)
                    self.credits.pop(call, None)
                    link.send(msg.End(call, channel.EMPTY if response is None else None))

            sender = pb_utils.InferenceResponseSender(deliver)
            self.streams[call] = sender
            try:
                self._call(self.model.execute, [self._request(inputs, message.meta, sender)])
            except BaseException:
                self.streams.pop(call, None)
                self.credits.pop(call, None)
                raise
            return
        stop = threading.Event()
        self.streams[call] = stop
        arrays = {t.name: channel.inline_array(t) for t in inputs}
        args = (call, arrays, message.parameters or {}, stop, credit)
        threading.Thread(target=self._run_stream, args=args, daemon=True).start()

    def _run_stream(
        self, call: int, inputs: dict, parameters: Any, stop: threading.Event, credit: Credit
    ) -> None:
        """Our API's `execute_stream` in its own thread: each yield a PART, until the end or CANCEL."""

        async def drive() -> None:
            stream = self.model.execute_stream
            produced = stream(inputs, parameters) if self.with_parameters else stream(inputs)
            try:
                async for outputs in produced:
                    if stop.is_set():
                        return
                    if not isinstance(outputs, dict):
                        raise TypeError(
                            f"execute_stream yielded {type(outputs).__name__}, not a dict of outputs"
                        )
                    tensors = [channel.inline(n, channel.as_array(v)) for n, v in outputs.items()]
                    if not credit.spend():  # blocks this stream's thread: the generator waits too
                        return
                    self.link.send(msg.Part(call, msg.Answered(tensors)))
            finally:
                await produced.aclose()

        try:
            asyncio.run(drive())
            message: Any = msg.End(call)
        except Exception as e:  # noqa: BLE001
            message = _raised(call, e)
        finally:
            self.streams.pop(call, None)
            self.credits.pop(call, None)
        if not stop.is_set():
            self.link.send(message)

    def grant(self, call: int, count: int) -> None:
        """A stream's reader took `count` answers (called by the reader thread)."""
        credit = self.credits.get(call)
        if credit is not None:
            credit.grant(count)

    def drop(self, call: int, index: int) -> None:
        """Request `index` of batch `call` lost its client (called by the reader thread)."""
        executing, requests = self.executing
        if executing == call and index < len(requests):
            requests[index]._cancelled = True

    def cancel(self, call: int) -> None:
        """The client of a streamed request went away (called by the reader thread)."""
        held = self.streams.pop(call, None)
        credit = self.credits.pop(call, None)
        if credit is not None:
            credit.end()
        if isinstance(held, threading.Event):
            held.set()
        elif held is not None:
            held._cancelled = True

    def finalize(self) -> None:
        self.module.unload(self.model)


def _checked(name: str, count: int, responses: Any) -> list[dict | pb_utils.TritonError]:
    """A Triton model's responses, one per request: its outputs, or the TritonError that answers it."""
    if not isinstance(responses, list) or len(responses) != count:
        got = f"{len(responses)} responses" if isinstance(responses, list) else repr(type(responses).__name__)
        raise InferError(
            ErrorKind.INTERNAL,
            f"model '{name}': execute() must return a list of one InferenceResponse per request "
            f"({count}), got {got}",
        )
    answers: list[dict | pb_utils.TritonError] = []
    for response in responses:
        if not isinstance(response, pb_utils.InferenceResponse):
            answers.append(
                pb_utils.TritonError(
                    f"model '{name}': execute() returned {type(response).__name__} where an "
                    "InferenceResponse was expected"
                )
            )
        elif response.has_error():
            answers.append(response.error())
        else:
            answers.append({t.name(): channel.as_array(t.as_numpy()) for t in response.output_tensors()})
    return answers


def _raised(call: int, error: BaseException) -> msg.Raised:
    """An InferError's kind and message as they are (no traceback); else kind None, the exception, and
    its traceback for the server's log."""
    if isinstance(error, InferError):
        return msg.Raised(call, error.kind.name, error.message)
    return msg.Raised(
        call, None, f"{type(error).__name__}: {error}", "".join(traceback.format_exception(error))
    )


def main(argv: list[str]) -> int:
    kin.die_with_parent()  # SIGKILL: nothing of the model's runs once the server is gone
    link = Link(socket.socket(fileno=int(argv[0])))
    first = link.first()
    if first is None:
        return 0
    logging.getLogger("tensorgate.model").addHandler(_ToServer(link))
    logging.getLogger("tensorgate.model").setLevel(logging.DEBUG)
    logging.getLogger("tensorgate.model").propagate = False
    pb_utils.attach_caller(Calls(link))
    use_app_monitor(_Monitor(link))
    custom_metrics.forward = lambda operation: link.send(
        msg.Metric(json.dumps(operation), custom_metrics.OPERATION, 0.0)
    )
    if isinstance(first, msg.Complete):
        return _complete(link, first.config, first.version_dir)
    if not isinstance(first, msg.Load):
        return 2
    stub = Stub(link, BatchArena(first.arena_size, int(argv[1])))
    link.on_cancel = stub.cancel
    try:
        info = stub.load(first.config, first.version, first.version_dir, first.instance)
    except BaseException as e:  # noqa: BLE001 (a model's code may raise anything, SystemExit included)
        link.send(msg.Failed(f"{type(e).__name__}: {e}"))
        return 1
    link.send(msg.Ready(info))
    try:
        stub.serve()
    finally:
        stub.finalize()
    return 0


def _complete(link: Link, config: dict, version_dir: str) -> int:
    """auto_complete_config, run here so that the model's code never runs in the server's process."""
    from tensorgate.server.backends.triton_python import complete

    try:
        completed = complete(Path(version_dir), config)
    except BaseException as e:  # noqa: BLE001
        link.send(msg.Failed(f"{type(e).__name__}: {e}"))
        return 1
    link.send(msg.Ready(json.dumps(completed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
