"""python -m fuzz: every fuzz target under atheris for a while, one after the other.

    python -m fuzz [--seconds 60] [--only model_infer hpack ...] [--keep-corpus] [--runs N] [--report F]

Each target starts from its seeds (fuzz/corpus/<target>/, committed and minimised) and a fresh working
corpus of what it finds; libFuzzer stops a run at a per-input time limit (5 s), at 2 GiB of RSS, or at
the first finding, whose input it writes to fuzz/crashes/ (a finding becomes a named regression test
in tests/test_fuzz.py before it is fixed). The table at the end gives, per target, the inputs run (as
the target counted them, fuzz/one.py), how many it accepted, the coverage reached and what was found;
`--report F` writes it to F as JSON too. `--runs N` runs N inputs from a fixed seed instead of for a
time: the same inputs on every machine, what `make test` runs so that CI does not fail at random on what
a longer search would find (that is `make fuzz`'s work); a run whose target did not see N inputs fails.
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

from fuzz.targets import TARGETS, corpus_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASHES = os.path.join(ROOT, "fuzz", "crashes")
_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+)")
_RUNS = re.compile(r"Done (\d+) runs in (\d+) second")


def run(name: str, seconds: int, keep: bool, runs: int = 0) -> dict:
    os.makedirs(CRASHES, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as work,
        tempfile.NamedTemporaryFile(prefix=f"fuzz-{name}-counts-") as counts,
    ):
        argv = [
            sys.executable, "-m", "fuzz.one", name,
            *([f"-runs={runs}", "-seed=1"] if runs else [f"-max_total_time={seconds}"]),
            "-timeout=5", "-rss_limit_mb=2048", "-max_len=65536",
            f"-artifact_prefix={CRASHES}/{name}-", "-print_final_stats=1",
            work, corpus_dir(name),
        ]  # fmt: skip
        started = time.monotonic()
        env = {**os.environ, "TENSORGATE_FUZZ_COUNTS": counts.name}
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 120)
        took = time.monotonic() - started
        inputs, accepted = struct.unpack("<QQ", counts.read(16).ljust(16, b"\0"))
        if keep:
            for entry in os.listdir(work):
                os.replace(os.path.join(work, entry), os.path.join(corpus_dir(name), entry))
    out = done.stdout + done.stderr
    finished, done_runs = _DONE.search(out), _RUNS.search(out)
    ran = int(done_runs.group(1)) if done_runs else (int(finished.group(1)) if finished else 0)
    found = "" if done.returncode == 0 else out[-1500:]
    if not found and runs and (ran, inputs) != (runs, runs):
        found = f"asked for {runs:,} inputs: libFuzzer ran {ran:,}, the target saw {inputs:,}"
    return {
        "target": name,
        "seconds": round(took, 1),
        "runs": ran,  # as libFuzzer counted them
        "inputs": inputs,  # as the target counted them
        "accepted": accepted,
        "coverage": int(finished.group(2)) if finished else 0,
        "found": found,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--only", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--keep-corpus", action="store_true", help="add what the runs found to the seeds")
    parser.add_argument(
        "--runs",
        type=int,
        default=0,
        help="this many inputs from a fixed seed instead (repeatable: make test)",
    )
    parser.add_argument("--report", metavar="FILE", help="the results as JSON, one object per target")
    args = parser.parse_args(argv)
    results = []
    for name in args.only:
        result = run(name, args.seconds, args.keep_corpus, args.runs)
        results.append(result)
        status = "FOUND SOMETHING" if result["found"] else "nothing found"
        inputs, accepted = result["inputs"], result["accepted"]
        print(f"{name}: {inputs:,} inputs ({accepted:,} accepted) in {result['seconds']} s, "
              f"cov {result['coverage']}: {status}")  # fmt: skip
        if result["found"]:
            print(result["found"])
    total = sum(r["seconds"] for r in results)
    print(f"total: {total:.0f} s, {sum(r['inputs'] for r in results):,} inputs, "
          f"{sum(bool(r['found']) for r in results)} target(s) with findings")  # fmt: skip
    if args.report:
        with open(args.report, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r["found"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
