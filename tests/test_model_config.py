"""Model configs: config.pbtxt / config.json in, Triton's model_config JSON out."""

import json
from pathlib import Path

import pytest

from tensorgate.server.backends import backend_from_files
from tensorgate.server.config_error import ConfigError
from tensorgate.server.model_config import check_complete, load_model_config, normalize_config
from tensorgate.server.pbtxt import parse_pbtxt

# Triton's own docs/examples/model_repository/simple/config.pbtxt.
SIMPLE_PBTXT = """
name: "simple"
platform: "tensorflow_graphdef"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""


def _tensor(name: str, data_type: str = "TYPE_INT32", dims: list | None = None, **extra) -> dict:
    return {"name": name, "data_type": data_type, "dims": dims or [16], **extra}


SIMPLE_NORMALIZED = {
    "name": "simple",
    "platform": "tensorflow_graphdef",
    "backend": "tensorflow",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 8,
    "input": [_tensor("INPUT0", optional=False), _tensor("INPUT1", optional=False)],
    "output": [_tensor("OUTPUT0"), _tensor("OUTPUT1")],
    "instance_group": [{"name": "simple", "kind": "KIND_CPU", "count": 1}],
    "parameters": {},
}

# The features a production config.pbtxt uses, in the mixed styles people write them.
DENSENET_PBTXT = """
# An image classifier served by onnxruntime.
backend: "onnxruntime"
max_batch_size: 8
version_policy: { specific { versions: [1, 3] } }
input {
  name: "data_0"
  data_type: TYPE_FP32
  format: FORMAT_NCHW
  dims: [ 3, 224, 224 ]
  reshape: { shape: [ 1, 3, 224, 224 ] }
}
output [{ name: "fc6_1", data_type: TYPE_FP32, dims: [ 1000 ], label_filename: "densenet_labels.txt" }]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
parameters { key: "intra_op_thread_count" value { string_value: "4" } }
parameters: {
  key: "cudnn_conv_algo_search"  # several blocks build one map
  value: { string_value: "HEURISTIC" }
}
model_warmup [{
  name: "zeros" batch_size: 1
  inputs { key: "data_0" value { data_type: TYPE_FP32 dims: [3, 224, 224] zero_data: true } }
}]
"""

DENSENET_NORMALIZED = {
    "name": "densenet_onnx",
    "platform": "",
    "backend": "onnxruntime",
    "version_policy": {"specific": {"versions": [1, 3]}},
    "max_batch_size": 8,
    "input": [
        {
            "name": "data_0",
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NCHW",
            "dims": [3, 224, 224],
            "reshape": {"shape": [1, 3, 224, 224]},
            "optional": False,
        }
    ],
    "output": [_tensor("fc6_1", "TYPE_FP32", [1000], label_filename="densenet_labels.txt")],
    "instance_group": [{"name": "densenet_onnx_0", "kind": "KIND_GPU", "count": 2, "gpus": [0]}],
    "parameters": {
        "intra_op_thread_count": {"string_value": "4"},
        "cudnn_conv_algo_search": {"string_value": "HEURISTIC"},
    },
    "dynamic_batching": {
        "preferred_batch_size": [4, 8],
        "max_queue_delay_microseconds": 100,
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": 0,
            "allow_timeout_override": False,
            "max_queue_size": 0,
        },
        "priority_queue_policy": {},
    },
    "model_warmup": [
        {
            "name": "zeros",
            "batch_size": 1,
            "inputs": {"data_0": {"data_type": "TYPE_FP32", "dims": [3, 224, 224], "zero_data": True}},
        }
    ],
}


def test_triton_simple_example_normalizes_to_its_config_json():
    assert normalize_config(parse_pbtxt(SIMPLE_PBTXT), "simple") == SIMPLE_NORMALIZED


def test_a_config_using_every_common_section():
    assert normalize_config(parse_pbtxt(DENSENET_PBTXT), "densenet_onnx") == DENSENET_NORMALIZED


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory


def test_pbtxt_and_equivalent_json_load_the_same(tmp_path):
    from_pbtxt = load_model_config(_write(tmp_path / "a" / "densenet_onnx", "config.pbtxt", DENSENET_PBTXT))
    as_json = json.loads(json.dumps(DENSENET_NORMALIZED))
    del as_json["name"], as_json["platform"], as_json["instance_group"][0]["name"]
    as_json["input"][0]["dims"] = ["3", "224", "224"]  # protobuf's JSON writes int64 as strings
    as_json["version_policy"]["specific"]["versions"] = ["1", "3"]
    as_json["dynamic_batching"]["max_queue_delay_microseconds"] = "100"
    from_json = load_model_config(
        _write(tmp_path / "b" / "densenet_onnx", "config.json", json.dumps(as_json))
    )
    assert from_json == from_pbtxt == DENSENET_NORMALIZED


def test_config_pbtxt_wins_over_config_json(tmp_path):
    model = _write(tmp_path / "simple", "config.pbtxt", SIMPLE_PBTXT)
    (model / "config.json").write_text("not even json")
    assert load_model_config(model) == SIMPLE_NORMALIZED


# ---------------------------------------------------------------------------------------- normalize


def _base(**changes) -> dict:
    config = {
        "backend": "python",
        "max_batch_size": 4,
        "input": [_tensor("IN")],
        "output": [_tensor("OUT")],
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def test_backends_that_complete_configs_may_leave_out_inputs_and_outputs():
    """onnxruntime and python configs may leave them to the model (the graph, auto_complete_config);
    once the backend has had its turn they must be there (check_complete)."""
    for backend in ("python", "onnxruntime"):
        config = normalize_config(_base(backend=backend, input=None, output=None), "m")
        assert config["input"] == [] and config["output"] == []
        with pytest.raises(ConfigError, match="must specify at least one input"):
            check_complete(config)
    completed = check_complete({**config, "input": [_tensor("IN")], "output": [_tensor("OUT")]})
    assert completed["input"][0]["optional"] is False


def test_inputs_and_outputs_in_the_v2_metadata_form_are_read_as_model_config():
    """The repository extension's load example gives `inputs`/`outputs` with datatype and shape."""
    config = normalize_config(
        {
            "backend": "onnxruntime",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [2, -1]}],
        },
        "m",
    )
    assert config["input"] == [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1], "optional": False}]
    assert config["output"] == [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [2, -1]}]
    assert "inputs" not in config and "outputs" not in config
    x, y = ({"name": name, "datatype": "INT8", "shape": [-1, 3]} for name in "XY")
    batched = normalize_config(_base(input=None, output=None, max_batch_size=8, inputs=[x], outputs=[y]), "m")
    assert batched["input"][0]["dims"] == [3] and batched["output"][0]["dims"] == [3]
    with pytest.raises(ConfigError, match="input 'X' has unknown datatype 'FLOAT'"):
        normalize_config(_base(input=None, inputs=[{"name": "X", "datatype": "FLOAT", "shape": [1]}]), "m")


def test_defaults_filled():
    config = normalize_config(_base(), "m")
    assert config["name"] == "m"
    assert config["platform"] == ""
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"] == [{"name": "m", "kind": "KIND_CPU", "count": 1}]
    assert config["parameters"] == {}
    assert config["input"][0]["optional"] is False
    assert "optional" not in config["output"][0]
    assert normalize_config(_base(max_batch_size=None), "m")["max_batch_size"] == 0


def test_instance_group_fields_default_per_group():
    groups = [{"kind": "KIND_CPU"}, {"name": "gpus", "count": 3, "gpus": [0, 1]}]
    assert normalize_config(_base(instance_group=groups), "m")["instance_group"] == [
        {"name": "m_0", "kind": "KIND_CPU", "count": 1},
        {"name": "gpus", "kind": "KIND_AUTO", "count": 3, "gpus": [0, 1]},
    ]


@pytest.mark.parametrize(
    ("platform", "backend"),
    [
        ("pytorch_libtorch", "pytorch"),
        ("onnxruntime_onnx", "onnxruntime"),
        ("tensorflow_savedmodel", "tensorflow"),
        ("tensorflow_graphdef", "tensorflow"),
        ("tensorrt_plan", "tensorrt"),
        ("python", "python"),
    ],
)
def test_platform_names_its_backend(platform, backend):
    config = normalize_config(_base(backend=None, platform=platform), "m")
    assert (config["platform"], config["backend"]) == (platform, backend)


def test_given_backend_and_platform_are_kept():
    config = normalize_config(_base(platform="pytorch_libtorch", backend="custom"), "m")
    assert (config["platform"], config["backend"]) == ("pytorch_libtorch", "custom")


def test_ensemble_has_no_backend_and_no_instance_group():
    scheduling = {"step": [{"model_name": "a", "model_version": -1, "input_map": {"x": "IN"}}]}
    config = normalize_config(_base(backend=None, platform="ensemble", ensemble_scheduling=scheduling), "m")
    assert config["backend"] == ""
    assert "instance_group" not in config
    assert config["ensemble_scheduling"] == scheduling


def test_other_sections_and_unknown_fields_are_kept():
    optimization = {"graph": {"level": 1}, "input_pinned_memory": {"enable": True}}
    config = normalize_config(_base(optimization=optimization, runtime="model.so", future_field=[1]), "m")
    assert config["optimization"] == optimization
    assert (config["runtime"], config["future_field"]) == ("model.so", [1])


def test_reshape_rules_follow_triton():
    scalar = _tensor("IN", dims=[1], reshape={"shape": []})
    assert normalize_config(_base(input=[scalar]), "m")["input"][0]["reshape"] == {"shape": []}
    variable = _tensor("IN", dims=[2, 4, -1, 6], reshape={"shape": [8, -1, 1, 6]})
    assert normalize_config(_base(input=[variable]), "m")["input"][0]["dims"] == [2, 4, -1, 6]


def _batching(**fields) -> dict:
    return {"dynamic_batching": fields}


DEFAULT_QUEUE_POLICY = {
    "timeout_action": "REJECT",
    "default_timeout_microseconds": 0,
    "allow_timeout_override": False,
    "max_queue_size": 0,
}


def test_empty_dynamic_batching_gets_triton_defaults():
    assert normalize_config(_base(max_batch_size=16, dynamic_batching={}), "m")["dynamic_batching"] == {
        "preferred_batch_size": [16],  # Triton: an empty list becomes [max_batch_size]
        "max_queue_delay_microseconds": 0,
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "default_queue_policy": DEFAULT_QUEUE_POLICY,
        "priority_queue_policy": {},
    }


def test_dynamic_batching_without_batching_is_a_queue_of_single_requests():
    # Triton accepts dynamic_batching with max_batch_size 0: its queue policies still apply.
    config = normalize_config(_base(max_batch_size=0, dynamic_batching={}), "m")
    assert config["dynamic_batching"]["preferred_batch_size"] == []


def test_priority_queue_policies_from_pbtxt():
    text = """
    backend: "python"
    max_batch_size: 8
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 16 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
    dynamic_batching {
      preferred_batch_size: 4
      max_queue_delay_microseconds: 500
      priority_levels: 3
      default_priority_level: 2
      default_queue_policy { max_queue_size: 10 }
      priority_queue_policy {
        key: 1
        value { timeout_action: DELAY default_timeout_microseconds: 100 allow_timeout_override: 1 }
      }
      priority_queue_policy { key: 3 value: { } }
    }
    """
    batching = normalize_config(parse_pbtxt(text), "m")["dynamic_batching"]
    assert batching == {
        "preferred_batch_size": [4],
        "max_queue_delay_microseconds": 500,
        "preserve_ordering": False,
        "priority_levels": 3,
        "default_priority_level": 2,
        "default_queue_policy": {**DEFAULT_QUEUE_POLICY, "max_queue_size": 10},
        "priority_queue_policy": {
            "1": {
                "timeout_action": "DELAY",
                "default_timeout_microseconds": 100,
                "allow_timeout_override": True,
                "max_queue_size": 0,
            },
            "3": DEFAULT_QUEUE_POLICY,
        },
    }


def test_queue_policy_from_json_with_int64_strings_and_enum_numbers():
    raw = _base(
        dynamic_batching={
            "max_queue_delay_microseconds": "250",
            "default_queue_policy": {"timeout_action": 1, "default_timeout_microseconds": "9000000000"},
        }
    )
    batching = normalize_config(json.loads(json.dumps(raw)), "m")["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 250
    assert batching["default_queue_policy"]["timeout_action"] == "DELAY"
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 9_000_000_000


def test_preserve_ordering_allows_a_single_level_and_a_rejecting_timeout():
    batching = {"preserve_ordering": True, "default_queue_policy": {"default_timeout_microseconds": 5}}
    config = normalize_config(_base(dynamic_batching=batching), "m")
    assert config["dynamic_batching"]["preserve_ordering"] is True


def test_input_is_not_modified():
    raw = _base(dynamic_batching={"preferred_batch_size": ["2"]})
    before = json.dumps(raw)
    normalize_config(raw, "m")
    assert json.dumps(raw) == before


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "other"}, "configuration name 'other' does not match the model directory name"),
        (
            {"backend": None, "platform": "caffe2_netdef"},
            "unknown platform 'caffe2_netdef'; specify 'backend'",
        ),
        ({"max_batch_size": -1}, "max_batch_size must be an integer >= 0, got -1"),
        ({"max_batch_size": "eight"}, "max_batch_size must be an integer >= 0, got 'eight'"),
        ({"input": None, "backend": "pytorch"}, "must specify at least one input"),
        ({"output": [], "backend": "pytorch"}, "must specify at least one output"),
        ({"input": [{"data_type": "TYPE_FP32", "dims": [1]}]}, "input #0 must specify 'name'"),
        ({"input": [_tensor("INPUT0", "TYPE_FOO")]}, "input 'INPUT0' has unknown data_type 'TYPE_FOO'"),
        ({"output": [{"name": "OUT", "dims": [1]}]}, "output 'OUT' must specify 'data_type'"),
        ({"input": [_tensor("A"), _tensor("A")]}, "input 'A' is specified more than once"),
        ({"input": [{"name": "IN", "data_type": "TYPE_FP32"}]}, "input 'IN' must specify 'dims'"),
        (
            {"input": [_tensor("IN", dims=[4, 0])]},
            "input 'IN' dims must be a list of integers >= 1 or -1 (variable size), got [4, 0]",
        ),
        (
            {"output": [_tensor("OUT", dims=[-2])]},
            "output 'OUT' dims must be a list of integers >= 1 or -1 (variable size), got [-2]",
        ),
        (
            {"output": [_tensor("OUT", dims=[16], reshape={"shape": [4, 5]})]},
            "output 'OUT' reshape [4, 5] does not fit dims [16]",
        ),
        (
            {"max_batch_size": 0, "input": [_tensor("IN", dims=[1], reshape={"shape": []})]},
            "input 'IN' cannot have an empty reshape if max_batch_size is 0",
        ),
        ({"input": [_tensor("IN", optional="yes")]}, "input 'IN' optional must be true or false"),
        (
            {"version_policy": {"latest": {"num_versions": 1}, "all": {}}},
            "version_policy must be one of latest, all or specific, got",
        ),
        ({"version_policy": {"newest": {}}}, "version_policy must be one of latest, all or specific"),
        (
            {"version_policy": {"latest": {"num_versions": 0}}},
            "version_policy latest num_versions must be >= 1, got 0",
        ),
        (
            {"version_policy": {"specific": {"versions": [1, -2]}}},
            "version_policy specific versions must be integers >= 0, got [1, -2]",
        ),
        ({"instance_group": [{"count": 0}]}, "instance_group 'm_0' count must be >= 1, got 0"),
        ({"instance_group": [{"kind": "KIND_TPU"}]}, "instance_group 'm_0' has unknown kind 'KIND_TPU'"),
        (_batching(preferred_batch_size=[2, 8]), "dynamic_batching preferred_batch_size 8 is not in 1..4"),
        (
            {"max_batch_size": 0, **_batching(preferred_batch_size=[1])},
            "dynamic_batching preferred_batch_size 1 is not in 1..0 (max_batch_size)",
        ),
        ({"dynamic_batching": []}, "dynamic_batching must be a message"),
        (
            _batching(max_queue_delay_microseconds=-1),
            "dynamic_batching max_queue_delay_microseconds must be an integer >= 0, got -1",
        ),
        (
            _batching(preserve_ordering="yes"),
            "dynamic_batching preserve_ordering must be true or false, got 'yes'",
        ),
        (_batching(priority_levels=2), "dynamic_batching default_priority_level must be in 1..2, got 0"),
        (
            _batching(priority_levels=2, default_priority_level=3),
            "dynamic_batching default_priority_level must be in 1..2, got 3",
        ),
        (
            _batching(priority_levels=2, default_priority_level=1, priority_queue_policy={"3": {}}),
            "dynamic_batching priority_queue_policy level 3 is not in 1..2 (priority_levels)",
        ),
        (
            _batching(priority_queue_policy={"high": {}}),
            "dynamic_batching priority_queue_policy level 'high' is not a number",
        ),
        (
            _batching(default_queue_policy={"timeout_action": "DROP"}),
            "dynamic_batching default_queue_policy timeout_action must be REJECT or DELAY, got 'DROP'",
        ),
        (
            _batching(default_queue_policy={"max_queue_size": -4}),
            "dynamic_batching default_queue_policy max_queue_size must be an integer >= 0, got -4",
        ),
        (
            _batching(default_queue_policy={"allow_timeout_override": 2}),
            "dynamic_batching default_queue_policy allow_timeout_override must be true or false, got 2",
        ),
        (
            _batching(priority_levels=2, default_priority_level=1, preserve_ordering=True),
            "dynamic_batching preserve_ordering allows only one priority level, got 2",
        ),
        (
            _batching(
                preserve_ordering=True,
                default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": 5},
            ),
            "dynamic_batching preserve_ordering does not allow a queue policy that DELAYs",
        ),
        ({"parameters": {"k": "v"}}, "parameters must map names to { string_value: ... }"),
    ],
)
def test_invalid_configs_are_rejected_with_a_message_naming_the_model(changes, message):
    with pytest.raises(ConfigError) as info:
        normalize_config(_base(**changes), "m")
    assert str(info.value).startswith(f"model 'm': {message}")


# ------------------------------------------------------------------------------------------ loading


def test_missing_config_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^model 'empty': no config.pbtxt or config.json"):
        load_model_config(tmp_path / "empty")


def test_unreadable_json_is_an_error(tmp_path):
    model = _write(tmp_path / "broken", "config.json", '{"backend": "python",')
    with pytest.raises(ConfigError, match=r"^model 'broken': config.json is not valid JSON: .*line 1"):
        load_model_config(model)


def test_json_that_is_not_an_object_is_an_error(tmp_path):
    model = _write(tmp_path / "listy", "config.json", "[1, 2]")
    with pytest.raises(ConfigError, match=r"^model 'listy': the configuration must be a message"):
        load_model_config(model)


def test_pbtxt_syntax_error_names_model_file_and_line(tmp_path):
    model = _write(
        tmp_path / "simple", "config.pbtxt", SIMPLE_PBTXT.replace("max_batch_size:", "max_batch_size")
    )
    with pytest.raises(ConfigError) as info:
        load_model_config(model)
    assert (
        str(info.value) == "model 'simple': config.pbtxt: line 4: expected ':' or '{' after 'max_batch_size'"
    )


def test_validation_error_names_the_model_directory(tmp_path):
    model = _write(tmp_path / "simple", "config.pbtxt", SIMPLE_PBTXT.replace("TYPE_INT32", "TYPE_FOO", 1))
    with pytest.raises(ConfigError) as info:
        load_model_config(model)
    assert str(info.value) == "model 'simple': input 'INPUT0' has unknown data_type 'TYPE_FOO'"


@pytest.mark.parametrize(
    ("files", "backend", "platform"),
    [
        (["model.onnx"], "onnxruntime", "onnxruntime_onnx"),
        (["model.py"], "python", ""),
        (["model.pt"], "pytorch", "pytorch_libtorch"),
        (["model.pt2"], "pytorch", "pytorch_libtorch"),
        (["model.py", "model.onnx"], "onnxruntime", "onnxruntime_onnx"),  # Triton looks for ONNX first
    ],
)
def test_a_config_naming_no_backend_takes_it_from_the_model_file(
    tmp_path: Path, files: list[str], backend: str, platform: str
) -> None:
    """As Triton's auto-complete: model.onnx -> onnxruntime, model.py -> python, model.pt -> pytorch."""
    config = normalize_config(_base(backend=None, input=None, output=None), "m")
    assert config["backend"] == config["platform"] == ""  # left to the model file
    for name in files:
        (tmp_path / name).write_bytes(b"")
    completed = backend_from_files(tmp_path, config)
    assert (completed["backend"], completed["platform"]) == (backend, platform)


def test_default_model_filename_tells_the_backend_and_nothing_else_does(tmp_path: Path) -> None:
    config = normalize_config(_base(backend=None, default_model_filename="model.onnx"), "m")
    assert backend_from_files(tmp_path, config)["backend"] == "onnxruntime"
    (tmp_path / "model.savedmodel").mkdir()
    with pytest.raises(ConfigError, match="model 'm': must specify 'backend' or 'platform'"):
        backend_from_files(tmp_path, normalize_config(_base(backend=None), "m"))
    given = normalize_config(_base(backend="pytorch"), "m")
    assert backend_from_files(tmp_path, given) is given  # a config that says is never second-guessed
