"""python -m fuzz: every fuzz target under atheris for a while, one after the other.

    python -m fuzz [--seconds 60] [--only model_infer hpack ...] [--keep-corpus] [--runs N]

Each target starts from its seeds (fuzz/corpus/<target>/, committed and minimised) and a fresh working
corpus of what it finds; libFuzzer stops a run at a per-input time limit (5 s), at 2 GiB of RSS, or at
the first finding, whose input it writes to fuzz/crashes/ (a finding becomes a named regression test
in tests/test_fuzz.py before it is fixed). The table at the end gives, per target, the inputs run, the
coverage reached and what was found. `--runs N` runs N inputs from a fixed seed instead of for a time:
the same inputs on every machine, what `make test` runs so that CI does not fail at random on what a
longer search would find (that is `make fuzz`'s work).
"""

import argparse
import os
import re
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
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as work:
        argv = [
            sys.executable, "-m", "fuzz.one", name,
            *([f"-runs={runs}", "-seed=1"] if runs else [f"-max_total_time={seconds}"]),
            "-timeout=5", "-rss_limit_mb=2048", "-max_len=65536",
            f"-artifact_prefix={CRASHES}/{name}-", "-print_final_stats=1",
            work, corpus_dir(name),
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
        took = time.monotonic() - started
        if keep:
            for entry in os.listdir(work):
                os.replace(os.path.join(work, entry), os.path.join(corpus_dir(name), entry))
    out = done.stdout + done.stderr
    finished, runs = _DONE.search(out), _RUNS.search(out)
    found = "" if done.returncode == 0 else out[-1500:]
    return {
        "target": name,
        "seconds": round(took, 1),
        "runs": int(runs.group(1)) if runs else (int(finished.group(1)) if finished else 0),
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
    args = parser.parse_args(argv)
    results = []
    for name in args.only:
        result = run(name, args.seconds, args.keep_corpus, args.runs)
        results.append(result)
        status = "FOUND SOMETHING" if result["found"] else "nothing found"
        print(
            f"{name}: {result['runs']:,} inputs in {result['seconds']} s, cov {result['coverage']}: {status}"
        )
        if result["found"]:
            print(result["found"])
    total = sum(r["seconds"] for r in results)
    print(f"total: {total:.0f} s, {sum(r['runs'] for r in results):,} inputs, "
          f"{sum(bool(r['found']) for r in results)} target(s) with findings")  # fmt: skip
    return 1 if any(r["found"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
