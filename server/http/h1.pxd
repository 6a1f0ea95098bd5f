# Cython's declarations for h1.py (an augmenting .pxd: h1.py stays the source, and pure Python never
# reads this file): an HTTP/1.1 connection as an extension type, so the parser's callbacks read and write
# its state as C fields.

from tensorgate.server.http.connection cimport BaseConnection


cdef class H1Connection(BaseConnection):
    cdef public object parser, request, head_bytes, max_head_bytes, pending, task, bypass, state, since
    cdef public object paused_reading, shutting_down, fresh, last_read
