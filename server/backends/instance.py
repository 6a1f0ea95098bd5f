"""One instance of a python model in a process of its own (`EXECUTION_MODE process`, server/backends/
process.py schedules batches over them): the process started on server/backends/stub.py with the model's
interpreter, its model loaded, the calls it answers over its socket, and how it ended when it dies. Also
the python a model's processes run (EXECUTION_ENV_PATH) and auto_complete_config run in such a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

import tensorgate.server.backends.channel as channel
import tensorgate.server.backends.custom_metrics as custom_metrics
import tensorgate.server.backends.pb_utils as pb_utils
from tensorgate.codec import messages as msg
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.framing import FrameReader, frame, receive
from tensorgate.server.backends.channel import BatchArena
from tensorgate.server.link import Link
from tensorgate.server.model_config import parameter

log = logging.getLogger("tensorgate.python")
FROM_MODEL = msgspec.msgpack.Decoder(channel.FROM_MODEL)
model_log = logging.getLogger("tensorgate.model")

ARENA_SIZE = 1 << 20  # to start with: it grows to the largest batch
START_TIMEOUT = 120.0  # s for a process to load its model (initialize included)
STOP_TIMEOUT = 10.0  # s for finalize at unload, before the process is killed
# The folder that holds the server's own packages (server/, codec/, ...: the repository, or
# site-packages/tensorgate in an install), for processes that run another environment's interpreter; they
# import it as the package `tensorgate`, and what that environment lacks is found in the server's sys.path.
ROOT = str(Path(__file__).resolve().parents[2])
BOOTSTRAP = (
    "import os, sys, types, runpy; "
    "sys.path.extend(os.environ['TENSORGATE_FALLBACK_PATH'].split(os.pathsep)); "
    "package = sys.modules['tensorgate'] = types.ModuleType('tensorgate'); "
    "package.__path__ = [os.environ['TENSORGATE_ROOT']]; "
    "runpy.run_module('tensorgate.server.backends.stub', run_name='__main__', alter_sys=True)"
)


class NotStarted(Exception):
    """A batch that was waiting behind the one its instance died executing: the process never began it,
    so it goes to another instance (server/backends/process.py) rather than failing."""


class Owner(Protocol):
    """What an instance needs of the backend whose instance it is (server/backends/process.py)."""

    name: str
    config: dict
    version: int
    version_dir: Path
    python: str

    def lost(self, instance: Instance) -> None:
        """The instance died: have it restarted."""

    def record(self, name: str, aggregation: str, value: float) -> None:
        """A value the model gave grps's app_monitor."""

    def bls(self, instance: Instance, message: list) -> None:
        """A BLS request from the model's process, to be answered over its socket."""

    def control(self, instance: Instance, message: channel.Control) -> None:
        """A model loading call from the model's process, to be answered over its socket."""

    def control_now(self, message: channel.Control) -> channel.Controlled:
        """Blocking, off the loop: a model loading call made by initialize."""


def start_stub(python: str, arena_fd: int = -1) -> tuple[subprocess.Popen, socket.socket]:
    """A process running server/backends/stub.py with `python`, and the server's end of its socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {
        **os.environ,
        "TENSORGATE_ROOT": ROOT,
        "TENSORGATE_FALLBACK_PATH": os.pathsep.join(p for p in sys.path if p),
    }
    fds = (theirs.fileno(),) if arena_fd < 0 else (theirs.fileno(), arena_fd)
    try:
        process = subprocess.Popen(
            [python, "-c", BOOTSTRAP, str(theirs.fileno()), str(arena_fd)], pass_fds=fds, env=env
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


class Instance:
    """One process of the model and the server's end of its socket."""

    def __init__(self, owner: Owner, index: int) -> None:
        self.owner = owner
        self.index = index
        label = owner.name.encode()[:200].decode(errors="ignore")  # the kernel takes at most 249 bytes
        self.arena = BatchArena(ARENA_SIZE, name=f"tensorgate-{label}-{index}")
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.link: Link | None = None  # on the server's loop, once attached
        self.alive = False
        self.stopping = False
        self.cause = ""  # why the server killed it (a timeout), for the error of its requests
        # call -> the future of its answer and what reads it as it arrives; or a stream's queue
        self.calls: dict[int, tuple[asyncio.Future, Callable[[Instance, list], Any]] | asyncio.Queue] = {}
        self.held = 0  # batches sent to it and not yet answered (server/backends/process.py)
        self.bls: set[int] = set()  # the BLS calls it is making, as their answers are awaited
        self.frames = FrameReader(FROM_MODEL)  # the handshake's, then the link's (bytes read ahead stay)
        self.next_call = 0
        self.failures = 0  # consecutive failed starts or deaths: the backoff grows with them

    # ---------------------------------------------------------------------------------- lifecycle

    def spawn(self) -> None:
        """Starts the process (on the thread that stays: the kernel's parent-death signal follows the
        thread that forked, server/backends/stub.py)."""
        self.process, self.sock = start_stub(self.owner.python, self.arena.fd)
        self.bls = set()
        owner = self.owner
        load = msg.Load(owner.config, owner.version, str(owner.version_dir), self.index, self.arena.size)
        self.sock.sendall(frame(load))

    def handshake(self) -> dict:
        """Blocking: waits for the model to load in the process; its answer, or raises why not."""
        assert self.sock is not None and self.process is not None
        self.sock.settimeout(START_TIMEOUT)
        self.frames = FrameReader(FROM_MODEL)
        try:
            answer = receive(self.sock, self.frames)
            while isinstance(answer, msg.Log | msg.Metric | msg.Call | channel.Control):
                if isinstance(answer, channel.Control):  # load_model in initialize, as Triton's README
                    self.sock.sendall(frame(self.owner.control_now(answer)))
                elif isinstance(answer, msg.Call):  # from initialize: no loop serves this instance yet
                    refused = msg.Answered(
                        None, pb_utils.TritonError.UNAVAILABLE, "BLS is not available in initialize"
                    )
                    self.sock.sendall(frame(msg.Reply(answer.call, [refused])))
                else:
                    self.received(answer)
                answer = receive(self.sock, self.frames)
        except TimeoutError:
            self.kill()
            raise RuntimeError(
                f"instance {self.index} did not load its model in {START_TIMEOUT:.0f} s"
            ) from None
        if answer is None:  # it ended before answering: how, once it has
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
            self.kill()
            raise RuntimeError(f"instance {self.index} {exited(self.process)} while loading its model")
        if not isinstance(answer, msg.Ready):
            self.kill()
            raise RuntimeError(answer.reason if isinstance(answer, msg.Failed) else f"unexpected {answer!r}")
        self.sock.settimeout(None)
        self.sock.setblocking(False)
        self.alive = True
        return answer.info

    async def attach(self) -> None:
        """The socket handed to the event loop (once, from the loop: the instance serves from here on)."""
        loop = asyncio.get_running_loop()
        link = Link(self.received, self.died, self.fault)  # its frames: the handshake's (FROM_MODEL)
        link.frames = self.frames  # with what the handshake read past its answer, handed on now
        await loop.connect_accepted_socket(lambda: link, self.sock)
        self.link = link
        link.resume_reading()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()

    def stop(self) -> None:
        """Blocking: STOP sent, the process's last messages read (finalize's log lines) until it closes
        its end and exits; killed when finalize takes longer than STOP_TIMEOUT."""
        self.stopping = True
        process = self.process
        if process is None:
            return
        link = self.link
        loop = link.loop if link is not None else None
        if link is not None and link.transport is not None:
            # on the loop's thread: a transport is not thread-safe, and stop runs on an unloading thread
            on_loop(loop, lambda: (link.flush(), link.pause_reading()))  # read here from now on
        deadline = time.monotonic() + STOP_TIMEOUT
        try:
            if self.sock is not None:
                with socket.socket(fileno=os.dup(self.sock.fileno())) as reader:
                    reader.settimeout(STOP_TIMEOUT)
                    reader.sendall(frame(msg.Stop()))
                    while (message := receive(reader, self.frames)) is not None:
                        if isinstance(message, msg.Log | msg.Metric):
                            self.received(message)
                        reader.settimeout(max(0.01, deadline - time.monotonic()))
        except OSError:  # gone already; or finalize ran past its time (TimeoutError)
            pass
        if link is not None and link.transport is not None:
            on_loop(loop, link.close)
        if self.sock is not None:
            self.sock.close()
        try:
            process.wait(max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("model '%s' instance %d: finalize took over %.0f s; killed", self.owner.name,
                        self.index, STOP_TIMEOUT)  # fmt: skip
            process.kill()
            process.wait()

    # ---------------------------------------------------------------------------------- calls

    def call(self, message: msg.Execute, read: Callable[[Instance, Any], Any]) -> asyncio.Future:
        """Sends a batch; the future of what `read` makes of its answer as it arrives (what it raises, if
        it raises)."""
        future = asyncio.get_running_loop().create_future()
        self.calls[message.call] = (future, read)
        self.link.send(message)  # type: ignore[union-attr]
        return future

    def open_stream(self, message: msg.Open) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self.calls[message.call] = queue
        self.link.send(message)  # type: ignore[union-attr]
        return queue

    def new_call(self) -> int:
        self.next_call += 1
        return self.next_call

    def send(self, message: Any) -> None:
        transport = self.link.transport if self.link is not None else None
        if transport is not None and not transport.is_closing():
            self.link.send(message)  # type: ignore[union-attr]

    def fault(self, message: Any, error: Exception) -> None:
        """Handling a message from the process raised: the call it names fails now, not silently."""
        log.error("model '%s' instance %d: a message failed", self.owner.name, self.index, exc_info=error)
        target = self.calls.pop(getattr(message, "call", 0), None)
        failed = f"model '{self.owner.name}' instance {self.index}: {error!r}"
        if isinstance(target, asyncio.Queue):
            target.put_nowait(msg.Raised(0, ErrorKind.INTERNAL.name, failed))
        elif target is not None and not target[0].done():
            target[0].set_exception(InferError(ErrorKind.INTERNAL, failed))

    def received(self, message: Any) -> None:
        match message:
            case msg.Log(level, text):
                model_log.log(level, "%s", text)
                return
            case msg.Metric(text, custom_metrics.OPERATION):
                try:
                    custom_metrics.apply_forwarded(text)
                except Exception as e:  # checked in the process: a disagreement between processes
                    log.warning("%s: custom metric: %s", self.owner.name, e)
                return
            case msg.Metric(name, aggregation, value):
                self.owner.record(name, aggregation, value)
                return
            case msg.Call():
                self.owner.bls(self, message)
                return
            case channel.Control():
                self.owner.control(self, message)
                return
        call = message.call
        target = self.calls.get(call)
        if target is None:  # a cancelled stream's late answers
            return
        if isinstance(target, asyncio.Queue):
            target.put_nowait(message)
            if isinstance(message, msg.End | msg.Raised):
                del self.calls[call]
        else:
            del self.calls[call]
            future, read = target
            if not future.done():
                try:
                    future.set_result(read(self, message))
                except Exception as e:  # noqa: BLE001 (the call's error, to its caller)
                    future.set_exception(e)

    def died(self) -> None:
        """Its socket ended: the process is gone (or going). Fails what it held and has it restarted."""
        self.alive = False
        self.link = None
        process = self.process
        if process is not None:
            try:
                process.wait(5)  # the socket closes as the process exits: this is a moment at most
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.stopping:
            return
        cause = self.cause or exited(process)
        error = InferError(ErrorKind.INTERNAL, f"model '{self.owner.name}' instance {self.index} {cause}")
        log.error("%s", error.message)
        calls, self.calls = self.calls, {}
        # The process runs its batches one after another in the order they were sent: the oldest is the
        # one it died executing, the others never began.
        batches = [call for call, target in calls.items() if not isinstance(target, asyncio.Queue)]
        executing = min(batches, default=None)
        for call, target in calls.items():
            if isinstance(target, asyncio.Queue):
                target.put_nowait(msg.Raised(0, error.kind.name, error.message))
            elif not target[0].done():
                target[0].set_exception(error if call == executing else NotStarted())
        self.owner.lost(self)


def on_loop(loop: asyncio.AbstractEventLoop | None, action: Callable[[], Any]) -> Any:
    """Runs `action` on `loop`'s thread and returns what it returns (raises what it raises), waiting for
    it when called from another thread; here when the loop is not running (or closed)."""
    if loop is None or not loop.is_running():
        return action()
    try:
        if asyncio.get_running_loop() is loop:
            return action()
    except RuntimeError:
        pass
    done = threading.Event()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, action()))
        except BaseException as e:  # noqa: BLE001 (handed to the caller)
            outcome.append((False, e))
        done.set()

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError:  # closed meanwhile
        return action()
    done.wait()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def exited(process: subprocess.Popen | None) -> str:
    """How a process ended, as the error of its requests says it."""
    code = None if process is None else process.poll()
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"exited (signal {-code}: {signal.Signals(-code).name})"
        except ValueError:
            return f"exited (signal {-code})"
    return f"exited (exit code {code})"


def interpreter(config: dict, model_dir: Path) -> tuple[str, str | None]:
    """The python a model's processes run: the server's, or that of the venv folder or conda-pack tarball
    that EXECUTION_ENV_PATH names (relative to the model's folder; $$TRITON_MODEL_DIRECTORY too); and
    the folder a tarball was unpacked into (removed at unload), if any."""
    env_path = parameter(config, "EXECUTION_ENV_PATH")
    if not env_path:
        return sys.executable, None
    path = Path(env_path.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir)))
    if not path.is_absolute():
        path = model_dir / path
    unpacked = None
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        unpacked = tempfile.mkdtemp(prefix=f"tensorgate-env-{config['name']}-")
        with tarfile.open(path) as archive:
            archive.extractall(unpacked, filter="data")
        path = Path(unpacked)
    python = path / "bin" / "python"
    if not python.exists():
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
        raise FileNotFoundError(f"EXECUTION_ENV_PATH {env_path!r}: no bin/python in {path}")
    return str(python), unpacked


def complete_in_process(version_dir: Path, config: dict) -> dict:
    """auto_complete_config run in a process of its own, with the model's interpreter: in process mode
    the model's code never runs in the server's process."""
    python, unpacked = interpreter(config, version_dir.parent)
    try:
        process, ours = start_stub(python)
        with ours:
            ours.sendall(frame(msg.Complete(config, str(version_dir))))
            ours.settimeout(START_TIMEOUT)
            frames = FrameReader(FROM_MODEL)
            while isinstance(answer := receive(ours, frames), msg.Log):
                model_log.log(answer.level, "%s", answer.text)
        process.wait(STOP_TIMEOUT)
    finally:
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
    if answer is None:
        raise RuntimeError(f"auto_complete_config: the model's process {exited(process)}")
    if not isinstance(answer, msg.Ready):
        raise RuntimeError(answer.reason if isinstance(answer, msg.Failed) else f"unexpected {answer!r}")
    return json.loads(answer.info)
