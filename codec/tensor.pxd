# Cython's declarations for tensor.py (an augmenting .pxd: tensor.py stays the source, and pure Python never
# reads this file): the records every request builds as extension types, their __init__ filling C fields.

cdef class _Record:
    pass


cdef class Tensor(_Record):
    cdef public object name, datatype, shape, data, parameters


cdef class RequestedOutput(_Record):
    cdef public object name, binary, parameters, class_count


cdef class InferRequest(_Record):
    cdef public object model_name, model_version, id, inputs, outputs, parameters, binary_output
    cdef public object shared_memory, trace, sequence_id, sequence_flags


cdef class InferResponse(_Record):
    cdef public object model_name, model_version, outputs, id, parameters
