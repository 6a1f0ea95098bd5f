"""The build: the packages installed under one name, `tensorgate` (the repository's server/, codec/,
batcher/, proto/ and perf/ are tensorgate.server, tensorgate.codec, ...: no generic top-level name in
site-packages), and the modules of the request path compiled with Cython from their .py sources (pure-Python
mode: the .py files stay the source, and nothing in them is Cython-specific), as uvloop, httptools and
msgspec are built. Which modules, and why those: pyproject.toml, [tool.tensorgate] compiled.

- TENSORGATE_COMPILE=0 at build time: nothing is compiled (a pure-Python install; no C compiler needed).
- TENSORGATE_PURE_PYTHON=1 at run time: a compiled install runs its .py sources (codec/purepython.py).
"""

import os
import tomllib

from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ("server", "codec", "batcher", "proto", "perf")  # bench/, tests/ and fuzz/ are not shipped


def packages() -> list[str]:
    """Every package under PACKAGES (a folder with an __init__.py), by its installed name."""
    found = []
    for top in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                found.append("tensorgate." + os.path.relpath(folder, ROOT).replace(os.sep, "."))
    return sorted(found)


def pxd_include() -> str:
    """A folder where each package is found by its installed name (build/pxd/tensorgate/server -> server/,
    ...): Cython looks for a module's augmenting .pxd by the module's full name, tensorgate.batcher.stats,
    so beside batcher/stats.py it would not find batcher/stats.pxd."""
    root = os.path.join(ROOT, "build", "pxd", "tensorgate")
    os.makedirs(root, exist_ok=True)
    for top in PACKAGES:
        link = os.path.join(root, top)
        if not os.path.islink(link):
            os.symlink(os.path.join("..", "..", "..", top), link)
    return os.path.dirname(root)


def extensions() -> list:
    if os.environ.get("TENSORGATE_COMPILE", "1") == "0":
        return []
    from Cython.Build import cythonize

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        modules = tomllib.load(f)["tool"]["tensorgate"]["compiled"]
    return cythonize(
        [Extension(f"tensorgate.{name}", [name.replace(".", "/") + ".py"]) for name in modules],
        build_dir="build/cython",  # the generated C, out of the source tree
        include_path=[pxd_include()],
        nthreads=os.cpu_count() or 1,
        quiet=True,
        # annotation_typing off: type hints stay hints (with it, `x: float` would become a C double and
        # `x: dict` would refuse a dict's subclass), so the compiled modules behave as their sources do
        compiler_directives={"language_level": 3, "annotation_typing": False},
    )


setup(
    packages=packages(),
    package_dir={f"tensorgate.{top}": top for top in PACKAGES},
    ext_modules=extensions(),
)
