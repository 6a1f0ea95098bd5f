"""deploy/kserve: the ClusterServingRuntime and the InferenceService example, checked offline against
KServe's API and admission rules, and against our CLI: the runtime's container args start a real server
on the example repository, which answers REST, h2c and gRPC on its one port.

Where each schema and fact comes from (no file of KServe's is kept in this repository):
- KServe's types: the model classes of KServe's Python SDK (`kserve` on PyPI, pinned to v0.20.0, the
  release of every fact here), generated from the Go types KServe's CRDs are generated from. The test
  downloads that wheel with pip, once, into pytest's cache folder (untracked; checked by sha256), and
  reads each class's `openapi_types`, `attribute_map` and required fields from its source, without
  importing kserve. A failed download fails the test, with pip's message.
- The Kubernetes types in them (V1Container, V1ObjectMeta, ...): kubernetes-validate's strict schemas of
  Kubernetes 1.34, whose types KServe v0.20.0's CRDs embed (field for field, type for type).
- What KServe's CRDs add to those types (a minimum, enums, patterns, required names), Kubernetes'
  quantity grammar, KServe's runtimes and its admission webhook's priority rules: stated here in our
  own words, each with where KServe or Kubernetes says it.
Strict as an API server's strict field validation: a field its type lacks is refused, and so is a value
of the wrong type, or null."""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib.resources
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
import yaml
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, make_client
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tensorgate.server.options import build_parser

KSERVE = ROOT / "deploy" / "kserve"
RUNTIME_FILE = KSERVE / "cluster-serving-runtime.yaml"
ISVC_FILE = KSERVE / "inference-service.yaml"
KSERVE_SDK = "kserve==0.20.0"
KSERVE_WHEEL = "kserve-0.20.0-py3-none-any.whl"
KSERVE_WHEEL_SHA256 = "6762eae3ae633f69178e08f531052722ea34013ab611050e0263679c7c9ca8c7"
SDK_CACHE = ROOT / ".pytest_cache" / "d" / "kserve-sdk"  # where pytest's cache.mkdir would put it
K8S_SCHEMAS = "v1.34.0-local-strict"  # a folder of kubernetes-validate's
# The runtime's flags that name places on the pod, and what they become for a local run.
LOCAL_VALUES = {
    "--model-repository": str(EXAMPLES),
    "--http-port": "0",
    "--grpc-port": "0",
    "--metrics-port": "0",
}


def load(path: Path) -> dict[str, Any]:
    with open(path) as f:
        docs = [doc for doc in yaml.safe_load_all(f) if doc]
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


# ----------------------------------------------------------------------------------------- KServe's SDK


@functools.cache
def kserve_wheel() -> Path:
    wheel = SDK_CACHE / KSERVE_WHEEL
    if not wheel.exists():
        SDK_CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=SDK_CACHE) as tmp:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
            run = subprocess.run([*pip, "-d", tmp, KSERVE_SDK], capture_output=True, text=True)
            if run.returncode != 0 or not (Path(tmp) / KSERVE_WHEEL).exists():
                pytest.fail(
                    f"could not download {KSERVE_SDK} from PyPI (pip: {run.returncode}):\n{run.stderr}"
                )
            os.replace(Path(tmp) / KSERVE_WHEEL, wheel)  # whole or not at all
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == KSERVE_WHEEL_SHA256, f"{wheel} is not the wheel this test reads: delete it"
    return wheel


# How the generated setters refuse a missing required field: `if ...client_side_validation and x is None`.
SDK_REQUIRED = re.compile(r"self\.local_vars_configuration\.client_side_validation and (\w+) is None")


@functools.cache
def sdk_models() -> dict[str, tuple[dict[str, str], frozenset[str]]]:
    """{class: ({JSON key: its SDK type, as 'list[V1Container]'}, the JSON keys it requires)}."""
    models = {}
    with zipfile.ZipFile(kserve_wheel()) as wheel:
        sources = [wheel.read(n) for n in wheel.namelist() if re.fullmatch(r"kserve/models/v\w+\.py", n)]
    for cls in (node for source in sources for node in ast.parse(source).body):
        if not isinstance(cls, ast.ClassDef):
            continue
        maps = {
            node.targets[0].id: ast.literal_eval(node.value)
            for node in cls.body
            if isinstance(node, ast.Assign)
            and ast.unparse(node.targets[0]) in ("openapi_types", "attribute_map")
        }
        keys = maps["attribute_map"]
        types = {keys[field]: kind for field, kind in maps["openapi_types"].items()}
        tests = (ast.unparse(node.test) for node in ast.walk(cls) if isinstance(node, ast.If))
        required = {keys[m[1]] for test in tests if (m := SDK_REQUIRED.fullmatch(test))}
        models[cls.name] = (types, frozenset(required))
    # ServingRuntimeSpec's workerSpec is a V1alpha1WorkerSpec, a class the SDK names but does not ship. In
    # KServe's Go types (v1alpha1 WorkerSpec) it is ServingRuntimePodSpec's fields and two integers.
    pod, pod_required = models["V1alpha1ServingRuntimePodSpec"]
    worker = pod | {"pipelineParallelSize": "int", "tensorParallelSize": "int"}
    models.setdefault("V1alpha1WorkerSpec", (worker, pod_required))
    return models


@functools.cache
def sdk_group() -> str:
    with zipfile.ZipFile(kserve_wheel()) as wheel:
        constants = ast.parse(wheel.read("kserve/constants/constants.py")).body
    (group,) = [ast.literal_eval(c.value) for c in constants if ast.unparse(c).startswith("KSERVE_GROUP =")]
    return group


# ------------------------------------------------------------------- what the CRDs add, in our own words
#
# Kubernetes' quantity (k8s.io/apimachinery resource.Quantity): an integer, or a string: a signed decimal
# number, then a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal one (n u m k M G T P E) or an exponent (e or
# E, a signed number). KServe's CRDs say so; kubernetes-validate's schemas only "string or number".
_NUMBER = r"(\d+(\.\d*)?|\.\d+)"
_QUANTITY = rf"^[+-]?{_NUMBER}([KMGTPE]i|[numkMGTPE]|[eE][+-]?{_NUMBER})?$"
QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": _QUANTITY}]}
QUANTITY_TYPES = ("ResourceQuantity", "V1beta1MetricQuantity")  # the SDK's names for it
# The validation markers on KServe's Go types (pkg/apis/serving/v1alpha1 and v1beta1), which its CRDs
# carry and the SDK's models do not: (SDK class, field) -> the rule, in JSON Schema.
COMPONENTS = ("V1beta1PredictorSpec", "V1beta1ExplainerSpec", "V1beta1TransformerSpec")
CRD_RULES: dict[tuple[str, str], dict[str, Any]] = {
    ("V1alpha1SupportedModelFormat", "priority"): {"minimum": 1},
    ("V1beta1PredictorSpec", "name"): {"pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$"},  # a DNS label
    **{(cls, "scaleMetric"): {"enum": ["cpu", "memory", "concurrency", "rps"]} for cls in COMPONENTS},
    **{(cls, "scaleMetricType"): {"enum": ["Utilization", "Value", "AverageValue"]} for cls in COMPONENTS},
    **{(cls, "storageUris"): {"minItems": 1} for cls in COMPONENTS},
    ("V1beta1CanarySpec", "trafficPercent"): {"minimum": 0, "maximum": 100},
    ("V1beta1LoggerSpec", "mode"): {"enum": ["all", "request", "response"]},
    ("V1beta1MetricsSpec", "type"): {"enum": ["Resource", "External", "PodMetric"]},
    ("V1beta1MetricTarget", "type"): {"enum": ["Utilization", "Value", "AverageValue"]},
    ("V1beta1ExternalMetrics", "backend"): {"enum": ["prometheus", "graphite"]},
    ("V1beta1PodMetrics", "backend"): {"enum": ["opentelemetry"]},
    ("V1beta1ResourceMetricSource", "name"): {"enum": ["cpu", "memory"]},
    ("V1beta1StorageUri", "uri"): {"minLength": 1},
    ("V1beta1StorageUri", "mountPath"): {"pattern": "^/", "maxLength": 255},
}
# Fields the CRDs require (Go fields without omitempty) that the SDK's setters do not check.
CRD_REQUIRED = {("V1alpha1SupportedModelFormat", "name"), ("V1beta1ModelFormat", "name"),
                ("V1beta1AuthenticationRef", "name")}  # fmt: skip


# ------------------------------------------------------------------------------------ strict validation

PRIMITIVES = {  # the SDK's primitive types, and the JSON values each takes
    "str": lambda v: isinstance(v, str),
    "datetime": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),  # free-form (a status)
}


def refuse(where: str, message: str) -> None:
    raise jsonschema.ValidationError(f"{where}: {message}")


@functools.cache
def k8s_definitions() -> dict[str, Any]:
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / K8S_SCHEMAS
    definitions = json.loads((folder / "_definitions.json").read_text())["$defs"]
    return definitions | {"io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY}


def k8s_definition(sdk_type: str) -> str:
    """The Kubernetes definition an SDK type names (V1Container: io.k8s.api.core.v1.Container,
    K8sIoApiAppsV1DeploymentStrategy: io.k8s.api.apps.v1.DeploymentStrategy); none fails the test."""
    candidates = ["io.k8s.apimachinery.pkg.api.resource.Quantity"] if sdk_type in QUANTITY_TYPES else []
    if match := re.fullmatch(r"V1([A-Z]\w*)", sdk_type):
        candidates = [f"io.k8s.api.core.v1.{match[1]}", f"io.k8s.apimachinery.pkg.apis.meta.v1.{match[1]}"]
    elif match := re.fullmatch(r"K8sIoApi([A-Z][a-z]+)(V\d+(?:(?:alpha|beta)\d+)?)([A-Z]\w*)", sdk_type):
        candidates = [f"io.k8s.api.{match[1].lower()}.{match[2].lower()}.{match[3]}"]
    found = [name for name in candidates if name in k8s_definitions()]
    assert len(found) == 1, f"the SDK's type {sdk_type} is neither KServe's nor one of Kubernetes'"
    return found[0]


@functools.cache
def k8s_validator(definition: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": k8s_definitions()})


def check(value: Any, sdk_type: str, where: str) -> None:
    """Raises jsonschema.ValidationError unless `value` is, strictly, of the SDK's type `sdk_type`."""
    if match := re.fullmatch(r"list\[(.+)\]", sdk_type):
        if not isinstance(value, list):
            refuse(where, f"{value!r} is not of type {sdk_type}")
        for i, item in enumerate(value):
            check(item, match[1], f"{where}.{i}")
    elif match := re.fullmatch(r"dict\(str, (.+)\)", sdk_type):
        if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
            refuse(where, f"{value!r} is not of type {sdk_type}")
        for key, item in value.items():
            check(item, match[1], f"{where}.{key}")
    elif sdk_type in PRIMITIVES:
        if not PRIMITIVES[sdk_type](value):
            refuse(where, f"{value!r} is not of type {sdk_type}")
    elif sdk_type in sdk_models():
        check_model(value, sdk_type, where)
    else:
        for error in k8s_validator(k8s_definition(sdk_type)).iter_errors(value):
            refuse(f"{where}{error.json_path[1:]}", f"{error.message} ({sdk_type})")


def check_model(value: Any, cls: str, where: str) -> None:
    fields, required = sdk_models()[cls]
    if not isinstance(value, dict):
        refuse(where, f"{value!r} is not an object ({cls})")
    for key in value:
        if key not in fields:
            refuse(where, f"'{key}' was unexpected: {cls} has no such field")
    for key in sorted(required | {field for owner, field in CRD_REQUIRED if owner == cls}):
        if key not in value:
            refuse(where, f"'{key}' is a required property of {cls}")
    for key, item in value.items():
        check(item, fields[key], f"{where}.{key}")
        for error in jsonschema.Draft202012Validator(CRD_RULES.get((cls, key), {})).iter_errors(item):
            refuse(f"{where}.{key}", error.message)


def validate(doc: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError where the API server would refuse `doc`: KServe must serve its
    kind at its apiVersion, and all of it must be of that kind's type."""
    group, _, version = str(doc.get("apiVersion")).rpartition("/")
    cls = f"{version.capitalize()}{doc.get('kind')}"  # as V1beta1InferenceService
    if group != sdk_group() or cls not in sdk_models():
        refuse(str(doc.get("kind")), f"KServe serves no such kind at {doc.get('apiVersion')}")
    if not {"name", "generateName"} & set(doc.get("metadata") or ()):
        refuse(cls, "an object needs metadata.name (or generateName)")  # the API server's rule
    refuse_nulls(doc, doc["kind"])
    check_model(doc, cls, doc["kind"])


def refuse_nulls(node: Any, where: str) -> None:
    """No field of KServe's CRDs is nullable (kubernetes-validate's schemas let some be null)."""
    if node is None:
        refuse(where, "null, and no field here is nullable")
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, item in children:
        refuse_nulls(item, f"{where}.{key}")


@pytest.mark.parametrize("path", [RUNTIME_FILE, ISVC_FILE], ids=lambda p: p.name)
def test_manifest_passes_kserve_strict_schema(path: Path) -> None:
    validate(load(path))


def test_the_rules_stated_here_are_on_fields_of_the_sdk() -> None:
    """Each rule above is on a field the SDK's class has (else it would check nothing)."""
    models = sdk_models()
    for cls, field in [*CRD_RULES, *CRD_REQUIRED]:
        assert field in models[cls][0], (cls, field)
    assert models["V1alpha1ServingRuntimeSpec"][1] == {"containers"}  # required fields are read


def _parent(doc: dict, path: str) -> tuple[Any, str]:
    """The node holding the dotted `path`'s last key (list indexes are numbers), and that key."""
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node, last


def _set(doc: dict, path: str, value: Any) -> None:
    node, key = _parent(doc, path)
    node[key] = value


def _rename(doc: dict, path: str, new: str) -> None:
    node, key = _parent(doc, path)
    node[new] = node.pop(key)


TYPOS = [
    # (file, path of the field renamed, its misspelling)
    (RUNTIME_FILE, "spec.protocolVersions", "protocolVersion"),
    (RUNTIME_FILE, "spec.supportedModelFormats.0.autoSelect", "autoselect"),
    (RUNTIME_FILE, "spec.containers.0.ports", "port"),
    (RUNTIME_FILE, "spec.containers.0.securityContext.runAsNonRoot", "runAsNonroot"),
    (RUNTIME_FILE, "spec.containers.0.readinessProbe.httpGet.path", "paths"),
    (RUNTIME_FILE, "metadata.annotations", "annotation"),
    (ISVC_FILE, "spec.predictor.model.storageUri", "storageURI"),
    (ISVC_FILE, "spec.predictor.model.modelFormat", "modelformat"),
    (ISVC_FILE, "spec.predictor.model.protocolVersion", "protocol"),
]


@pytest.mark.parametrize(("path", "field", "typo"), TYPOS, ids=lambda v: getattr(v, "name", v))
def test_misspelt_field_is_refused(path: Path, field: str, typo: str) -> None:
    doc = copy.deepcopy(load(path))
    _rename(doc, field, typo)
    with pytest.raises(jsonschema.ValidationError, match=rf"'{typo}' was unexpected"):
        validate(doc)


def _annotate(doc: dict, key: str, value: Any) -> None:
    doc["spec"]["annotations"][key] = value


ILL_TYPED = {
    "priority below 1": lambda doc: _set(doc, "spec.supportedModelFormats.1.priority", 0),
    "port as a string": lambda doc: _set(doc, "spec.containers.0.ports.0.containerPort", "8080"),
    "annotation not a string": lambda doc: _annotate(doc, "prometheus.kserve.io/port", 8002),
    "args not a list": lambda doc: _set(doc, "spec.containers.0.args", "serve"),
    "autoSelect as a string": lambda doc: _set(doc, "spec.supportedModelFormats.0.autoSelect", "true"),
    "memory not a quantity": lambda doc: _set(doc, "spec.containers.0.resources.limits.memory", "2 GiB"),
    "a null": lambda doc: _set(doc, "spec.containers.0.readinessProbe.periodSeconds", None),
    "a version KServe does not serve": lambda doc: _set(doc, "apiVersion", "serving.kserve.io/v1beta1"),
}


@pytest.mark.parametrize("mutate", ILL_TYPED.values(), ids=ILL_TYPED.keys())
def test_ill_typed_value_is_refused(mutate) -> None:
    doc = copy.deepcopy(load(RUNTIME_FILE))
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


MISSING = [  # (file, a field left out) required by: the SDK, a rule above, Kubernetes, the API server
    (RUNTIME_FILE, "spec.containers"),
    (RUNTIME_FILE, "spec.supportedModelFormats.0.name"),
    (RUNTIME_FILE, "spec.containers.0.name"),
    (RUNTIME_FILE, "metadata.name"),
    (ISVC_FILE, "spec.predictor"),
    (ISVC_FILE, "spec.predictor.model.modelFormat.name"),
]


@pytest.mark.parametrize(("path", "field"), MISSING, ids=lambda v: getattr(v, "name", v))
def test_missing_required_field_is_refused(path: Path, field: str) -> None:
    doc = copy.deepcopy(load(path))
    node, key = _parent(doc, field)
    del node[key]
    with pytest.raises(jsonschema.ValidationError, match=rf"'{key}' is a required property|needs metadata"):
        validate(doc)


# Positive controls beside KServe's runtimes (below): our manifests with more fields, of each kind there
# is (the SDK's primitive, list, map and class types, Kubernetes' types within them, quantities, fields
# under the rules above). Strictness refuses nothing valid.
WORKER = {
    "name": "worker-container",
    "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    "livenessProbe": {"grpc": {"port": 8001}, "timeoutSeconds": 2},
    "resources": {"limits": {"nvidia.com/gpu": 1, "memory": 2**31, "cpu": "500m"}},
}
MORE_RUNTIME_SPEC = {
    "multiModel": False,
    "grpcDataEndpoint": "port:8001",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
    "builtInAdapter": {"serverType": "triton", "runtimeManagementPort": 8001},
    "storageHelper": {"disabled": True},
    "workerSpec": {"pipelineParallelSize": 2, "containers": [WORKER]},
}
MORE_PREDICTOR = {
    "minReplicas": 1,
    "scaleMetric": "rps",
    "logger": {"mode": "all"},
    "overhead": {"cpu": "1e-1"},
}


def test_more_fields_pass_the_strict_schema() -> None:
    runtime, isvc = load(RUNTIME_FILE), load(ISVC_FILE)
    runtime["spec"] |= MORE_RUNTIME_SPEC
    isvc["spec"]["predictor"] |= MORE_PREDICTOR
    validate(runtime)
    validate(isvc)


# -------------------------------------------------------------------------- KServe's rules, not schemas
#
# KServe's ClusterServingRuntime admission webhook (Go, pkg/webhook/admission/servingruntime at v0.20.0)
# cannot run here. Its priority rules are read below, function for function, as these facts state them:
# - validateModelFormatPrioritySame: within one runtime, a model format auto-selected more than once must
#   not carry two different priorities (a format without a priority agrees with any);
# - validateServingRuntimePriority: two runtimes alike in multiModel, the other one not disabled and not
#   the same runtime, that share a protocol version, must not give the same priority to an auto-selected
#   format of the same name (compared without case) and version;
# - ClusterServingRuntimeValidator.Handle applies both to a runtime that is not disabled, against each
#   other runtime, and refuses with these messages (Go format strings, %s each):
WEBHOOK_MESSAGES = {
    "InvalidPriorityError": "same priority assigned for the model format %s",
    "InvalidPriorityClusterServingRuntimeError": "%s in the clusterservingruntimes %s and %s",
    "ProrityIsNotSameError": "different priorities assigned for the model format %s",
    "ProrityIsNotSameClusterServingRuntimeError": "%s under the clusterservingruntime %s",
}


def runtime(name: str, formats: list[dict], protocols=("v2",), multi_model=False, disabled=False) -> dict:
    spec = {"supportedModelFormats": formats, "protocolVersions": list(protocols), "multiModel": multi_model}
    if disabled:
        spec["disabled"] = True
    return {"metadata": {"name": name}, "spec": spec}


def fmt(name: str, priority: int | None = None, version: str | None = None, auto: bool = True) -> dict:
    found: dict[str, Any] = {"name": name, "autoSelect": auto}
    if priority is not None:
        found["priority"] = priority
    if version is not None:
        found["version"] = version
    return found


# (new runtime, existing runtime, the verdict): each rule's conditions, one at a time, both ways
TAKEN = WEBHOOK_MESSAGES["InvalidPriorityError"] % "sklearn"
NEW = runtime("a", [fmt("sklearn", 1)])
PRIORITY_SCENARIOS = {
    "same priority, same format": (NEW, runtime("b", [fmt("sklearn", 1)]), TAKEN),
    "names compared without case": (NEW, runtime("b", [fmt("SKLearn", 1)]), TAKEN),
    "other priorities": (NEW, runtime("b", [fmt("sklearn", 2)]), None),
    "a priority missing": (NEW, runtime("b", [fmt("sklearn")]), None),
    "other versions": (runtime("a", [fmt("sklearn", 1, "1")]), runtime("b", [fmt("sklearn", 1, "2")]), None),
    "not auto-selected": (NEW, runtime("b", [fmt("sklearn", 1, auto=False)]), None),
    "no protocol in common": (NEW, runtime("b", [fmt("sklearn", 1)], protocols=("v1",)), None),
    "multiModel differs": (NEW, runtime("b", [fmt("sklearn", 1)], multi_model=True), None),
    "the other disabled": (NEW, runtime("b", [fmt("sklearn", 1)], disabled=True), None),
    "the same runtime": (NEW, runtime("a", [fmt("sklearn", 1)]), None),
}  # fmt: skip
DIFFER = WEBHOOK_MESSAGES["ProrityIsNotSameError"] % "sklearn"
SAME_PRIORITY_SCENARIOS = {
    "two priorities": ([fmt("sklearn", 1), fmt("sklearn", 2)], DIFFER),
    "one priority twice": ([fmt("sklearn", 1), fmt("sklearn", 1)], None),
    "one without": ([fmt("sklearn", 1), fmt("sklearn")], None),
    "one not auto-selected": ([fmt("sklearn", 1), fmt("sklearn", 2, auto=False)], None),
    "two formats": ([fmt("sklearn", 1), fmt("xgboost", 2)], None),
}


def _auto_select(fmt: dict) -> bool:
    return bool(fmt.get("autoSelect"))


def _same_format(a: dict, b: dict) -> bool:  # areSupportedModelFormatsEqual
    return a["name"].lower() == b["name"].lower() and a.get("version") == b.get("version")


def priorities_differ(spec: dict) -> str | None:
    """validateModelFormatPrioritySame: one format, auto-selected twice, with two priorities."""
    seen: dict[str, int | None] = {}
    for fmt in spec.get("supportedModelFormats") or ():
        if not _auto_select(fmt):
            continue
        if fmt["name"] not in seen:
            seen[fmt["name"]] = fmt.get("priority")
        elif None not in (seen[fmt["name"]], fmt.get("priority")) and seen[fmt["name"]] != fmt["priority"]:
            return WEBHOOK_MESSAGES["ProrityIsNotSameError"] % fmt["name"]
    return None


def priority_taken(new_spec: dict, existing_spec: dict, new_name: str, existing_name: str) -> str | None:
    """validateServingRuntimePriority: an auto-selected format of both runtimes (same name, same version)
    with the same priority, where both serve a protocol in common and are alike in multiModel."""
    if (
        bool(new_spec.get("multiModel")) != bool(existing_spec.get("multiModel"))
        or existing_spec.get("disabled")
        or new_name == existing_name
    ):
        return None
    if not set(existing_spec.get("protocolVersions") or ()) & set(new_spec.get("protocolVersions") or ()):
        return None
    for theirs in existing_spec.get("supportedModelFormats") or ():
        for ours in new_spec.get("supportedModelFormats") or ():
            if (
                _auto_select(theirs)
                and _auto_select(ours)
                and _same_format(theirs, ours)
                and None not in (theirs.get("priority"), ours.get("priority"))
                and theirs["priority"] == ours["priority"]
            ):
                return WEBHOOK_MESSAGES["InvalidPriorityError"] % ours["name"]
    return None


def admission_denied(new: dict, existing: list[dict]) -> str | None:
    """ClusterServingRuntimeValidator.Handle's priority checks on `new` among `existing` (its other
    checks, of workerSpec and blocked env vars, concern fields our runtime does not set): the denial."""
    spec, name = new["spec"], new["metadata"]["name"]
    if spec.get("disabled"):
        return None
    for other in existing:
        error = priorities_differ(spec)
        if error:
            return WEBHOOK_MESSAGES["ProrityIsNotSameClusterServingRuntimeError"] % (error, name)
        error = priority_taken(spec, other["spec"], name, other["metadata"]["name"])
        if error:
            form = WEBHOOK_MESSAGES["InvalidPriorityClusterServingRuntimeError"]
            return form % (error, other["metadata"]["name"], name)
    return None


@pytest.mark.parametrize("name", PRIORITY_SCENARIOS)
def test_priority_rule(name: str) -> None:
    new, existing, expected = PRIORITY_SCENARIOS[name]
    got = priority_taken(new["spec"], existing["spec"], new["metadata"]["name"], existing["metadata"]["name"])
    assert got == expected


@pytest.mark.parametrize("name", SAME_PRIORITY_SCENARIOS)
def test_one_priority_per_format(name: str) -> None:
    formats, expected = SAME_PRIORITY_SCENARIOS[name]
    assert priorities_differ({"supportedModelFormats": formats}) == expected


# ---------------------------------------------------------------------------------- KServe's runtimes
#
# KServe v0.20.0's ClusterServingRuntimes (config/runtimes/*.yaml), as the priority rules see them: the
# protocols each serves, and the formats it auto-selects, as name:version@priority (no @: no priority).
# Formats listed without autoSelect are left out (the rules skip them: Triton's pytorch "1", the three
# of kserve-predictiveserver); none of these runtimes is multiModel or disabled.
KSERVE_RUNTIMES = {
    "kserve-autogluonserver": ("v1 v2", "autogluon:1@1"),
    "kserve-huggingfaceserver": ("v1 v2", "huggingface:1@1"),
    "kserve-huggingfaceserver-multinode": ("v1 v2", "huggingface:1@2"),
    "kserve-lgbserver": ("v1 v2", "lightgbm:4@1"),
    "kserve-mlserver": ("v2", "sklearn:0@2 sklearn:1@2 xgboost:1@2 xgboost:2@2 lightgbm:3@2 lightgbm:4@2 "
                       "mlflow:1@1 mlflow:2@1"),
    "kserve-openvino": ("v1 v2 grpc-v2", "openvino:10@1 onnx:1@2 tensorflow:1@3 huggingface"),
    "kserve-paddleserver": ("v1 v2", "paddle:2@1"),
    "kserve-pmmlserver": ("v1 v2", "pmml:3@1 pmml:4@1"),
    "kserve-predictiveserver": ("v1 v2", ""),
    "kserve-sklearnserver": ("v1 v2", "sklearn:1@1"),
    "kserve-tensorflow-serving": ("v1 grpc-v1", "tensorflow:1@2 tensorflow:2@2"),
    "kserve-torchserve": ("v1 v2 grpc-v2", "pytorch:1@2"),
    "kserve-tritonserver": ("v2 grpc-v2", "tensorrt:8@1 tensorflow:1@1 tensorflow:2@1 onnx:1@1 triton:2@1"),
    "kserve-vllmserver": ("", "vLLM:1@1"),  # it names no protocolVersions
    "kserve-xgbserver": ("v1 v2", "xgboost:2@1"),
}  # fmt: skip
# kserve-tritonserver's container: uid 1000 (Triton's non-root user), non-root, no privilege escalation,
# not privileged, every capability dropped; 1 CPU and 2Gi of memory, requested and as its limit.
TRITON_SECURITY = {"runAsUser": 1000, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
                   "privileged": False, "capabilities": {"drop": ["ALL"]}}  # fmt: skip
TRITON_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}


def kserve_runtime(name: str) -> dict[str, Any]:
    """One of KServe's runtimes, a ClusterServingRuntime made of the facts above."""
    protocols, formats = KSERVE_RUNTIMES[name]
    specs = [re.fullmatch(r"(\w+)(?::(\w+))?(?:@(\d+))?", spec).groups() for spec in formats.split()]
    doc = runtime(
        name, [fmt(n, priority and int(priority), v) for n, v, priority in specs], protocols.split()
    )
    container = {"name": "kserve-container"}
    if name == "kserve-tritonserver":
        container |= {"securityContext": TRITON_SECURITY, "resources": TRITON_RESOURCES}
    doc["spec"]["containers"] = [container]
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ClusterServingRuntime"} | doc


@pytest.mark.parametrize("name", KSERVE_RUNTIMES)
def test_kserve_runtimes_pass_the_strict_schema(name: str) -> None:
    """Positive control: KServe's own runtimes, as the facts above state them, pass."""
    validate(kserve_runtime(name))


def test_runtime_is_admitted_beside_kserve_runtimes() -> None:
    runtime = load(RUNTIME_FILE)
    kserve = [kserve_runtime(name) for name in KSERVE_RUNTIMES]
    assert admission_denied(runtime, kserve) is None
    # ... and the check can fail: Triton's own priority for triton would be refused, in KServe's words.
    clash = copy.deepcopy(runtime)
    (triton,) = [f for f in clash["spec"]["supportedModelFormats"] if f["name"] == "triton"]
    triton["priority"] = 1
    assert admission_denied(clash, kserve) == (
        "same priority assigned for the model format triton in the clusterservingruntimes "
        "kserve-tritonserver and tensorgate"
    )


def test_supported_formats_are_ones_the_server_runs() -> None:
    """Each format the runtime claims is one we serve: a Triton repository of our backends, or a backend
    of ours by name (no tensorrt or tensorflow: we cannot load those)."""
    from tensorgate.server.backends import SUPPORTED

    backend_of = {"python": "python", "pytorch": "pytorch", "onnx": "onnxruntime"}
    for fmt in load(RUNTIME_FILE)["spec"]["supportedModelFormats"]:
        assert fmt["name"] == "triton" or backend_of.get(fmt["name"]) in SUPPORTED, fmt


def test_inference_service_gets_the_runtime() -> None:
    """KServe's checks for an InferenceService naming its runtime (predictor.go: the protocol and the
    format must be the runtime's)."""
    runtime, isvc = load(RUNTIME_FILE), load(ISVC_FILE)
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] == "tensorgate"
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    wanted = model["modelFormat"]
    formats = runtime["spec"]["supportedModelFormats"]
    assert any(
        f["name"] == wanted["name"] and wanted.get("version") in (None, f.get("version")) for f in formats
    )
    assert model["storageUri"].split("://")[0] in ("gs", "s3")


# ----------------------------------------------------------------------------- the container and our CLI


def kserve_container() -> dict[str, Any]:
    (container,) = load(RUNTIME_FILE)["spec"]["containers"]
    assert container["name"] == "kserve-container"  # the name KServe merges the predictor's fields into
    return container


def test_container_agrees_with_its_args() -> None:
    runtime = load(RUNTIME_FILE)
    container = kserve_container()
    args = container["args"]
    assert args[0] == "serve"
    flags = [arg.partition("=")[0] for arg in args[1:]]
    assert set(LOCAL_VALUES) <= set(flags), "each of these flags given once, as --flag=value"
    assert len(flags) == len(set(flags))
    parsed = build_parser().parse_args(args[1:])  # `tensorgate serve`'s arguments
    # where KServe's storage initializer writes
    assert [str(p) for p in parsed.model_repository] == ["/mnt/models"]

    (port,) = container["ports"]  # KServe and Knative route to the first (Knative: the only) port
    assert port["containerPort"] == parsed.http_port
    assert port["name"] == "h2c", "REST and gRPC share the port: HTTP/2 cleartext to it"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": parsed.http_port}
    assert parsed.grpc_port not in (parsed.http_port, parsed.metrics_port)  # separate sockets

    annotations = runtime["spec"]["annotations"]
    assert parsed.allow_metrics
    assert annotations["prometheus.kserve.io/port"] == str(parsed.metrics_port)
    assert annotations["prometheus.kserve.io/path"] == "/metrics"

    # KServe adds this for a Triton-type runtime when the InferenceService has no storageUri.
    assert runtime["metadata"]["annotations"]["serving.kserve.io/server-type"] == "tritonserver"
    assert (
        build_parser().parse_args([*args[1:], "--model-control-mode=explicit"]).model_control_mode
        == "explicit"
    )


def test_container_security_as_kserve_triton() -> None:
    ours = kserve_container()
    assert ours["securityContext"] == TRITON_SECURITY
    assert ours["resources"] == TRITON_RESOURCES


class RuntimeServer(ServerProcess):
    """The runtime's own argv, with local paths and free ports, on loopback."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        super().__init__(EXAMPLES, log_path)
        self.args = args

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "tensorgate.server", *self.args]


def local_args(args: list[str]) -> list[str]:
    out = []
    for arg in args:
        flag, eq, _ = arg.partition("=")
        out.append(f"{flag}={LOCAL_VALUES[flag]}" if eq and flag in LOCAL_VALUES else arg)
    return [*out, "--host=127.0.0.1"]


def test_container_args_serve_rest_h2c_grpc_and_metrics(tmp_path: Path) -> None:
    container = kserve_container()
    server = RuntimeServer(local_args(container["args"]), tmp_path / "server.log")
    try:
        server.start()
        probe = container["readinessProbe"]["httpGet"]["path"]
        for version in ("http1", "http2"):  # what kubelet sends; what a proxy sends to an h2c port
            with make_client(server.base_url, version) as client:
                assert client.get(probe).status_code == 200
                assert client.get("/v2/health/live").status_code == 200
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # gRPC on the same port
            health = health_pb2_grpc.HealthStub(channel)
            answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert server.metrics_port is not None
        with make_client(f"http://127.0.0.1:{server.metrics_port}", "http1") as client:
            metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert "nv_inference_request_success" in metrics.text
    finally:
        code = server.stop(signal.SIGTERM) if server.proc is not None else None
    assert code == 0, server.log_text()
