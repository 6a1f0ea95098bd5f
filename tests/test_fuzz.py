"""The fuzz targets (fuzz/targets.py) in the suite: each seed passes through its target, and each target
runs under atheris for a few seconds (`make fuzz` runs them for longer), so the targets keep working.
Inputs the fuzzer found that once broke a parser are named regression tests here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fuzz.targets import TARGETS, run_one, seeds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = 3


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_seed_passes_its_target(name: str) -> None:
    corpus = seeds(name)
    assert corpus, f"fuzz/corpus/{name} has no seeds"
    for data in corpus:
        run_one(name, data)


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_short_fuzz_run_finds_nothing(name: str) -> None:
    pytest.importorskip("atheris")
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", "--seconds", str(SECONDS), "--only", name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "nothing found" in done.stdout
