"""The build: the modules of the request path compiled with Cython from their .py sources (pure-Python
mode: the .py files stay the source, and nothing in them is Cython-specific), as uvloop, httptools and
msgspec are built. Which modules, and why those: pyproject.toml, [tool.tensorgate] compiled.

- TENSORGATE_COMPILE=0 at build time: nothing is compiled (a pure-Python install; no C compiler needed).
- TENSORGATE_PURE_PYTHON=1 at run time: a compiled install runs its .py sources (codec/purepython.py).
"""

import os
import tomllib

from setuptools import setup


def extensions() -> list:
    if os.environ.get("TENSORGATE_COMPILE", "1") == "0":
        return []
    from Cython.Build import cythonize

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml"), "rb") as f:
        modules = tomllib.load(f)["tool"]["tensorgate"]["compiled"]
    return cythonize(
        [name.replace(".", "/") + ".py" for name in modules],
        build_dir="build/cython",  # the generated C, out of the source tree
        nthreads=os.cpu_count() or 1,
        quiet=True,
        # annotation_typing off: type hints stay hints (with it, `x: float` would become a C double and
        # `x: dict` would refuse a dict's subclass), so the compiled modules behave as their sources do
        compiler_directives={"language_level": 3, "annotation_typing": False},
    )


setup(ext_modules=extensions())
