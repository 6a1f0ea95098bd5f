"""Everything with I/O: CLI, ASGI app and router, model repository, backends."""

from importlib.metadata import PackageNotFoundError, version

import tensorgate.codec  # noqa: F401  (first: with TENSORGATE_PURE_PYTHON=1 it loads our modules from source)

try:
    __version__ = version("tensorgate")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
