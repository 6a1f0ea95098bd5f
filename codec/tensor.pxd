# Cython's declarations for tensor.py (an augmenting .pxd: tensor.py stays the source, and pure Python never
# reads this file): the records every request builds as extension types, their __init__ filling C fields.

cdef class Tensor:
    cdef public object name, datatype, shape, data, parameters


cdef class RequestedOutput:
    cdef public object name, binary, parameters, class_count


cdef class InferRequest:
    cdef public object model_name, model_version, id, inputs, outputs, parameters, binary_output
    cdef public object shared_memory, trace, sequence_id, sequence_flags


cdef class InferResponse:
    cdef public object model_name, model_version, outputs, id, parameters
