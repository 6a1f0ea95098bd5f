# Cython's declarations for connection.py (an augmenting .pxd: connection.py stays the source, and pure
# Python never reads this file): the base of a connection as an extension type, so its methods and its
# subclasses' (h1.pxd) read and write the connection's state as C fields.

cdef class BaseConnection:
    cdef public object host, router, settings, loop, transport, writable, out, flush_pending
