"""HTTP/2 flow control (RFC 9113 6.9), sans-IO: one object per connection owns it, both ways.

- Sending: what the peer lets us send, on the connection and on each stream (a stream's `send_window`,
  which starts at the peer's SETTINGS_INITIAL_WINDOW_SIZE and may go below 0 when that setting shrinks).
  An answer's DATA takes `room(stream)` at most and `spend`s what it sends.
- Receiving: a `ReceiveWindow` for the connection and one per stream, as h2's WindowManager: what the
  peer may still send, and the WINDOW_UPDATE that gives back what was received and read. What a handler
  has not read yet (a gRPC message waiting for its handler) stays out of the window, so a peer sending
  faster than the server reads is stopped by its window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.http.h2_frames import (
    DEFAULT_WINDOW,
    FLOW_CONTROL_ERROR,
    MAX_WINDOW,
    OUR_CONNECTION_WINDOW,
    PROTOCOL_ERROR,
    ConnectionError_,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from server.http.h2_frames import Stream


class ReceiveWindow:
    """What the peer may still send (`open`) out of `size`."""

    __slots__ = ("size", "open")

    def __init__(self, size: int) -> None:
        self.size = self.open = size

    def take(self, length: int) -> bool:
        """A DATA frame of `length` came: False when it overran the window (nothing taken)."""
        if length > self.open:
            return False
        self.open -= length
        return True

    def credit(self, unread: int = 0) -> int:
        """The WINDOW_UPDATE increment to send now for what was received and read (all but `unread`
        bytes), 0 for none yet: given back once it is half the window, or once the window is below half
        (a peer waiting on it gets what was read so far)."""
        owed = self.size - self.open - unread
        if owed >= self.size // 2 or (owed > 0 and self.open < self.size // 2):
            self.open += owed
            return owed
        return 0


class FlowControl:
    """A connection's windows: the connection's both ways, the peer's initial stream window, and the
    accounting of the streams' send windows (kept on the streams)."""

    __slots__ = ("send", "peer_initial", "receive")

    def __init__(self) -> None:
        self.send = DEFAULT_WINDOW  # what we may still send on the connection
        self.peer_initial = DEFAULT_WINDOW  # a new stream's send window
        # What the peer may send on the connection: ours from the start (a WINDOW_UPDATE raises the
        # default to it with our SETTINGS).
        self.receive = ReceiveWindow(OUR_CONNECTION_WINDOW)

    def room(self, stream: Stream) -> int:
        """The most DATA the stream may send now."""
        return min(stream.send_window, self.send)

    def spend(self, stream: Stream, size: int) -> None:
        stream.send_window -= size
        self.send -= size

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
