"""A small YAML emitter for grps metadata answers: nested dicts and lists of strings, numbers, booleans
and null, in block style. Strings that could read as anything else are double-quoted."""

import json
import math
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*(?: [A-Za-z0-9_./-]+)*")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}


def dump(value: Any) -> str:
    lines: list[str] = []
    _emit(value, 0, lines)
    return "\n".join(lines) + "\n"


def _emit(value: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict) and value:
        for key, item in value.items():
            if _is_block(item):
                lines.append(f"{pad}{scalar(str(key))}:")
                _emit(item, indent + 2, lines)
            else:
                lines.append(f"{pad}{scalar(str(key))}: {scalar(item)}")
    elif isinstance(value, list) and value:
        for item in value:
            if _is_block(item):
                start = len(lines)
                _emit(item, indent + 2, lines)
                lines[start] = f"{pad}- {lines[start][indent + 2 :]}"
            else:
                lines.append(f"{pad}- {scalar(item)}")
    else:
        lines.append(f"{pad}{scalar(value)}")


def _is_block(value: Any) -> bool:
    return isinstance(value, (dict, list)) and bool(value)


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
