# Cython's declarations for stats.py (an augmenting .pxd: stats.py stays the source, and pure Python never
# reads this file). The counters become extension types, so the hot path adds to them as C fields.

cimport cython


cdef class Duration:
    cdef public object count
    cdef public object ns

    cpdef add(self, ns, count=*)


cdef class BatchStats:
    cdef public object batch_size
    cdef public Duration compute_input, compute_infer, compute_output


cdef class ModelStats:
    cdef public list latencies
    cdef public object inference_count, execution_count, last_inference
    cdef public Duration success, fail, queue, compute_input, compute_infer, compute_output
    cdef public Duration cache_hit, cache_miss
    cdef public dict batch_stats, failures
    cdef public object observer

    @cython.locals(stats=BatchStats)
    cpdef record_alone(self, rows, ns)

    cpdef BatchStats _execution(self, rows)
