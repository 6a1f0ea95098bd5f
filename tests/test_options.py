"""`--workers`: a count, or auto (the CPUs a container may use: its cgroup's CPU limit and its affinity)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tensorgate.server.options import build_parser
from tensorgate.server.options_workers import available_cpus

SERVE = ["--model-repository", "."]


def test_exit_timeout_secs_is_tritons_name_for_the_graceful_timeout() -> None:
    assert build_parser().parse_args(SERVE).graceful_timeout == 30.0
    assert build_parser().parse_args([*SERVE, "--exit-timeout-secs", "7"]).graceful_timeout == 7.0


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1)],
)
def test_auto_follows_the_cgroup_v2_limit(tmp_path: Path, cpu_max: str, expected: int | None) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path) == (affinity if expected is None else min(expected, affinity))


def test_auto_follows_the_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(tmp_path) == min(math.ceil(2.5), len(os.sched_getaffinity(0)))


def test_without_a_limit_auto_is_the_affinity(tmp_path: Path) -> None:
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("given", "expected"), [([], 1), (["--workers", "3"], 3)])
def test_workers_flag(given: list[str], expected: int) -> None:
    assert build_parser().parse_args([*SERVE, *given]).workers == expected


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_bad_workers_are_refused(bad: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*SERVE, "--workers", bad])
    assert "--workers" in capsys.readouterr().err
