"""deploy/kserve: the ClusterServingRuntime and the InferenceService example, checked offline against
KServe's own CRD schemas (vendored in deploy/kserve/crds/, made strict as an API server's strict field
validation is), KServe's admission rules on runtime priorities (stated and read here, each condition
checked both ways), and our CLI: the runtime's
container args start a real server on the example repository, which answers REST, h2c and gRPC on its
one port."""

from __future__ import annotations

import copy
import functools
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import kubernetes_validate
import pytest
import yaml
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, make_client
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tensorgate.server.options import build_parser

KSERVE = ROOT / "deploy" / "kserve"
CRDS = KSERVE / "crds"
RUNTIME_FILE = KSERVE / "cluster-serving-runtime.yaml"
ISVC_FILE = KSERVE / "inference-service.yaml"
KSERVE_RUNTIMES = sorted((CRDS / "runtimes").glob("*.yaml"))
CRD_FILES = {
    "ClusterServingRuntime": CRDS / "serving.kserve.io_clusterservingruntimes.yaml",
    "InferenceService": CRDS / "serving.kserve.io_inferenceservices.yaml",
}
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the InferenceService CRD is 1.9 MB
# The runtime's flags that name places on the pod, and what they become for a local run.
LOCAL_VALUES = {
    "--model-repository": str(EXAMPLES),
    "--http-port": "0",
    "--grpc-port": "0",
    "--metrics-port": "0",
}


def load(path: Path) -> dict[str, Any]:
    with open(path) as f:
        docs = [doc for doc in yaml.load_all(f, Loader=LOADER) if doc]
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


# ----------------------------------------------------------------------------------------------- schemas


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CRD's structural schema in which every object that lists its `properties`, and says
    nothing of other fields (no `additionalProperties`, no `x-kubernetes-preserve-unknown-fields`),
    refuses fields it does not list: what the API server's strict field validation does, where a plain
    JSON Schema reading would let them through. allOf/anyOf/oneOf/not are left as they are: in a
    structural schema they only add value checks, the fields being declared outside them."""
    node = dict(schema)
    if "properties" in node:
        node["properties"] = {name: strict(sub) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    if isinstance(node.get("items"), dict):
        node["items"] = strict(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict(node["additionalProperties"])
    return node


@functools.cache
def crd_validator(kind: str) -> tuple[str, jsonschema.Draft202012Validator]:
    """(apiVersion, validator of the strict schema) of the CRD's served storage version."""
    crd = load(CRD_FILES[kind])
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    schema = strict(version["schema"]["openAPIV3Schema"])
    return f"{crd['spec']['group']}/{version['name']}", jsonschema.Draft202012Validator(schema)


def validate(doc: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError (kubernetes_validate's is one) where the API server would refuse
    `doc`: its kind's CRD schema for the body, Kubernetes' own ObjectMeta schema (strict) for metadata,
    which the CRD leaves open."""
    api_version, validator = crd_validator(doc["kind"])
    assert doc["apiVersion"] == api_version, f"{doc['kind']} is served as {api_version}"
    validator.validate(doc)
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}
    kubernetes_validate.validate(carrier, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("path", [RUNTIME_FILE, ISVC_FILE], ids=lambda p: p.name)
def test_manifest_passes_kserve_strict_schema(path: Path) -> None:
    validate(load(path))


@pytest.mark.parametrize("path", KSERVE_RUNTIMES, ids=lambda p: p.stem)
def test_kserve_own_runtimes_pass_the_strict_schema(path: Path) -> None:
    """The positive control: strictness refuses nothing that KServe itself ships."""
    validate(load(path))


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
}


@pytest.mark.parametrize("mutate", ILL_TYPED.values(), ids=ILL_TYPED.keys())
def test_ill_typed_value_is_refused(mutate) -> None:
    doc = copy.deepcopy(load(RUNTIME_FILE))
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


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


def test_runtime_is_admitted_beside_kserve_runtimes() -> None:
    runtime = load(RUNTIME_FILE)
    kserve = [load(path) for path in KSERVE_RUNTIMES]
    assert "kserve-tritonserver" in {r["metadata"]["name"] for r in kserve}
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
    parsed = build_parser().parse_args(args)
    assert str(parsed.model_repository) == "/mnt/models"  # where KServe's storage initializer writes

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
        build_parser().parse_args([*args, "--model-control-mode=explicit"]).model_control_mode == "explicit"
    )


def test_container_security_as_kserve_triton() -> None:
    (triton,) = load(CRDS / "runtimes" / "kserve-tritonserver.yaml")["spec"]["containers"]
    ours = kserve_container()
    assert ours["securityContext"] == triton["securityContext"]
    assert ours["resources"] == triton["resources"]


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
