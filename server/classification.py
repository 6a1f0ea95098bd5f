"""Triton's classification extension: an output requested with `classification: N` (REST
`"parameters": {"classification": N}`, gRPC `int64_param`; tritonclient's `class_count`) is answered,
per batch row, as its N highest values: a BYTES tensor of "<value>:<index>[:<label>]" strings, shaped
[rows, min(N, row elements)] for a batching model, else [min(N, elements)].

As Triton writes them (server src/classification.cc): floats with C's "%f" ("0.812500:3:cat"), integers
in decimal; ties in index order; the label is line <index> of the output's `label_filename` (a file in
the model's folder, one label a line), left out when the file has no such line or it is empty. An
ensemble output without a label file of its own takes the labels of the step output that produces it.

Engine side: the model version applies it to its answer (server/model.py), so every protocol, binary
data, shared memory and ensembles get it alike; the codecs only read the parameter.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tensorgate.codec.errors import invalid
from tensorgate.codec.tensor import Tensor

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Host

MAX_ELEMENTS = 1_000_000  # Triton's bound on a classified tensor (CPU and memory)
_KINDS = "iuf"  # integers and floats; BOOL, BYTES and BF16 have no order Triton classifies by

Labels = dict[str, list[str]]  # output name -> its labels, by index


def read_labels(model_dir: Path, config: dict) -> Labels:
    """The labels of each output that names a `label_filename`; raises ValueError naming the output when
    the file is outside the model folder or cannot be read (the load then fails, as in Triton)."""
    labels: Labels = {}
    root = model_dir.resolve()
    for entry in config.get("output", ()):
        filename = entry.get("label_filename")
        if not filename:
            continue
        path = (root / filename).resolve() if isinstance(filename, str) else root
        if not path.is_relative_to(root) or path == root:
            raise ValueError(
                f"label file path '{filename}' for output '{entry['name']}' in model "
                f"'{config['name']}' is outside model directory"
            )
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            name = entry["name"]
            raise ValueError(f"output '{name}': cannot read label_filename '{filename}': {e}") from None
        lines = text.split("\n")
        if lines[-1] == "":  # a final newline ends the last line, as getline reads it
            lines.pop()
        labels[entry["name"]] = lines
    return labels


def ensemble_labels(config: dict, labels: Labels, host: Host | None) -> Labels:
    """An ensemble's labels: its own, and for each output without them, those of the step model's output
    mapped to it (Triton's model_lifecycle.cc does the same). Step models that cannot be resolved are
    passed over: the ensemble's own load says what is wrong with them."""
    if host is None or config.get("platform") != "ensemble":
        return labels
    missing = {e["name"] for e in config.get("output", ()) if not (labels.get(e["name"]) or [""])[0]}
    for step in (config.get("ensemble_scheduling") or {}).get("step") or ():
        for model_output, tensor in (step.get("output_map") or {}).items():
            if tensor not in missing:
                continue
            version = step.get("model_version", -1)
            version = "" if version in (-1, None) else str(version)
            try:
                model = host.resolve(step.get("model_name", ""), version)
            except Exception:
                continue
            found = model.labels.get(model_output)
            if found:
                labels = {**labels, tensor: found}
    return labels


def classify(tensor: Tensor, count: int, labels: list[str] | None, batched: bool) -> Tensor:
    """`tensor` answered as its top `count` classes per batch row (`batched`: its first dim is the batch)."""
    data = np.asarray(tensor.data)
    if data.dtype.kind not in _KINDS:
        raise invalid(f"class result not available for output due to unsupported type '{tensor.datatype}'")
    rows = data.shape[0] if batched and data.ndim > 0 else 0
    per_row = data.reshape(max(rows, 1), -1) if data.size else data.reshape(max(rows, 1), 0)
    width = per_row.shape[1]
    if width > MAX_ELEMENTS:
        raise invalid("classification output tensor too large")
    kept = min(count, width)
    integral = data.dtype.kind != "f"
    out = np.empty((per_row.shape[0], kept), dtype=object)
    for row, values in enumerate(per_row):
        # Highest first, ties in index order: a stable ascending sort of the reversed row, reversed.
        top = (width - 1 - np.argsort(values[::-1], kind="stable")[::-1])[:kept]
        for column, index in enumerate(top.tolist()):
            value = values[index]
            text = f"{int(value)}:{index}" if integral else f"{float(value):f}:{index}"
            label = labels[index] if labels is not None and index < len(labels) else ""
            out[row, column] = (f"{text}:{label}" if label else text).encode()
    shape = (rows, kept) if batched and data.ndim > 0 else (kept,)
    return Tensor(tensor.name, "BYTES", shape, out.reshape(shape))
