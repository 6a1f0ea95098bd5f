"""Triton's restricted APIs: `--http-restricted-api` and `--grpc-restricted-protocol`.

Each flag, `<groups>:<key>=<value>` (repeatable), names API groups that then answer only a request carrying
the header `<key>` with exactly the value `<value>`. The groups are Triton's (its restricted_features.h):
health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace and logging.

- REST (HTTP/1.1 and HTTP/2, either transport): a request without the header is answered 403 with the
  protocol's error body, `This API is restricted, expecting header '<key>'`, as Triton answers.
- gRPC: the metadata key is `triton-grpc-protocol-<key>`, as Triton names it; a call without it ends
  UNAVAILABLE, `This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'`.

TF Serving's and grps' routes and methods belong to the groups they touch (their predict is inference,
their status and readiness health, their metadata metadata, TF Serving's config reload model-repository).
The metrics port, the monitor page and server reflection belong to none, as in Triton.
"""

import re

GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
GRPC_KEY_PREFIX = "triton-grpc-protocol-"

Restrictions = dict[str, tuple[str, str]]  # group -> (the header, its value)

# A REST route's group, from its template: the first rule that matches (none: the route is never restricted).
_HTTP_RULES = [
    (re.compile(pattern), group)
    for pattern, group in (
        (r"^/v2/health/", "health"),
        (r"^/v2/models/.*/ready$", "health"),
        (r"^/v2/(system|cuda)sharedmemory", "shared-memory"),
        (r"^/v2/repository/", "model-repository"),
        (r"^/v2/models.*/stats$", "statistics"),
        (r"/trace/setting$", "trace"),
        (r"^/v2/logging$", "logging"),
        (r"^/v2/models/.*/config$", "model-config"),
        (r"^/v2/models/.*/(infer|generate|generate_stream)$", "inference"),
        (r"^/v2(/models/\{model\}(\[/versions/\{version\}\])?)?$", "metadata"),
        (r"^/v1/models/.*:(predict|classify|regress)$", "inference"),
        (r"^/v1/models/.*/metadata$", "metadata"),
        (r"^/v1/models/", "health"),  # TF Serving's model status
        (r"^/grps/v1/infer/", "inference"),
        (r"^/grps/v1/health/", "health"),
        (r"^/grps/v1/metadata/", "metadata"),
    )
]

_V2 = "/inference.GRPCInferenceService/"
_GRPS = "/grps.protos.v1.GrpsService/"
_TF = "/tensorflow.serving.PredictionService/"
GRPC_GROUPS = {
    **{_V2 + m: "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{_V2 + m: "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    **{_V2 + m: "inference" for m in ("ModelInfer", "ModelStreamInfer")},
    _V2 + "ModelConfig": "model-config",
    _V2 + "ModelStatistics": "statistics",
    **{
        _V2 + m: "model-repository"
        for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
    },
    **{
        _V2 + f"{kind}SharedMemory{action}": "shared-memory"
        for kind in ("System", "Cuda")
        for action in ("Status", "Register", "Unregister")
    },
    _V2 + "TraceSetting": "trace",
    _V2 + "LogSettings": "logging",
    "/grpc.health.v1.Health/Check": "health",
    "/grpc.health.v1.Health/Watch": "health",
    **{_GRPS + m: "inference" for m in ("Predict", "PredictStreaming")},
    **{_GRPS + m: "health" for m in ("Online", "Offline", "CheckLiveness", "CheckReadiness")},
    **{_GRPS + m: "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    **{_TF + m: "inference" for m in ("Predict", "Classify", "Regress", "MultiInference")},
    _TF + "GetModelMetadata": "metadata",
    "/tensorflow.serving.ModelService/GetModelStatus": "health",
    "/tensorflow.serving.ModelService/HandleReloadConfigRequest": "model-repository",
}


def parse(entries: list[str], option: str, key_prefix: str, kind: str) -> Restrictions:
    """The flag's values -> group -> (header, value); ValueError with Triton's texts."""
    found: Restrictions = {}
    for entry in entries:
        groups, colon, setting = entry.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and groups and key and value):
            raise ValueError(f"--{option} option format is '<config name>:<setting>=<value>'. Got {entry}")
        for group in groups.split(","):
            if group not in GROUPS:
                raise ValueError(f"unknown restricted {kind} '{group}' (the groups: {', '.join(GROUPS)})")
            if group in found:
                raise ValueError(
                    f"restricted {kind} '{group}' can not be specified in multiple config groups"
                )
            found[group] = (key_prefix + key, value)
    return found


def http_group(template: str) -> str:
    """The group of a REST route, from its path template; "" for a route no flag restricts."""
    for pattern, group in _HTTP_RULES:
        if pattern.search(template):
            return group
    return ""


def http_message(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


def grpc_message(header: str) -> str:
    return f"This protocol is restricted, expecting header '{header}'"
