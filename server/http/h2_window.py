"""HTTP/2 flow control (RFC 9113 6.9), sans-IO: one object per connection owns the accounting, both ways.

- Sending: what the peer lets us send, on the connection (`send`) and on each stream (its
  `send_window`, which starts at the peer's SETTINGS_INITIAL_WINDOW_SIZE and may go below 0 when that
  setting shrinks). An answer's DATA takes `room(stream)` at most and `spend`s what it sends.
- Receiving: what the peer may still send, on the connection (`receive`) and on each stream (its
  `recv_window`), and the WINDOW_UPDATEs that give back what was received and read, as h2's
  WindowManager gives them: once half the window is owed, or once the window is below half (a peer
  waiting on it gets what was read so far). What a handler has not read yet (a gRPC message waiting for
  its handler) stays out of the window, so a peer sending faster than the server reads is stopped by it.

Windows are plain integers on the streams and here: a stream costs no window object (the hot path of
a small request opens one per request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorgate.server.http.h2_frames import (
    DEFAULT_WINDOW,
    FLOW_CONTROL_ERROR,
    MAX_WINDOW,
    OUR_CONNECTION_WINDOW,
    OUR_STREAM_WINDOW,
    PROTOCOL_ERROR,
    ConnectionError_,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tensorgate.server.http.h2_frames import Stream

_HALF_CONNECTION = OUR_CONNECTION_WINDOW // 2
_HALF_STREAM = OUR_STREAM_WINDOW // 2


class FlowControl:
    """A connection's windows and its streams' accounting."""

    __slots__ = ("send", "peer_initial", "receive")

    def __init__(self) -> None:
        self.send = DEFAULT_WINDOW  # what we may still send on the connection
        self.peer_initial = DEFAULT_WINDOW  # a new stream's send window
        # What the peer may send on the connection: ours from the start (a WINDOW_UPDATE raises the
        # default to it with our SETTINGS).
        self.receive = OUR_CONNECTION_WINDOW

    # ---- sending

    def room(self, stream: Stream) -> int:
        """The most DATA the stream may send now."""
        return min(stream.send_window, self.send)

    def spend(self, stream: Stream, size: int) -> None:
        stream.send_window -= size
        self.send -= size

    def take(self, stream: Stream, size: int) -> bool:
        """`size` bytes of DATA spent if both windows have room for them, else False (nothing spent)."""
        if size > stream.send_window or size > self.send:
            return False
        stream.send_window -= size
        self.send -= size
        return True

    def connection_opened(self, increment: int) -> None:
        """A WINDOW_UPDATE on stream 0; a connection error when it breaks the rules."""
        if increment == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        self.send += increment
        if self.send > MAX_WINDOW:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window above 2^31-1")

    @staticmethod
    def stream_opened(stream: Stream, increment: int) -> int | None:
        """A WINDOW_UPDATE on a stream: the stream error's code when it breaks the rules, else None."""
        if increment == 0:
            return PROTOCOL_ERROR
        stream.send_window += increment
        return FLOW_CONTROL_ERROR if stream.send_window > MAX_WINDOW else None

    def initial_changed(self, value: int, streams: Iterable[Stream]) -> None:
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: every open stream's window moves by the change."""
        delta = value - self.peer_initial
        self.peer_initial = value
        for stream in streams:
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")

    # ---- receiving

    def received(self, length: int) -> int:
        """A DATA frame of `length` on the connection: the connection's WINDOW_UPDATE increment to send
        now (what came is given back as it comes; the streams hold back what is unread), or 0."""
        if length > self.receive:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self.receive -= length
        if self.receive >= _HALF_CONNECTION:
            return 0
        increment = OUR_CONNECTION_WINDOW - self.receive
        self.receive = OUR_CONNECTION_WINDOW
        return increment

    @staticmethod
    def credit(stream: Stream, unread: int = 0) -> int:
        """The stream's WINDOW_UPDATE increment to send now for what was received and read (all but
        `unread` bytes), or 0."""
        owed = OUR_STREAM_WINDOW - stream.recv_window - unread
        if owed >= _HALF_STREAM or (owed > 0 and stream.recv_window < _HALF_STREAM):
            stream.recv_window += owed
            return owed
        return 0
