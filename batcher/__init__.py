import tensorgate.codec  # noqa: F401  (first: with TENSORGATE_PURE_PYTHON=1 it loads our modules from source)
