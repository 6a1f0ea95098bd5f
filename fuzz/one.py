"""One atheris (libFuzzer) run of one target: `python -m fuzz.one NAME [libFuzzer arguments]`.

The project's modules are imported under atheris' instrumentation, so the fuzzer is guided by the
coverage of our parsers. JSON targets get a structure-aware mutator beside libFuzzer's byte mutations:
random bytes rarely parse as JSON (orjson, in C, is not instrumented), so half the mutations change a
parsed document instead (a value swapped for another type or an extreme, a key dropped or renamed, a
level of nesting added) and keep it valid JSON. A finding is an exception other than the target's
expected errors (libFuzzer saves the input as a crash artifact and exits non-zero), a timeout or an
out-of-memory.

With TENSORGATE_FUZZ_COUNTS naming a file, the inputs the target ran and how many it accepted (parsed)
are kept current in it, two little-endian 64-bit counts (libFuzzer ends the process with exit(), past
Python's atexit, so they are written as they change): `python -m fuzz` reports them.
"""

import json
import mmap
import os
import random
import struct
import sys

import atheris

with atheris.instrument_imports(include=["tensorgate", "fuzz"]):
    from fuzz.targets import JSON_TARGETS, TARGETS, run_one

EXTREMES = [None, True, False, 0, -1, 1 << 63, -(1 << 64), 1e308, -0.0, "", "NaN", "x" * 300, [], {}, [[[]]]]


def mutate_json(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return atheris.Mutate(data, max_size)
    nodes = []

    def walk(node, parent, key):
        nodes.append((node, parent, key))
        if isinstance(node, dict):
            for k, v in list(node.items()):
                walk(v, node, k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, node, i)

    walk(doc, None, None)
    node, parent, key = rng.choice(nodes)
    choice = rng.randrange(5)
    if parent is None:
        doc = [doc] if choice == 0 else doc
    elif choice == 0:
        parent[key] = rng.choice(EXTREMES)
    elif choice == 1 and isinstance(parent, dict):
        del parent[key]
    elif choice == 2 and isinstance(parent, dict):
        parent[key + rng.choice(["_", "s", ""])] = parent.pop(key)
    elif choice == 3:
        parent[key] = [node]
    elif isinstance(node, list) and node:
        node.append(rng.choice(node))
    out = json.dumps(doc, allow_nan=True).encode()
    return out[:max_size]


COUNTS = "TENSORGATE_FUZZ_COUNTS"


class Counts:
    """The inputs run and accepted, kept current in the file TENSORGATE_FUZZ_COUNTS names, if any."""

    def __init__(self, path: str | None) -> None:
        self.inputs = self.accepted = 0
        self.view: mmap.mmap | None = None
        if path:
            with open(path, "r+b") as f:
                f.truncate(16)
                self.view = mmap.mmap(f.fileno(), 16)

    def add(self, inputs: int, accepted: int) -> None:
        self.inputs += inputs
        self.accepted += accepted
        if self.view is not None:
            struct.pack_into("<QQ", self.view, 0, self.inputs, self.accepted)


def main() -> None:
    name = sys.argv[1]
    if name not in TARGETS:
        raise SystemExit(f"unknown target {name!r} (targets: {', '.join(TARGETS)})")
    mutator = mutate_json if name in JSON_TARGETS else None
    counts = Counts(os.environ.get(COUNTS))

    def one(data: bytes) -> None:
        counts.add(1, 0)  # before: an input that ends the run counts
        if run_one(name, data):
            counts.add(0, 1)

    atheris.Setup([sys.argv[0], *sys.argv[2:]], one, custom_mutator=mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
