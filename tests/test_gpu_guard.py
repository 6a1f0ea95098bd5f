"""TENSORGATE_REQUIRE_GPU=1 (set by the GPU check kit): a GPU run without CUDA torch, a device or CuPy
stops at once and fails, instead of skipping every `gpu` test and looking green."""

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


def _gpu_ready() -> bool:
    try:
        import cupy
        import torch

        return torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def run_gpu_tests(require: bool) -> subprocess.CompletedProcess:
    """`pytest -m gpu` over the staging tests, with or without TENSORGATE_REQUIRE_GPU=1."""
    env = {k: v for k, v in os.environ.items() if k != "TENSORGATE_REQUIRE_GPU"}
    if require:
        env["TENSORGATE_REQUIRE_GPU"] = "1"
    argv = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*argv, os.path.join(TESTS, "test_staging.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(TESTS),
    )


@pytest.mark.skipif(_gpu_ready(), reason="a machine with CUDA torch and CuPy passes the guard")
def test_a_gpu_run_without_a_gpu_fails_instead_of_skipping() -> None:
    required = run_gpu_tests(require=True)
    assert required.returncode != 0, required.stdout
    assert "TENSORGATE_REQUIRE_GPU=1 but" in required.stdout + required.stderr
    plain = run_gpu_tests(require=False)
    assert plain.returncode == 0 and "skipped" in plain.stdout, "without it, the same run skips cleanly"
