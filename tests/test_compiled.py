"""The compiled request path (setup.py, pyproject.toml [tool.tensorgate] compiled) and its pure-Python run.

`make test` builds it first and sets TENSORGATE_REQUIRE_COMPILED=1: then every module of the list must
run compiled, from a build at least as new as its source. TENSORGATE_PURE_PYTHON=1 must run every one of
them from its .py, in a fresh interpreter as a server would start."""

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tensorgate.codec.purepython import is_compiled

ROOT = Path(__file__).resolve().parent.parent
COMPILED = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["tensorgate"]["compiled"]
PURE = os.environ.get("TENSORGATE_PURE_PYTHON", "") not in ("", "0")


def build_of(name: str) -> Path | None:
    found = sorted((ROOT / Path(*name.split(".")[:-1])).glob(name.rpartition(".")[2] + ".*.so"))
    return found[0] if found else None


def test_the_list_names_modules_that_exist() -> None:
    missing = [name for name in COMPILED if not (ROOT / (name.replace(".", "/") + ".py")).exists()]
    assert not missing, f"pyproject.toml [tool.tensorgate] compiled names modules with no source: {missing}"


@pytest.mark.skipif(PURE, reason="this run is the pure-Python one")
def test_every_listed_module_runs_compiled_when_built() -> None:
    if os.environ.get("TENSORGATE_REQUIRE_COMPILED") != "1" and all(build_of(n) is None for n in COMPILED):
        pytest.skip("no compiled build here (make compile builds it; make test requires it)")
    loaded = {name: importlib.import_module(f"tensorgate.{name}") for name in COMPILED}
    not_compiled = [name for name, module in loaded.items() if not is_compiled(module)]
    assert not not_compiled, f"run from source though listed as compiled (run make compile): {not_compiled}"
    stale = [
        name
        for name in COMPILED
        for source in (ROOT / (name.replace(".", "/") + ".py"), ROOT / (name.replace(".", "/") + ".pxd"))
        if source.exists() and source.stat().st_mtime > build_of(name).stat().st_mtime
    ]
    assert not stale, f"compiled from an older source (run make compile): {stale}"


HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not an extension type


@pytest.mark.skipif(PURE, reason="this run is the pure-Python one")
def test_the_classes_a_pxd_declares_are_extension_types_in_the_build() -> None:
    # Cython reads a module's .pxd only when it finds it by the module's full name (setup.py's pxd_include)
    declared = {
        name: [
            line.split()[2].split("(")[0].rstrip(":")  # `cdef class Name(Base):` -> Name
            for line in pxd.read_text().splitlines()
            if line.startswith("cdef class ")
        ]
        for name in COMPILED
        if (pxd := ROOT / (name.replace(".", "/") + ".pxd")).exists()
    }
    assert declared, "no module of the list has a .pxd"
    if all(build_of(name) is None for name in declared):
        pytest.skip("no compiled build here (make compile builds it; make test requires it)")
    for name, classes in declared.items():
        module = importlib.import_module(f"tensorgate.{name}")
        plain = [c for c in classes if getattr(module, c).__flags__ & HEAP_TYPE]
        assert not plain, f"{name}: declared in its .pxd but compiled as plain classes: {plain}"


def test_pure_python_runs_every_module_from_its_source() -> None:
    program = (
        "import importlib, sys\n"
        f"names = {[f'tensorgate.{name}' for name in COMPILED]!r}\n"
        "print('\\n'.join(importlib.import_module(n).__file__ for n in names))\n"
    )
    env = {**os.environ, "TENSORGATE_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    files = out.stdout.split()
    assert len(files) == len(COMPILED)
    assert all(file.endswith(".py") for file in files), files
