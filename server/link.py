"""One end of a socket between two of the server's processes, on the event loop: a front-end worker and
its engine (one socketpair per worker), or the server and a python model's process. Messages are
codec/messages.py's, framed by codec/framing.py.

Messages one event-loop pass sends go out together at its end, in one write: at tens of thousands of
requests a second, a write per message was a system call per request on each side. A read hands every
whole message in it to `on_message` in order, in the read callback itself (no task per message).

No call waits on a message that was lost here: a fault handling one, or a message that does not match
its kind, goes to `on_fault` (which answers its call with an error), and bytes that do not decode end
the link (`on_lost` fails every call). A link
whose peer stops reading pauses its writer: `paused` is set, and a caller about to start a call awaits
`drain()` first, so a backlog waits in the callers (bounded by their clients) rather than in memory.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from tensorgate.codec.framing import LENGTH, NOTHING, FrameReader, Invalid, pack

log = logging.getLogger("tensorgate.link")


class Link(asyncio.BufferedProtocol):
    def __init__(
        self,
        on_message: Callable[[Any], None],
        on_lost: Callable[[], None],
        on_fault: Callable[[Any, Exception], None],
        frames: FrameReader | None = None,
    ) -> None:
        """`frames`: the reader of what the peer sends (its decoder: the messages it may send)."""
        self.on_message = on_message
        self.on_lost = on_lost
        self.on_fault = on_fault  # (the message, what its handling raised)
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the peer is not reading: callers await drain() before a new call
        self.drained: asyncio.Future | None = None
        self.reading = True
        self.loop = asyncio.get_running_loop()
        self.out: list[bytes] = []
        self.flush_pending = False
        self.frames = frames or FrameReader()

    # ---- sending

    def send(self, message: Any) -> None:
        """Queues a message for the end of this event-loop pass."""
        data = pack(message)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)
        self.out.append(LENGTH.pack(len(data)))
        self.out.append(data)

    def flush(self) -> None:
        self.flush_pending = False
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    async def drain(self) -> None:
        """Returns once the peer reads again (at once unless paused)."""
        while self.paused and self.transport is not None:
            if self.drained is None or self.drained.done():
                self.drained = self.loop.create_future()
            await asyncio.shield(self.drained)

    # ---- asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.resume_writing()
        self.on_lost()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.get_buffer(sizehint)

    def pause_reading(self) -> None:
        """No more messages handed on (not even those already read) until resume_reading."""
        self.reading = False
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.reading = True
        if self.transport is not None:
            self.transport.resume_reading()
        if self.frames.pending:
            self.loop.call_soon(self._deliver)

    def buffer_updated(self, nbytes: int) -> None:
        self.frames.received(nbytes)
        self._deliver()

    def _deliver(self) -> None:
        frames = self.frames
        while self.reading:
            try:
                message = frames.next()
            except Invalid as e:  # dropped: the call it names fails
                log.error("a message over the link does not match its kind: %s", e)
                self.on_fault(e, e)
                continue
            except Exception:  # not our framing: nothing after it can be trusted
                log.exception("a message over the link does not decode; the link is closed")
                frames.start = frames.end = 0
                if self.transport is not None:
                    self.transport.abort()
                return
            if message is NOTHING:
                return
            try:
                self.on_message(message)
            except Exception as e:  # a fault handling one message fails that call alone, not the link
                log.exception("a message over the link failed")
                self.on_fault(message, e)

    def close(self) -> None:
        if self.transport is not None:
            self.flush()
            self.transport.close()


class Inbox:
    """What a call receives, in order, until it ends: Messages, then its End (or an Error)."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.waiter: asyncio.Future | None = None

    def put(self, message: Any) -> None:
        self.items.append(message)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self) -> Any:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.items.popleft()


class Credit:
    """How many more messages a stream may send before its consumer takes some (codec.messages.More)."""

    __slots__ = ("left", "waiter")

    def __init__(self, ahead: int) -> None:
        self.left = ahead
        self.waiter: asyncio.Future | None = None

    async def spend(self) -> None:
        while self.left <= 0:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        self.left -= 1

    def grant(self, count: int) -> None:
        self.left += count
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
