"""Trace settings (Triton's trace extension): what a client may set, how a request names the changes
(REST JSON or gRPC's lists of strings), and how a global or a model's setting follows from them, the way
Triton's TraceManager derives it.

- trace_level: OFF, or TIMESTAMPS and/or TENSORS; trace_rate: one request in `rate` is traced; trace_count:
  traces still to take (-1: no limit); log_frequency: traces per file written (0: all at shutdown);
  trace_file: set with --trace-config only (as in Triton, the protocol may not change it).
- Each field of a setting is "specified" or follows its fallback: the global setting falls back to the
  --trace-config values, a model's to the global setting (and follows it when that changes). A change to
  null (REST) or to no value (gRPC) clears the field: it follows its fallback again. A model whose fields
  all follow the global setting has no setting of its own.

A `TraceSetting` is a plain frozen dataclass: it can be sent between processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.trace import LEVELS

TRITON, OPENTELEMETRY = "triton", "opentelemetry"
FIELDS = ("level", "rate", "count", "log_frequency", "file")
NAMES = {
    "level": "trace_level",
    "rate": "trace_rate",
    "count": "trace_count",
    "log_frequency": "log_frequency",
}
UINT32_MAX, INT32_MAX = (1 << 32) - 1, (1 << 31) - 1
CLEAR = "clear"  # a change that clears a field (marks it unspecified)


@dataclass(frozen=True)
class TraceSetting:
    level: tuple[str, ...] = ()  # (): OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = TRITON
    specified: frozenset[str] = frozenset()  # the fields set for this setting, not followed from elsewhere

    def invalid_reason(self) -> str:
        """Why no request can be sampled with it ("" when one can), in Triton's words."""
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode == TRITON and not self.file:
            return "trace file name is not given"
        return ""

    def answer(self, count: int) -> dict[str, Any]:
        """The setting as the trace setting endpoints answer it (`count`: the traces still to take)."""
        doc: dict[str, Any] = {
            "trace_level": list(self.level) or ["OFF"],
            "trace_rate": str(self.rate),
            "trace_count": str(count),
        }
        if self.mode == TRITON:
            doc["log_frequency"] = str(self.log_frequency)
            doc["trace_file"] = self.file
        doc["trace_mode"] = self.mode
        return doc


def derive(current: TraceSetting | None, fallback: TraceSetting, changes: dict[str, Any]) -> TraceSetting:
    """The setting after `changes` (field -> value, or CLEAR), as Triton's UpdateTraceSettingInternal
    derives it: a field changed or specified before keeps its value, any other follows `fallback`.
    `current.count` and `fallback.count` are the traces they have left, as Triton carries them over."""
    values: dict[str, Any] = {}
    specified = set()
    for name in FIELDS:
        change = changes.get(name)
        if change == CLEAR:
            keep = False
        else:
            keep = change is not None or (current is not None and name in current.specified)
        if keep:
            specified.add(name)
            values[name] = change if change is not None else getattr(current, name)
        else:
            values[name] = getattr(fallback, name)
    return TraceSetting(**values, mode=fallback.mode, specified=frozenset(specified))


# ------------------------------------------------------------------------------- what clients send


def changes_from_json(doc: dict[str, Any]) -> dict[str, Any]:
    """A REST trace setting request -> field changes. Values are strings (numbers are taken too), the
    level a list of strings; null clears."""
    if "trace_file" in doc:
        raise _file_is_fixed()
    changes: dict[str, Any] = {}
    for name, key in NAMES.items():
        if key not in doc:
            continue
        value = doc[key]
        if value is None:
            changes[name] = CLEAR
        elif name == "level":
            if not isinstance(value, list):
                raise invalid(f"'trace_level' must be a list of strings, got {value!r}")
            changes[name] = _level(value)
        else:
            if type(value) is int:
                value = str(value)
            if not isinstance(value, str):
                raise invalid(f"'{key}' must be a string, got {value!r}")
            changes[name] = _number(name, value)
    return changes


def changes_from_grpc(settings: dict[str, list[str]]) -> dict[str, Any]:
    """A gRPC TraceSettingRequest's settings -> field changes. No value clears."""
    if "trace_file" in settings:
        raise _file_is_fixed()
    changes: dict[str, Any] = {}
    for name, key in NAMES.items():
        if key not in settings:
            continue
        values = settings[key]
        if not values:
            changes[name] = CLEAR
        elif name == "level":
            changes[name] = _level(values)
        elif len(values) != 1:
            raise invalid(f"expect only 1 value for '{key}'")
        else:
            changes[name] = _number(name, values[0])
    return changes


def _file_is_fixed() -> InferError:
    return InferError(
        ErrorKind.UNIMPLEMENTED, "trace file location can not be updated through network protocol"
    )


def _level(values: list[Any]) -> tuple[str, ...]:
    for value in values:
        if value not in (*LEVELS, "OFF"):
            raise invalid(f"unknown trace level {value!r}: expect OFF, TIMESTAMPS or TENSORS")
    if "OFF" in values:
        if len(values) != 1:
            raise invalid("Expect only one trace level 'OFF' is specified")
        return ()
    return tuple(level for level in LEVELS if level in values)


def _number(name: str, text: str) -> int:
    key = NAMES[name]
    low, high = (-1, INT32_MAX) if name == "count" else (0, UINT32_MAX)
    stripped = text.strip()
    if not stripped.lstrip("-").isdigit() or not stripped.isascii():
        raise invalid(f"Unable to parse '{key}', got: {text}")
    value = int(stripped)
    if not low <= value <= high:
        if name == "count" and value < low:
            raise invalid(f"Unable to parse '{key}'. Expecting value >= {low}, got: {text}")
        raise invalid(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}")
    return value


def with_count(setting: TraceSetting, count: int) -> TraceSetting:
    return dataclasses.replace(setting, count=count)
