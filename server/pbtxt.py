"""Read Triton's protobuf text format (a config.pbtxt) into a plain dict.

The dict has the shape protobuf's JSON mapping gives model_config.proto: proto field names, enums as their
names, repeated fields as lists and map fields as objects with string keys. The reader knows the schema
only as far as the text format needs it: which fields are repeated and which are maps. What the values
mean, and whether they are valid, is server/model_config.py's.
"""

import re
from typing import Any, NamedTuple

from tensorgate.server.config_error import ConfigError

# Field names model_config.proto declares `repeated` (in any message of ModelConfig): a list even when
# a config.pbtxt writes them once.
_REPEATED = frozenset(
    "input output batch_input batch_output instance_group model_warmup dims shape versions gpus "  # noqa: SIM905
    "secondary_devices profile resources target_name source_input preferred_batch_size step "
    "control_input control int32_false_true fp32_false_true bool_false_true state initial_state "
    "graph_spec dim gpu_execution_accelerator cpu_execution_accelerator op_library_filename agents "
    "metric_control buckets".split()
)
# map<K, V> fields: repeated `{ key: ... value: ... }` entries in pbtxt, objects with string keys in JSON.
MAP_FIELDS = frozenset(
    "parameters priority_queue_policy input_map output_map cc_model_filenames metric_tags inputs".split()  # noqa: SIM905
)
_MESSAGE_MAPS = ("priority_queue_policy", "inputs", "input")  # maps whose values are messages


class _Token(NamedTuple):
    kind: str  # "string", "word" or "punct"
    text: str
    line: int


_TOKEN_RE = re.compile(
    r"""(?P<space>[ \t\r\f\v]+) | (?P<newline>\n) | (?P<comment>\#[^\n]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*" | '(?:[^'\\\n]|\\.)*')
    | (?P<word>[A-Za-z0-9_.+-]+) | (?P<punct>[{}\[\]<>:,;])""",
    re.VERBOSE,
)
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT_RE = re.compile(r"-?\d+")
_HEX_RE = re.compile(r"-?0[xX][0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fF]?")
_ESCAPE_RE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-3]?[0-7]{1,2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.S)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"} | {
    c: c for c in "\\'\"?"
}
_BOOLS = {"true": True, "True": True, "false": False, "False": False}


def _tokenize(text: str) -> list[_Token]:
    tokens, line, pos = [], 1, 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            what = "unterminated string" if text[pos] in "'\"" else f"unexpected character {text[pos]!r}"
            raise ConfigError(f"line {line}: {what}")
        if m.lastgroup == "newline":
            line += 1
        elif m.lastgroup in ("string", "word", "punct"):
            tokens.append(_Token(m.lastgroup, m.group(), line))
        pos = m.end()
    return tokens


def _unescape(body: str, line: int) -> bytes:
    """The bytes of a quoted string's body with its C escapes (\\n, \\x41, \\101, \\u00e9, ...) resolved."""
    out, pos = bytearray(), 0
    for m in _ESCAPE_RE.finditer(body):
        out += body[pos : m.start()].encode()
        esc, pos = m.group(1), m.end()
        if esc[0] in "xuU":
            try:  # no digits, or past the last code point: an invalid escape, not a crash
                value = int(esc[1:], 16)
                out += bytes([value]) if esc[0] == "x" else chr(value).encode(errors="surrogatepass")
            except (ValueError, OverflowError):
                raise ConfigError(f"line {line}: invalid escape '\\{esc}'") from None
        elif esc[0] in "01234567":
            out.append(int(esc, 8))
        elif esc not in _ESCAPES:
            raise ConfigError(f"line {line}: invalid escape '\\{esc}'")
        else:
            out += _ESCAPES[esc].encode()
    return bytes(out + body[pos:].encode())


def _field_kind(name: str, parent: str | None) -> str | None:
    # `input` is the repeated ModelInput at the top level but a map inside CUDA graph specs.
    if name in MAP_FIELDS or (name == "input" and parent in ("graph_spec", "graph_lower_bound")):
        return "map"
    return "repeated" if name in _REPEATED else None


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def at(self, *puncts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "punct" and tok.text in puncts

    def take(self, punct: str) -> bool:
        if self.at(punct):
            self.pos += 1
            return True
        return False

    def error(self, message: str, tok: _Token | None = None) -> ConfigError:
        tok = tok or self.peek() or self.tokens[-1]  # at the end of the file: its last line
        return ConfigError(f"line {tok.line}: {message}")

    def message(self, parent: str | None, close: str | None) -> dict:
        out: dict[str, Any] = {}
        while not (close and self.take(close)):
            tok = self.peek()
            if tok is None:
                if close:
                    raise self.error(f"'{close}' missing at the end of the file")
                return out
            if tok.kind != "word" or not _IDENT_RE.fullmatch(tok.text):
                raise self.error(f"expected a field name, got {tok.text!r}")
            self.pos += 1
            colon = self.take(":")
            if self.at("{", "<"):
                values, listed = [self.submessage(tok.text)], False
            elif self.at("["):
                values, listed = self.list(tok.text), True
            elif colon:
                values, listed = [self.scalar()], False
            else:
                raise self.error(f"expected ':' or '{{' after '{tok.text}'")
            self.store(out, tok, parent, values, listed)
            if not self.take(","):
                self.take(";")
        return out

    def submessage(self, name: str) -> dict:
        close = "}" if self.tokens[self.pos].text == "{" else ">"
        self.pos += 1
        return self.message(name, close)

    def list(self, name: str) -> list:
        self.pos += 1  # "["
        items: list = []
        while not self.take("]"):
            items.append(self.submessage(name) if self.at("{", "<") else self.scalar())
            if not self.take(",") and not self.at("]"):
                raise self.error(f"expected ',' or ']' in the list of '{name}'")
        return items

    def scalar(self) -> Any:
        tok = self.peek()
        if tok is None or tok.kind == "punct":
            raise self.error(f"expected a value, got {tok.text!r}" if tok else "expected a value")
        self.pos += 1
        if tok.kind == "string":
            data = _unescape(tok.text[1:-1], tok.line)
            while (more := self.peek()) is not None and more.kind == "string":  # "a" "b" is "ab"
                data += _unescape(more.text[1:-1], more.line)
                self.pos += 1
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise self.error("string is not valid UTF-8", tok) from None
        text = tok.text
        if text in _BOOLS:
            return _BOOLS[text]
        if _INT_RE.fullmatch(text) or _HEX_RE.fullmatch(text):
            return int(text, 16 if "x" in text.lower() else 10)
        if _FLOAT_RE.fullmatch(text):
            return float(text.rstrip("fF"))
        if _IDENT_RE.fullmatch(text):
            return text  # an enum name
        raise self.error(f"invalid value {text!r}", tok)

    def store(self, out: dict, tok: _Token, parent: str | None, values: list, listed: bool) -> None:
        name, kind = tok.text, _field_kind(tok.text, parent)
        if kind == "map":
            for entry in values:
                if not isinstance(entry, dict) or not set(entry) <= {"key", "value"}:
                    raise self.error(f"'{name}' entries must be {{ key: ... value: ... }}", tok)
                # An entry without a value holds the empty message, or "" in a map<string, string>.
                empty = {} if name in _MESSAGE_MAPS or (name, parent) == ("parameters", None) else ""
                # JSON keys are strings: priority_queue_policy's integer keys become "1", "2", ...
                out.setdefault(name, {})[str(entry.get("key", ""))] = entry.get("value", empty)
        elif kind == "repeated" or listed or name in out:
            if name in out and not isinstance(out[name], list):
                out[name] = [out[name]]  # a field the proto does not repeat, written twice
            out.setdefault(name, []).extend(values)
        else:
            out[name] = values[0]


def parse_pbtxt(text: str) -> dict:
    """Parse protobuf text format (a config.pbtxt) into a dict shaped like model_config.proto's JSON."""
    return _Parser(text).message(None, None)
