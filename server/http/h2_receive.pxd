# Cython's declarations for h2_receive.py (an augmenting .pxd: h2_receive.py stays the source, and pure
# Python never reads this file): an HTTP/2 connection's receiving half as an extension type, with the
# state of the connection it reads and writes (h2.py sets it), so each frame's handling reads C fields.

from tensorgate.server.http.connection cimport BaseConnection


cdef class FrameReceiver(BaseConnection):
    cdef public object decoder, heads, continuing, last_stream_id, budget_second, resets, control_frames
    cdef public object answer_writes, last_ping, ping_strikes, pings_without_data
    cdef public object calls, streams, closed_ids, reset_ids, flow, peer_max_frame, window_waiters
    cdef public object goaway_sent, shutting_down, since, direct_stream
