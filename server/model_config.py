"""Validate a Triton model configuration and fill Triton's defaults: config.pbtxt (read by server/pbtxt.py)
or config.json in, a plain dict out.

The dict has the shape of Triton's model_config JSON (`GET /v2/models/{m}/config`): the protobuf JSON
mapping of model_config.proto with proto field names, enums as their names, int64 fields as numbers and
map fields as objects with string keys.
"""

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensorgate.codec.datatypes import BY_CONFIG, BY_V2
from tensorgate.server import sequence_config
from tensorgate.server.config_error import ConfigError
from tensorgate.server.pbtxt import MAP_FIELDS, parse_pbtxt

# Integer fields a config.json may spell as strings (protobuf's JSON writes 64-bit integers that way).
_INT_FIELDS = frozenset(
    "dims shape versions dim max_queue_delay_microseconds default_timeout_microseconds priority_levels "  # noqa: SIM905
    "default_priority_level max_sequence_idle_microseconds model_version device_id max_batch_size count "
    "gpus num_versions preferred_batch_size batch_size max_queue_size max_candidate_sequences "
    "priority".split()
)
_INT_TEXT_RE = re.compile(r"-?\d+")  # such a field's string: an integer, or left as it is
_PLATFORM_BACKENDS = {
    "tensorrt_plan": "tensorrt",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "python": "python",
    "ensemble": "",  # the server runs ensembles itself; Triton requires their backend to stay empty
}
# Backends that can complete a config's inputs and outputs from the model (server/backends/__init__.py).
AUTO_COMPLETED = ("onnxruntime", "python")
_GROUP_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")
_TIMEOUT_ACTIONS = ("REJECT", "DELAY")  # ModelQueuePolicy.TimeoutAction, in enum order
# BatchInput.Kind, in enum order (docs/scheduling/dynamic-batching.md, ragged batching)
BATCH_INPUT_KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)


def _require(ok: object, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fix_ints(node: Any, key: str | None = None) -> Any:
    """A copy of a parsed config with integer fields written as strings ("16") turned into ints."""
    if isinstance(node, dict):
        if key in MAP_FIELDS or key == "input":  # a map: its keys are not field names
            return {k: _fix_ints(v) for k, v in node.items()}
        return {k: _fix_ints(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_fix_ints(v, None if isinstance(v, dict) else key) for v in node]
    if key in _INT_FIELDS and isinstance(node, str) and _INT_TEXT_RE.fullmatch(node.strip()):
        return int(node)
    return node


def _dims(value: Any, what: str) -> list[int]:
    ok = isinstance(value, list) and all(_is_int(d) and (d == -1 or d >= 1) for d in value)
    _require(ok, f"{what} must be a list of integers >= 1 or -1 (variable size), got {value!r}")
    return value


def _runs(shape: list[int]) -> list[int]:
    """Element counts of the runs between -1 dims: Triton lets dims and reshape differ only within runs."""
    counts = [1]
    for d in shape:
        if d == -1:
            counts.append(1)
        else:
            counts[-1] *= d
    return counts


def _tensors(items: Any, kind: str, max_batch_size: int) -> list[dict]:
    _require(items, f"must specify at least one {kind}")
    _require(isinstance(items, list), f"'{kind}' must be a list")
    out, seen = [], set()
    for i, tensor in enumerate(items):
        _require(isinstance(tensor, dict) and tensor.get("name"), f"{kind} #{i} must specify 'name'")
        _require(isinstance(tensor["name"], str), f"{kind} #{i}: 'name' must be a string")
        what = f"{kind} '{tensor['name']}'"
        _require(tensor["name"] not in seen, f"{what} is specified more than once")
        seen.add(tensor["name"])
        data_type = tensor.get("data_type")
        _require(data_type is not None, f"{what} must specify 'data_type'")
        ok = isinstance(data_type, str) and data_type in BY_CONFIG
        _require(ok, f"{what} has unknown data_type '{data_type}'")
        dims = _dims(tensor.get("dims", []), f"{what} dims")
        _require(dims, f"{what} must specify 'dims'")
        tensor = {**tensor, "dims": dims}
        if "reshape" in tensor:
            _require(isinstance(tensor["reshape"], dict), f"{what} reshape must be {{ shape: [...] }}")
            shape = _dims(tensor["reshape"].get("shape", []), f"{what} reshape shape")
            _require(shape or max_batch_size, f"{what} cannot have an empty reshape if max_batch_size is 0")
            _require(_runs(shape) == _runs(dims), f"{what} reshape {shape} does not fit dims {dims}")
            tensor["reshape"] = {**tensor["reshape"], "shape": shape}
        if kind == "input":
            tensor.setdefault("optional", False)
            _require(isinstance(tensor["optional"], bool), f"{what} optional must be true or false")
            if "allow_ragged_batch" in tensor:
                tensor["allow_ragged_batch"] = _flag(tensor, "allow_ragged_batch", what)
        out.append(tensor)
    return out


def _from_metadata(items: Any, kind: str, max_batch_size: int) -> Any:
    """Tensors in the v2 metadata form (`{"name", "datatype", "shape"}`, as the repository extension's
    own load example writes them) as model-config entries; with batching, a leading -1 is the batch."""
    if not isinstance(items, list):
        return items  # _tensors says what is wrong
    out = []
    for i, tensor in enumerate(items):
        _require(isinstance(tensor, dict), f"{kind} #{i} must be an object")
        datatype = tensor.get("datatype")
        ok = isinstance(datatype, str) and datatype in BY_V2
        _require(ok, f"{kind} '{tensor.get('name')}' has unknown datatype {datatype!r}")
        shape = tensor.get("shape", [])
        if max_batch_size and isinstance(shape, list) and shape[:1] == [-1]:
            shape = shape[1:]
        entry = {"name": tensor.get("name"), "data_type": BY_V2[datatype].config, "dims": shape}
        if "optional" in tensor:
            entry["optional"] = tensor["optional"]
        out.append(entry)
    return out


def _version_policy(policy: Any) -> dict:
    if not policy:
        return {"latest": {"num_versions": 1}}
    kind, body = next(iter(policy.items())) if isinstance(policy, dict) else (None, None)
    ok = kind in ("latest", "all", "specific") and len(policy) == 1 and isinstance(body, dict)
    _require(ok, f"version_policy must be one of latest, all or specific, got {policy!r}")
    if kind == "latest":
        num = body.get("num_versions", 1)
        _require(_is_int(num) and num >= 1, f"version_policy latest num_versions must be >= 1, got {num!r}")
        return {"latest": {"num_versions": num}}
    if kind == "specific":
        versions = body.get("versions", [])
        ok = isinstance(versions, list) and all(_is_int(v) and v >= 0 for v in versions)
        _require(ok, f"version_policy specific versions must be integers >= 0, got {versions!r}")
        return {"specific": {"versions": versions}}
    return {"all": {}}


def _instance_groups(groups: Any, model: str) -> list[dict]:
    if not groups:
        return [{"name": model, "kind": "KIND_CPU", "count": 1}]
    ok = isinstance(groups, list) and all(isinstance(g, dict) for g in groups)
    _require(ok, "instance_group must be a list of messages")
    out = []
    for i, group in enumerate(groups):
        name = group.get("name") or f"{model}_{i}"  # what Triton names an unnamed group
        kind, count = group.get("kind", "KIND_AUTO"), group.get("count", 1)
        _require(kind in _GROUP_KINDS, f"instance_group '{name}' has unknown kind {kind!r}")
        _require(_is_int(count) and count >= 1, f"instance_group '{name}' count must be >= 1, got {count!r}")
        out.append({**group, "name": name, "kind": kind, "count": count})
        if "rate_limiter" in group:
            out[-1]["rate_limiter"] = _rate_limiter(
                group["rate_limiter"], f"instance_group '{name}' rate_limiter"
            )
    return out


def _rate_limiter(limiter: Any, what: str) -> dict:
    """ModelRateLimiter: the resources an instance of the group holds while it executes, and its priority."""
    _require(isinstance(limiter, dict), f"{what} must be a message")
    resources = limiter.get("resources", [])
    _require(isinstance(resources, list), f"{what} resources must be a list of messages")
    out = []
    for resource in resources:
        _require(isinstance(resource, dict), f"{what} resources must be a list of messages")
        name = resource.get("name")
        _require(isinstance(name, str) and name, f"{what}: a resource must specify 'name'")
        out.append(
            {
                **resource,
                "name": name,
                "count": _non_negative(resource, "count", f"{what} resource '{name}'"),
                "global": _flag(resource, "global", f"{what} resource '{name}'"),
            }
        )
    return {**limiter, "resources": out, "priority": _non_negative(limiter, "priority", what)}


def _batch_inputs(items: Any, inputs: list[dict]) -> list[dict]:
    """BatchInput entries validated as Triton validates them (core ValidateBatchIO); kinds as names."""
    _require(isinstance(items, list), "batch_input must be a list of messages")
    names = {tensor["name"] for tensor in inputs}
    out = []
    for entry in items:
        _require(isinstance(entry, dict), "batch_input must be a list of messages")
        kind = entry.get("kind", BATCH_INPUT_KINDS[0])
        if _is_int(kind) and 0 <= kind < len(BATCH_INPUT_KINDS):  # protobuf JSON may give enums as numbers
            kind = BATCH_INPUT_KINDS[kind]
        _require(kind in BATCH_INPUT_KINDS, f"unknown batch input kind '{kind}'")
        sources, targets = entry.get("source_input", []), entry.get("target_name", [])
        _require(
            isinstance(sources, list) and len(sources) == 1,
            f"batch input kind '{kind}' expects 1 source input, got "
            f"{len(sources) if isinstance(sources, list) else sources!r}",
        )
        ok = (
            isinstance(targets, list) and len(targets) >= 1 and all(isinstance(t, str) and t for t in targets)
        )
        _require(ok, f"batch input kind '{kind}' must name its target_name")
        data_type = entry.get("data_type")
        ok = data_type in ("TYPE_INT32", "TYPE_FP32")
        _require(ok, "batch input data type must be TYPE_INT32 or TYPE_FP32")
        _require(not names or sources[0] in names, f"unknown source input name '{sources[0]}'")
        out.append({**entry, "kind": kind, "source_input": sources, "target_name": targets})
    return out


def _non_negative(message: dict, field: str, what: str) -> int:
    value = message.get(field, 0)
    _require(_is_int(value) and value >= 0, f"{what} {field} must be an integer >= 0, got {value!r}")
    return value


def _flag(message: dict, field: str, what: str) -> bool:
    value = message.get(field, False)
    ok = isinstance(value, bool) or value in (0, 1)  # protobuf text format also writes bools as 0 / 1
    _require(ok and not isinstance(value, float), f"{what} {field} must be true or false, got {value!r}")
    return bool(value)


def _queue_policy(policy: Any, what: str) -> dict:
    """A ModelQueuePolicy with every field filled (Triton's defaults: REJECT, no timeout, no limit)."""
    _require(isinstance(policy, dict), f"{what} must be a message")
    action = policy.get("timeout_action", "REJECT")
    if _is_int(action) and 0 <= action < len(_TIMEOUT_ACTIONS):  # protobuf JSON may give enums as numbers
        action = _TIMEOUT_ACTIONS[action]
    _require(action in _TIMEOUT_ACTIONS, f"{what} timeout_action must be REJECT or DELAY, got {action!r}")
    return {
        **policy,
        "timeout_action": action,
        "default_timeout_microseconds": _non_negative(policy, "default_timeout_microseconds", what),
        "allow_timeout_override": _flag(policy, "allow_timeout_override", what),
        "max_queue_size": _non_negative(policy, "max_queue_size", what),
    }


def _dynamic_batching(batching: Any, max_batch_size: int) -> dict:
    """ModelDynamicBatching validated as Triton validates it, every field filled; an empty
    preferred_batch_size becomes [max_batch_size], as Triton normalizes it."""
    what = "dynamic_batching"
    _require(isinstance(batching, dict), f"{what} must be a message")
    sizes = batching.get("preferred_batch_size", [])
    _require(isinstance(sizes, list), f"{what} preferred_batch_size must be a list of integers")
    for size in sizes:
        ok = _is_int(size) and 1 <= size <= max_batch_size
        _require(ok, f"{what} preferred_batch_size {size!r} is not in 1..{max_batch_size} (max_batch_size)")
    levels = _non_negative(batching, "priority_levels", what)
    default_level = _non_negative(batching, "default_priority_level", what)
    policies = batching.get("priority_queue_policy", {})
    _require(isinstance(policies, dict), f"{what} priority_queue_policy must map priority levels to policies")
    for key in policies:
        _require(str(key).isdigit(), f"{what} priority_queue_policy level {key!r} is not a number")
        ok = not levels or 1 <= int(key) <= levels  # without priority levels, Triton ignores them
        _require(ok, f"{what} priority_queue_policy level {key} is not in 1..{levels} (priority_levels)")
    if levels:
        ok = 1 <= default_level <= levels
        _require(ok, f"{what} default_priority_level must be in 1..{levels}, got {default_level}")
    out = {
        **batching,
        "preferred_batch_size": sizes or ([max_batch_size] if max_batch_size else []),
        "max_queue_delay_microseconds": _non_negative(batching, "max_queue_delay_microseconds", what),
        "preserve_ordering": _flag(batching, "preserve_ordering", what),
        "priority_levels": levels,
        "default_priority_level": default_level,
        "default_queue_policy": _queue_policy(
            batching.get("default_queue_policy", {}), f"{what} default_queue_policy"
        ),
        "priority_queue_policy": {
            str(int(k)): _queue_policy(v, f"{what} priority_queue_policy level {k}")
            for k, v in policies.items()
        },
    }
    if out["preserve_ordering"]:
        # Responses in request order cannot let a request overtake another.
        _require(levels <= 1, f"{what} preserve_ordering allows only one priority level, got {levels}")
        for policy in (out["default_queue_policy"], *out["priority_queue_policy"].values()):
            delays = policy["timeout_action"] == "DELAY" and policy["default_timeout_microseconds"]
            _require(not delays, f"{what} preserve_ordering does not allow a queue policy that DELAYs")
    return out


def _normalize(raw: Any, model: str) -> dict:
    _require(isinstance(raw, dict), "the configuration must be a message (a JSON object)")
    cfg = _fix_ints(raw)
    name = cfg.get("name") or model
    _require(name == model, f"configuration name '{name}' does not match the model directory name")
    platform, backend = cfg.get("platform") or "", cfg.get("backend") or ""
    _require(isinstance(platform, str) and isinstance(backend, str), "platform and backend must be strings")
    if not backend and platform:  # neither: the model's file says which (server/backends, at load)
        _require(platform in _PLATFORM_BACKENDS, f"unknown platform '{platform}'; specify 'backend'")
        backend = _PLATFORM_BACKENDS[platform]
    max_batch_size = cfg.get("max_batch_size", 0)
    ok = _is_int(max_batch_size) and max_batch_size >= 0
    _require(ok, f"max_batch_size must be an integer >= 0, got {max_batch_size!r}")
    filename = cfg.get("default_model_filename")
    ok = filename is None or (
        isinstance(filename, str)
        and filename not in ("", ".", "..")
        and not {"/", "\\", "\0"} & set(filename)
    )  # a file of the version folder: a config override must not name a file elsewhere on the disk
    _require(ok, f"default_model_filename must be a file name in the version folder, got {filename!r}")
    parameters = cfg.get("parameters", {})
    ok = isinstance(parameters, dict) and all(isinstance(v, dict) for v in parameters.values())
    _require(ok, "parameters must map names to { string_value: ... }")

    tensors = {}
    for kind in ("input", "output"):
        given = cfg.get(kind)
        if given is None and f"{kind}s" in cfg:  # the v2 metadata form
            given = _from_metadata(cfg.pop(f"{kind}s"), kind, max_batch_size)
        # left out: the backend completes them from the model (ONNX graph, auto_complete_config); a
        # config naming no backend may leave them out too, for the backend its model file tells
        completed = backend in AUTO_COMPLETED or not (backend or platform)
        tensors[kind] = [] if not given and completed else _tensors(given, kind, max_batch_size)
    out = {
        "name": name,
        "platform": platform,
        "backend": backend,
        "version_policy": _version_policy(cfg.get("version_policy")),
        "max_batch_size": max_batch_size,
        "input": tensors["input"],
        "output": tensors["output"],
    }
    if platform != "ensemble":  # Triton gives ensembles no instance groups
        out["instance_group"] = _instance_groups(cfg.get("instance_group"), name)
    if cfg.get("dynamic_batching") is not None:
        out["dynamic_batching"] = _dynamic_batching(cfg["dynamic_batching"], max_batch_size)
    if cfg.get("sequence_batching") is not None:
        given = {**cfg, "name": name, "max_batch_size": max_batch_size}
        out["sequence_batching"] = _sequence(
            lambda: sequence_config.normalize(cfg["sequence_batching"], given)
        )
    if cfg.get("batch_input"):
        out["batch_input"] = _batch_inputs(cfg["batch_input"], out["input"])
    out["parameters"] = parameters
    for key, value in cfg.items():  # everything else (schedulers, warmup, unknown fields) as given
        out.setdefault(key, value)
    return out


def check_complete(config: dict) -> dict:
    """A config its backend completed (or could not): it must now have valid inputs and outputs, and the
    tensors its sequence batcher fills must not be among its inputs."""
    batch = config.get("max_batch_size", 0)
    _require(_is_int(batch) and batch >= 0, f"max_batch_size must be an integer >= 0, got {batch!r}")
    config = {**config, **{kind: _tensors(config.get(kind), kind, batch) for kind in ("input", "output")}}
    if config.get("batch_input"):
        config["batch_input"] = _batch_inputs(config["batch_input"], config["input"])
    _sequence(lambda: sequence_config.check_names(config))
    return config


def _sequence(check: Callable[[], Any]) -> Any:
    """A sequence_batching check (server/sequence_config.py), its fault as a ConfigError."""
    try:
        return check()
    except sequence_config.SequenceConfigError as e:
        raise ConfigError(str(e)) from None


def normalize_config(raw: dict, model_name: str) -> dict:
    """Validate a parsed config (from pbtxt or JSON) and fill Triton's defaults; raises ConfigError."""
    try:
        return _normalize(raw, model_name)
    except ConfigError as e:
        raise ConfigError(f"model '{model_name}': {e}") from None


def load_model_config(model_dir: Path, config_name: str = "", missing_ok: bool = False) -> dict:
    """Read model_dir/config.pbtxt (else config.json) and return the normalized config dict. With
    `config_name` (--model-config-name), model_dir/configs/<config_name>.pbtxt is read instead where it
    exists, as Triton reads it. `missing_ok` (auto-complete on): a folder without a config gets the
    empty one, which its backend then completes, as Triton's auto-complete does."""
    model = model_dir.name
    pbtxt, config_json = model_dir / "config.pbtxt", model_dir / "config.json"
    if config_name and (model_dir / "configs" / f"{config_name}.pbtxt").is_file():
        pbtxt = model_dir / "configs" / f"{config_name}.pbtxt"
    path = pbtxt if pbtxt.is_file() else config_json
    if not path.is_file() and missing_ok:
        return normalize_config({}, model)
    _require(
        path.is_file(),
        f"model '{model}': no config.pbtxt or config.json in {model_dir} (failed to open text file for "
        f"read {pbtxt}: No such file or directory)",
    )
    try:
        text = path.read_text(encoding="utf-8")
        raw = parse_pbtxt(text) if path is pbtxt else json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"model '{model}': {path.name} is not valid JSON: {e}") from None
    except (OSError, UnicodeDecodeError, ConfigError) as e:
        raise ConfigError(f"model '{model}': {path.name}: {e}") from None
    return normalize_config(raw, model)


def parameter(config: dict, key: str, default: str = "") -> str:
    """A string parameter of the config (`parameters { key: "K" value: { string_value: "V" } }`)."""
    entry = (config.get("parameters") or {}).get(key)
    if isinstance(entry, dict):
        return str(entry.get("string_value", default))
    return default if entry is None else str(entry)
