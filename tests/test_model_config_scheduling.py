"""The config fields of ragged batching (allow_ragged_batch, batch_input) and of the rate limiter
(instance_group rate_limiter): parsed from config.pbtxt, validated with Triton's texts."""

import pytest

from tensorgate.server.config_error import ConfigError
from tensorgate.server.model_config import normalize_config
from tensorgate.server.pbtxt import parse_pbtxt

PBTXT = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32 source_input: "INPUT" }
]
instance_group [ {
  count: 2
  kind: KIND_CPU
  rate_limiter { resources [ { name: "R1" count: 2 }, { name: "R2" global: true count: 1 } ] priority: 3 }
} ]
"""


def test_pbtxt_fields() -> None:
    config = normalize_config(parse_pbtxt(PBTXT), "m")
    assert config["input"][0]["allow_ragged_batch"] is True
    assert config["batch_input"] == [
        {
            "kind": "BATCH_ACCUMULATED_ELEMENT_COUNT",
            "target_name": ["INDEX"],
            "data_type": "TYPE_INT32",
            "source_input": ["INPUT"],
        }
    ]
    assert config["instance_group"][0]["rate_limiter"] == {
        "resources": [
            {"name": "R1", "count": 2, "global": False},
            {"name": "R2", "count": 1, "global": True},
        ],
        "priority": 3,
    }


def test_one_resource_is_a_list_and_json_enums_may_be_numbers() -> None:
    text = PBTXT.replace('{ name: "R1" count: 2 }, { name: "R2" global: true count: 1 }', '{ name: "R1" }')
    text = text.replace("resources [ ", "resources ").replace(" ] priority", " priority")
    config = normalize_config(parse_pbtxt(text), "m")
    assert config["instance_group"][0]["rate_limiter"]["resources"] == [
        {"name": "R1", "count": 0, "global": False}
    ]
    raw = parse_pbtxt(PBTXT)
    raw["batch_input"][0]["kind"] = 2
    kind = normalize_config(raw, "m")["batch_input"][0]["kind"]
    assert kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"


def _batch_input(**fields) -> dict:
    return {
        "kind": "BATCH_ELEMENT_COUNT",
        "target_name": ["N"],
        "data_type": "TYPE_INT32",
        "source_input": ["INPUT"],
        **fields,
    }


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"batch_input": [_batch_input(kind="BATCH_EVERYTHING")]},
            "unknown batch input kind 'BATCH_EVERYTHING'",
        ),
        (
            {"batch_input": [_batch_input(source_input=["INPUT", "INPUT"])]},
            "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2",
        ),
        (
            {"batch_input": [_batch_input(data_type="TYPE_INT64")]},
            "batch input data type must be TYPE_INT32 or TYPE_FP32",
        ),
        ({"batch_input": [_batch_input(source_input=["NOPE"])]}, "unknown source input name 'NOPE'"),
        (
            {
                "input": [
                    {"name": "INPUT", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": "yes"}
                ]
            },
            "input 'INPUT' allow_ragged_batch must be true or false, got 'yes'",
        ),
        (
            {"instance_group": [{"rate_limiter": {"resources": [{"name": "R", "count": -1}]}}]},
            "instance_group 'm_0' rate_limiter resource 'R' count must be an integer >= 0, got -1",
        ),
        (
            {"instance_group": [{"rate_limiter": {"resources": [{"count": 1}]}}]},
            "instance_group 'm_0' rate_limiter: a resource must specify 'name'",
        ),
        (
            {"instance_group": [{"rate_limiter": {"priority": -2}}]},
            "instance_group 'm_0' rate_limiter priority must be an integer >= 0, got -2",
        ),
    ],
)
def test_invalid(change: dict, message: str) -> None:
    raw = {**parse_pbtxt(PBTXT), **change}
    with pytest.raises(ConfigError) as info:
        normalize_config(raw, "m")
    assert str(info.value) == f"model 'm': {message}"
