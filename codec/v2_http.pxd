# Cython's declarations for v2_http.py (an augmenting .pxd: v2_http.py stays the source, and pure Python
# never reads this file): an input's JSON read with the dict's own C calls.

cimport cython


@cython.locals(raw=dict)
cpdef tuple _decode_input(given, binary, offset, model_name, max_input_size)
