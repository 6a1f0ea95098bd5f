"""A short soak (bench/soak.py) in the suite: valid traffic on every protocol beside hostile traffic,
reloads and a changing repository, for a quarter of a minute; nothing may be lost and nothing may leak.
The 10-minute run's report is in bench/results/."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_short_soak_loses_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "0.25", "--rate", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Verdict: nothing lost." in done.stdout
    assert ", 0 failed." in done.stdout
