# Cython's declarations for grpc_call.py (an augmenting .pxd: grpc_call.py stays the source, and pure
# Python never reads this file): a call and the services' table as extension types, so a call's methods
# read and write its state as C fields.

cdef class GrpcServices:
    cdef public object servicers, forward, handlers, max_message_bytes, restricted, names


cdef class GrpcCall:
    cdef public object connection, stream, handler, restriction, max_bytes, reader, messages
    cdef public object queued, received, ended, failure, waiter, consumer, held, told_end
    cdef public object headers_sent, encoding, answer_encoding, metadata, task, started, read, answer
