"""Reads Go composite literals, enough of them to take the scenario tables out of a Go test file as data.

tests/test_deploy_kserve.py checks its reading of KServe's admission rules against KServe's own unit
tests (deploy/kserve/crds/webhook/servingruntime_webhook_test.go, vendored unmodified). Go cannot run
here, so the tables are read: `scenarios := map[string]struct{...}{"name": {field: value, ...}, ...}`,
whose values are composite literals (`&T{Key: v}`, `[]T{{...}, ...}`), strings, numbers, `true`/`false`/
`nil`, calls (`proto.String("1")`, `gomega.Equal(fmt.Errorf(Format, "x"))`) and named constants.

A struct literal becomes a dict under the field's JSON name (Go's name with its first letter lowered;
`ObjectMeta` is `metadata`, an embedded `ServingRuntimePodSpec` is merged), a slice a list. Calls and
constants are resolved by the `calls` and `constants` given; an unknown constant stays its qualified
name (distinct constants stay distinct, which is all an equality test needs); an unknown call raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|`[^`]*`)
  | (?P<number>-?\d+)
  | (?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)
  | (?P<punct>:=|[^\s\w"`])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
FIELD_NAMES = {"ObjectMeta": "metadata"}
EMBEDDED = {"ServingRuntimePodSpec"}  # embedded structs: their fields are the outer object's


def tokens(source: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise ValueError(f"cannot read Go source at {source[pos : pos + 40]!r}")
        pos = match.end()
        if match.lastgroup != "space":
            out.append((match.lastgroup, match.group()))
    return out


def _string(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], text[1:-1])


def _json_name(field: str) -> str:
    return FIELD_NAMES.get(field, field[:1].lower() + field[1:])


class Reader:
    def __init__(
        self,
        toks: list[tuple[str, str]],
        calls: dict[str, Callable[..., Any]],
        constants: dict[str, Any],
    ) -> None:
        self.toks, self.pos, self.calls, self.constants = toks, 0, calls, constants

    def peek(self, ahead: int = 0) -> tuple[str, str]:
        return self.toks[self.pos + ahead] if self.pos + ahead < len(self.toks) else ("end", "")

    def take(self, text: str | None = None) -> str:
        kind, value = self.peek()
        if text is not None and value != text:
            raise ValueError(f"expected {text!r}, found {value!r} (token {self.pos})")
        self.pos += 1
        return value

    def skip_braces(self) -> None:
        """From a `{` to just past its matching `}`."""
        depth = 0
        while True:
            value = self.take()
            depth += {"{": 1, "}": -1}.get(value, 0)
            if depth == 0:
                return

    def value(self) -> Any:
        kind, text = self.peek()
        if text in ("&", "*"):
            self.take()
            return self.value()
        if text == "[":  # []T{...}
            self.take("[")
            self.take("]")
            self.take()  # the element type
            return self.composite(as_list=True)
        if text == "{":
            return self.composite()
        if kind == "string":
            self.take()
            return _string(text)
        if kind == "number":
            self.take()
            return int(text)
        if kind == "name":
            self.take()
            if self.peek()[1] == "{":
                return self.composite()
            if self.peek()[1] == "(":
                return self.call(text)
            return {"true": True, "false": False, "nil": None}.get(text, self.constants.get(text, text))
        raise ValueError(f"unexpected {text!r} (token {self.pos})")

    def call(self, name: str) -> Any:
        self.take("(")
        args = []
        while self.peek()[1] != ")":
            args.append(self.value())
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        if name not in self.calls:
            raise ValueError(f"no meaning given to the call {name}()")
        return self.calls[name](*args)

    def composite(self, as_list: bool = False) -> Any:
        """`{...}`: a dict of JSON field names when its elements are keyed, else a list."""
        self.take("{")
        keyed: dict[str, Any] = {}
        items: list[Any] = []
        while self.peek()[1] != "}":
            if self.peek()[0] in ("name", "string") and self.peek(1)[1] == ":" and not as_list:
                key = self.take()
                self.take(":")
                value = self.value()
                if key in EMBEDDED and isinstance(value, dict):
                    keyed.update(value)
                else:
                    keyed[_string(key) if key.startswith(('"', "`")) else _json_name(key)] = value
            else:
                items.append(self.value())
            if self.peek()[1] == ",":
                self.take()
        self.take("}")
        return items if as_list or (items and not keyed) else keyed


def scenario_table(
    source: str,
    test: str,
    calls: dict[str, Callable[..., Any]],
    constants: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """The `scenarios := map[string]struct{...}{...}` table of Go test function `test`, by scenario name;
    each scenario a dict of its fields (Go names with the first letter lowered)."""
    start = source.index(f"func {test}(")
    reader = Reader(tokens(source[start:]), calls, constants)
    while not (reader.peek()[1] == "scenarios" and reader.peek(1)[1] == ":="):
        reader.take()
    for text in ("scenarios", ":=", "map", "[", "string", "]", "struct"):
        reader.take(text)
    reader.skip_braces()  # the struct type's fields
    table = reader.composite()
    assert isinstance(table, dict), f"{test}: the scenarios are not a map literal"
    return table


def string_constants(source: str) -> dict[str, str]:
    """`Name = "text"` constants of a Go file (its const blocks), e.g. error message formats."""
    return {
        name: _string(text)
        for name, text in re.findall(r'^\s*([A-Z]\w*)\s*=\s*("(?:[^"\\\n]|\\.)*")\s*$', source, re.MULTILINE)
    }
