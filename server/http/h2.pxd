# Cython's declarations for h2.py (an augmenting .pxd: h2.py stays the source, and pure Python never
# reads this file): an HTTP/2 connection as an extension type, on its receiving half (h2_receive.pxd).

from tensorgate.server.http.h2_receive cimport FrameReceiver


cdef class H2Connection(FrameReceiver):
    cdef public object buffer, view, start, end, filled, direct, preface, closing
    cdef public object keepalive, awaiting_ack, draining, age, grace
