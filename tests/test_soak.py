"""A short soak (bench/soak.py) in the suite: valid traffic on every protocol beside hostile traffic,
reloads and a changing repository, for a quarter of a minute; nothing may be lost and nothing may leak.
The 10-minute run's report is in bench/results/."""

import os
import re
import subprocess
import sys

from bench.soak import VALID

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_short_soak_loses_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "0.25", "--rate", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    report = done.stdout
    assert done.returncode == 0, report[-4000:] + done.stderr[-2000:]
    assert "Verdict: nothing lost." in report
    assert ", 0 failed." in report
    # The positive control: valid requests were sent, and answered, on every protocol.
    rows = dict(re.findall(r"^\| ([\w-]+) \| ([\d,]+) \| 0 \|", report, re.MULTILINE))
    sent = {protocol: int(rows.get(protocol, "0").replace(",", "")) for protocol in VALID}
    assert all(count > 0 for count in sent.values()), (sent, report)
    hostile = re.search(r"and ([\d,]+) hostile acts", report)
    assert hostile and int(hostile.group(1).replace(",", "")) > 0, report
