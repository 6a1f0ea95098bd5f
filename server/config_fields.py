"""What the server does with each field of Triton's model configuration (model_config.proto).

Every field is implemented, warned (the model loads, and its load logs what we do instead) or refused
(ignoring it would change answers: the load fails with the reason). The loader consults `check` once
per load; docs/models/config-fields.md shows `markdown_table()` (tests/test_e2e_config_fields.py checks it).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

from tensorgate.server.config_error import ConfigError

log = logging.getLogger("tensorgate.repository")

IMPLEMENTED, WARNED, REFUSED = "implemented", "warned", "refused"
# Triton's custom batching library (docs/user_guide/batcher.md "Custom Batching"): named by this
# parameter, else a file of this name in the version folder, the model folder or the backend's.
STRATEGY_PARAMETER = "TRITON_BATCH_STRATEGY_PATH"
STRATEGY_FILE = "batchstrategy.so"


class Field(NamedTuple):
    path: str  # "instance_group.gpus": the field `gpus` of each instance_group entry
    status: str
    text: str  # implemented: what it does here; warned or refused: what we do instead, or why not


FIELDS: tuple[Field, ...] = (
    Field("name", IMPLEMENTED, "must match the model folder's name"),
    Field("platform", IMPLEMENTED, "onnxruntime_onnx, pytorch_libtorch, python, ensemble"),
    Field("backend", IMPLEMENTED, "onnxruntime, pytorch, python; filled from the model file when left out"),
    Field("runtime", WARNED, "not used: the backend the config names runs as built in"),
    Field("version_policy", IMPLEMENTED, "latest, all or specific versions load"),
    Field("max_batch_size", IMPLEMENTED, "the largest batch the batchers form"),
    Field("input", IMPLEMENTED, "names, datatypes, dims, reshape, optional, allow_ragged_batch"),
    Field("input.format", WARNED, "not used: tensors pass in the layout the client sends"),
    Field("input.is_shape_tensor", REFUSED, "shape tensors (a TensorRT feature) are not implemented"),
    Field("input.is_non_linear_format_io", WARNED, "not used: tensors are linear here"),
    Field("output", IMPLEMENTED, "names, datatypes, dims, reshape"),
    Field("output.label_filename", IMPLEMENTED, "the labels of the classification extension"),
    Field("output.is_shape_tensor", REFUSED, "shape tensors (a TensorRT feature) are not implemented"),
    Field("output.is_non_linear_format_io", WARNED, "not used: tensors are linear here"),
    Field("batch_input", IMPLEMENTED, "ragged batching's batch inputs, every kind"),
    Field("batch_output", REFUSED, "batch outputs are not implemented: outputs would not be scattered"),
    Field("optimization", WARNED, "not used (execution accelerators, CUDA graphs, pinned memory, priority)"),
    Field("dynamic_batching", IMPLEMENTED, "preferred sizes, delay, priorities, queue policies, ordering"),
    Field(
        f"parameters.{STRATEGY_PARAMETER}",
        REFUSED,
        "custom batching strategies are not implemented: batches would be formed without the library",
    ),
    Field(
        STRATEGY_FILE,
        REFUSED,
        "custom batching strategies are not implemented: batches would be formed without the library",
    ),
    Field("sequence_batching", IMPLEMENTED, "direct and oldest strategies, controls, implicit state"),
    Field("ensemble_scheduling", IMPLEMENTED, "the steps run as a pipeline of models"),
    Field("instance_group", IMPLEMENTED, "each group's instances; groups on the host add up"),
    Field("instance_group.kind", IMPLEMENTED, "KIND_CPU on the host; KIND_GPU, KIND_AUTO on a CUDA device"),
    Field("instance_group.count", IMPLEMENTED, "the instances (batches executing at once) of the group"),
    Field(
        "instance_group.gpus",
        IMPLEMENTED,
        "the first GPU of the first KIND_GPU group runs; any other is named in a load warning",
    ),
    Field("instance_group.rate_limiter", IMPLEMENTED, "Triton's rate limiter (--rate-limit)"),
    Field("instance_group.secondary_devices", WARNED, "not used: the instances run on their primary device"),
    Field("instance_group.profile", WARNED, "not used (TensorRT optimization profiles)"),
    Field("instance_group.passive", WARNED, "not used: passive instances are scheduled like the others"),
    Field("instance_group.host_policy", WARNED, "not used: instances run under the server's host policy"),
    Field("default_model_filename", IMPLEMENTED, "the model file of each version folder"),
    Field("cc_model_filenames", WARNED, "not used: default_model_filename runs on every device"),
    Field("metric_tags", WARNED, "not used: the metrics carry model and version labels only"),
    Field("parameters", IMPLEMENTED, "given to the backend (args['model_config'], array_module, ...)"),
    Field("model_warmup", IMPLEMENTED, "the samples run before the model is ready"),
    Field("model_operations", REFUSED, "custom operation libraries are not loaded"),
    Field("model_transaction_policy", IMPLEMENTED, "decoupled python models stream their responses"),
    Field("model_repository_agents", WARNED, "not used: no repository agent runs, files load as they are"),
    Field("response_cache", IMPLEMENTED, "the server's response cache (--cache-config)"),
    Field(
        "model_metrics",
        IMPLEMENTED,
        "the buckets of nv_inference_first_response_histogram_ms; other families get Triton's warning",
    ),
)
_BY_PATH = {f.path: f for f in FIELDS}


def _set_values(config: dict, path: str) -> list[Any]:
    """The values the config gives `path`, through repeated fields; unset, empty and false ones left out
    (`passive: false` asks for nothing)."""
    nodes: list[Any] = [config]
    for part in path.split("."):
        found = []
        for node in nodes:
            for item in node if isinstance(node, list) else [node]:
                if isinstance(item, dict) and part in item:
                    found.append(item[part])
        nodes = found
    return [v for v in nodes if v not in (None, "", [], {}, False, 0, "FORMAT_NONE")]


def check(config: dict, directory: Path | None = None) -> list[str]:
    """The load-time warnings for the fields of `config` the server does not use (the caller logs them);
    raises ConfigError naming the first refused field it sets. `directory`: the model's folder, where a
    custom batching library may lie."""
    name = config.get("name", "")
    for field in FIELDS:
        if field.status != REFUSED:
            continue
        if field.path == STRATEGY_FILE:
            batched = directory is not None and config.get("dynamic_batching") is not None
            given = batched and _strategy_file(directory)
        else:
            given = bool(_set_values(config, field.path))
        if given:
            raise ConfigError(f"model '{name}': {field.path} is not supported: {field.text}")
    warnings = [
        f"model '{name}': {field.path} is set but {field.text}"
        for field in FIELDS
        if field.status == WARNED and _set_values(config, field.path)
    ]
    unknown = sorted(k for k in config if k not in _BY_PATH)
    warnings += [f"model '{name}': unknown config field '{key}' is ignored" for key in unknown]
    return warnings


def _strategy_file(directory: Path) -> bool:
    return (directory / STRATEGY_FILE).is_file() or any(directory.glob(f"*/{STRATEGY_FILE}"))


def log_warnings(config: dict, directory: Path | None = None) -> None:
    """`check`, its warnings logged (once per load: the caller's)."""
    for warning in check(config, directory):
        log.warning("%s", warning)


def markdown_table() -> str:
    """The table of docs/models/config-fields.md."""
    rows = ["| Field | Here | What happens |", "| --- | --- | --- |"]
    rows += [f"| `{f.path}` | {f.status} | {f.text} |" for f in FIELDS]
    return "\n".join(rows) + "\n"
