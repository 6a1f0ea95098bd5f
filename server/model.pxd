# Cython's declarations for model.py (an augmenting .pxd: model.py stays the source, and pure Python never
# reads this file): a model version and its tensors' specs as extension types, so a request's path through
# them reads their state as C fields. A version keeps a __dict__ (what other modules may set on it) and
# weak references (server/tfserving.py's views).

cimport cython


cdef class TensorSpec:
    cdef public object name, dtype, batched, dims, shape, fixed, model_dims, optional


cdef class ModelVersion:
    cdef public object name, version, version_str, version_dir, config, max_batch_size
    cdef public object inputs, outputs, output_names, state, reason, backend, scheduler, executor
    cdef public object stream_only, streams, stats, labels, cache, _open_streams, limited, serial
    cdef dict __dict__
    cdef object __weakref__

    @cython.locals(spec=TensorSpec, arrays=dict, inputs=dict)
    cpdef tuple _inputs_and_rows(self, request)

    @cython.locals(spec=TensorSpec)
    cpdef _response_tensor(self, name, produced)

    cpdef list _wanted_outputs(self, request)
