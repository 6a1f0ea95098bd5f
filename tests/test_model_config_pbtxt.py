"""Triton's protobuf text format (config.pbtxt) as server/model_config.py's parser reads it: syntax in
its spellings, maps, errors naming the line, and properties over generated text."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.server.config_error import ConfigError
from tensorgate.server.pbtxt import parse_pbtxt


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dims: 1 dims: 2\ndims: [3, 4]", {"dims": [1, 2, 3, 4]}),
        ("dims: 7", {"dims": [7]}),  # repeated in the proto: a list even when written once
        ("dims: []", {"dims": []}),
        ("version_policy: { all: {} }", {"version_policy": {"all": {}}}),
        ("version_policy { all { } }", {"version_policy": {"all": {}}}),
        ("a: 1; b: 2, c: 3", {"a": 1, "b": 2, "c": 3}),
        ("a: -3 b: 0x1F c: -0x10", {"a": -3, "b": 31, "c": -16}),
        ("a: 1.5 b: -2e3 c: .5 d: 2.5f", {"a": 1.5, "b": -2000.0, "c": 0.5, "d": 2.5}),
        ("a: true b: True c: false d: False", {"a": True, "b": True, "c": False, "d": False}),
        ("kind: KIND_GPU", {"kind": "KIND_GPU"}),
        ("s: 'single \"quoted\"'", {"s": 'single "quoted"'}),
        (r's: "tab\there\nline \\ \' \"q\" \x41\101 \u00e9"', {"s": 'tab\there\nline \\ \' "q" AA é'}),
        ('s: "con" \'cat\'\n  "enated"', {"s": "concatenated"}),
        ('s: "# not a comment" # a comment', {"s": "# not a comment"}),
        ("unknown: 1 unknown: 2", {"unknown": [1, 2]}),  # not repeated in the proto, but written twice
        ("unknown: [1]", {"unknown": [1]}),
        ("m < a: 1 >", {"m": {"a": 1}}),
    ],
)
def test_parse_pbtxt_syntax(text, expected):
    assert parse_pbtxt(text) == expected


def test_parse_pbtxt_maps():
    text = """
    dynamic_batching {
      priority_levels: 2
      priority_queue_policy { key: 1 value { timeout_action: DELAY } }
      priority_queue_policy { key: 2 value { max_queue_size: 4 } }
    }
    ensemble_scheduling { step [
      { model_name: "pre" model_version: -1 input_map { key: "RAW" value: "IMAGE" }
        output_map [{ key: "OUT" value: "PIXELS" }, { key: "SIZE" value: "HW" }] }
    ] }
    optimization { cuda { graph_spec { batch_size: 4 input { key: "X" value { dim: [16] } } } } }
    metric_tags { key: "team" value: "vision" }
    parameters { key: "empty" }
    """
    assert parse_pbtxt(text) == {
        "dynamic_batching": {
            "priority_levels": 2,
            "priority_queue_policy": {"1": {"timeout_action": "DELAY"}, "2": {"max_queue_size": 4}},
        },
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "pre",
                    "model_version": -1,
                    "input_map": {"RAW": "IMAGE"},
                    "output_map": {"OUT": "PIXELS", "SIZE": "HW"},
                }
            ]
        },
        "optimization": {"cuda": {"graph_spec": [{"batch_size": 4, "input": {"X": {"dim": [16]}}}]}},
        "metric_tags": {"team": "vision"},
        "parameters": {"empty": {}},
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: 'simple'\nmax_batch_size 8", "line 2: expected ':' or '{' after 'max_batch_size'"),
        ("input {\n  name: 'x'\n", "line 2: '}' missing at the end of the file"),
        ("a: 1\n}", "line 2: expected a field name, got '}'"),
        ('\n\nname: "simple', "line 3: unterminated string"),
        ("a: 1\nb: @", "line 2: unexpected character '@'"),
        ("a:\n\n", "line 1: expected a value"),
        ("a: }", "line 1: expected a value, got '}'"),
        ("a: 1\nb: 1.2.3", "line 2: invalid value '1.2.3'"),
        ("a\n: [1 2]", "line 2: expected ',' or ']' in the list of 'a'"),
        ("a: 'x\\qy'", "line 1: invalid escape '\\q'"),
        ("a: '\\xff'", "line 1: string is not valid UTF-8"),
        ("\nparameters { key: 'k' nope: 1 }", "line 2: 'parameters' entries must be { key: ... value: ... }"),
    ],
)
def test_parse_pbtxt_syntax_errors_name_the_line(text, message):
    with pytest.raises(ConfigError) as info:
        parse_pbtxt(text)
    assert str(info.value) == message


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_any_string_survives_quoting(s):
    assert parse_pbtxt(f"s: {json.dumps(s, ensure_ascii=False)}") == {"s": s}


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1)))
def test_repeated_ints_parse_the_same_in_every_spelling(values):
    as_list = f"dims: [{', '.join(map(str, values))}]"
    one_by_one = " ".join(f"dims: {v}" for v in values)
    as_hex = f"dims: [{', '.join(hex(v) for v in values)}]"
    assert parse_pbtxt(as_list)["dims"] == parse_pbtxt(as_hex)["dims"] == values
    assert parse_pbtxt(one_by_one).get("dims", []) == values
