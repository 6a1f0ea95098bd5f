"""deploy/: the images and the Kubernetes manifests, checked offline.

The kustomizations render (with `kubectl kustomize` where kubectl is installed, else with the small
renderer below, which applies what our kustomizations use); every core object validates strictly against
Kubernetes' schemas; the ports, probes, preStop and metrics the manifests name are what the server,
started with the manifests' own flags, serves; the images' command and HEALTHCHECK run against the example
repository; yamllint passes. Kubernetes itself and a container daemon are not here: nothing is applied
or built.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import kubernetes_validate
import pytest
import yaml
from e2e_helpers import ServerProcess, need_program
from grpc_health.v1 import health_pb2, health_pb2_grpc
from yamllint import linter
from yamllint.config import YamlLintConfig

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
EXAMPLES = ROOT / "examples" / "model_repository"
KUBERNETES_VERSION = "1.33.0"  # a current minor; the objects use nothing newer than 1.27 (gRPC probes)
CORE_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap"}


# ------------------------------------------------------------------------------------------- rendering


def render(kustomization_dir: Path) -> list[dict]:
    """The objects a kustomization renders to: kubectl's rendering where kubectl is installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        done = subprocess.run(
            [kubectl, "kustomize", str(kustomization_dir)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [o for o in yaml.safe_load_all(done.stdout) if o]
    return own_render(kustomization_dir)


def own_render(directory: Path) -> list[dict]:
    """What our kustomizations use of kustomize: resources, components, labels (selectors included),
    images' newTag, and JSON patches of add / replace on targets by kind and name."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for resource in spec.get("resources", []):
        path = directory / resource
        objects += (
            own_render(path) if path.is_dir() else [o for o in yaml.safe_load_all(path.read_text()) if o]
        )
    for component in spec.get("components", []):
        component_spec = yaml.safe_load((directory / component / "kustomization.yaml").read_text())
        _patch(objects, component_spec.get("patches", []))
    for entry in spec.get("labels", []):
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
            if entry.get("includeSelectors"):
                _label_selectors(obj, entry["pairs"])
    for image in spec.get("images", []):
        for container in _containers(objects):
            name, _, _ = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{name}:{image['newTag']}"
    _patch(objects, spec.get("patches", []))
    return objects


def _label_selectors(obj: dict, pairs: dict) -> None:
    spec = obj.get("spec", {})
    if obj["kind"] == "Service":
        spec.setdefault("selector", {}).update(pairs)
    elif "selector" in spec:
        spec["selector"].setdefault("matchLabels", {}).update(pairs)
    if "template" in spec:
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _patch(objects: list[dict], patches: list[dict]) -> None:
    for patch in patches:
        target = patch["target"]
        for obj in objects:
            if obj["kind"] == target["kind"] and obj["metadata"]["name"] == target["name"]:
                for op in yaml.safe_load(patch["patch"]):
                    assert op["op"] in ("add", "replace"), f"the test's renderer lacks {op['op']}"
                    *parents, last = op["path"].strip("/").split("/")
                    node = obj
                    for key in parents:
                        node = node[int(key)] if isinstance(node, list) else node[key]
                    node[last] = copy.deepcopy(op["value"])


def _containers(objects: list[dict]) -> list[dict]:
    return [
        c for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]
    ]


def one(objects: list[dict], kind: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind]
    return found


def container(objects: list[dict]) -> dict:
    [found] = _containers(objects)
    return found


def flags(args: list[str]) -> dict[str, str]:
    """`--name=value` arguments by name (every flag our manifests pass is written so)."""
    assert args[0] == "serve"
    found = {}
    for arg in args[1:]:
        name, equals, value = arg.partition("=")
        assert name.startswith("--") and equals, f"write {arg!r} as --flag=value"
        found[name] = value
    return found


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return render(K8S / "base")


@pytest.fixture(scope="module")
def gpu() -> list[dict]:
    return render(K8S / "overlays" / "gpu")


# ---------------------------------------------------------------------------------------------- schemas


def test_every_core_object_validates_strictly_against_the_kubernetes_schemas(base, gpu) -> None:
    rendered = {"base": base, "gpu": gpu, "grpc-probes": render(K8S / "overlays" / "grpc-probes")}
    for name, objects in rendered.items():
        assert {o["kind"] for o in objects} >= CORE_KINDS, name
        for obj in objects:
            if obj["kind"] in CORE_KINDS:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert {o["kind"] for o in objects} - CORE_KINDS == {"ServiceMonitor"}  # a CRD's: checked below


def test_the_strict_validation_refuses_a_misspelt_field(base) -> None:
    """The check above can fail: an unknown field in a probe is refused, as the API server's strict
    field validation refuses it."""
    deployment = copy.deepcopy(one(base, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_object_is_labelled_and_selected_by_the_same_name(base) -> None:
    deployment, service = one(base, "Deployment"), one(base, "Service")
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(o["metadata"]["labels"]["app.kubernetes.io/name"] == "tensorgate" for o in base)
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"],
        one(base, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pods.items()
    assert (
        one(base, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"]
        == deployment["metadata"]["name"]
    )
    monitor = one(base, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


# ------------------------------------------------------------------------------- manifests vs the server


def test_ports_and_service_match_the_servers_flags(base) -> None:
    main = container(base)
    given = flags(main["args"])
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {
        "http": int(given["--http-port"]),
        "grpc": int(given["--grpc-port"]),
        "metrics": int(given["--metrics-port"]),
    }
    service_ports = {p["name"]: p for p in one(base, "Service")["spec"]["ports"]}
    assert {p["targetPort"] for p in service_ports.values()} == set(ports)
    assert service_ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    assert [m["mountPath"] for m in main["volumeMounts"]] == [given["--model-repository"]]


def test_the_drain_fits_in_the_termination_grace_period(base) -> None:
    pod = one(base, "Deployment")["spec"]["template"]["spec"]
    pre_stop = " ".join(container(base)["lifecycle"]["preStop"]["exec"]["command"])
    [sleep] = re.findall(r"time\.sleep\((\d+)\)", pre_stop)
    graceful = int(flags(container(base)["args"])["--graceful-timeout"])
    assert pod["terminationGracePeriodSeconds"] > int(sleep) + graceful


def test_the_gpu_overlay_asks_for_one_gpu_on_the_cuda_image(gpu) -> None:
    main = container(gpu)
    assert main["image"] == "tensorgate:cuda"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert main["resources"]["requests"]["nvidia.com/gpu"] == 1


def test_the_server_started_with_the_manifests_flags_serves_their_probes_metrics_and_prestop(
    base, tmp_path
) -> None:
    """The Deployment's own args (ports 0, the example repository): every probe path answers 200 once the
    models are in, gRPC health answers SERVING (the grpc-probes component), /metrics has the counters the
    HPA's rule reads, and the preStop's request takes the server out of rotation."""
    main = container(base)
    args = [a for a in main["args"][1:] if not a.startswith(("--http-port", "--grpc-port", "--metrics-port"))]
    args = [f"--model-repository={EXAMPLES}" if a.startswith("--model-repository") else a for a in args]
    server = ServerProcess(EXAMPLES, tmp_path / "server.log", extra_args=tuple(args)).start()
    try:
        with httpx.Client(base_url=server.base_url, timeout=10) as client:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                path = main[probe]["httpGet"]["path"]
                assert client.get(path).status_code == 200, (probe, path)
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                service = render_probe_service()
                check = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=10
                )
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            client.post("/v2/models/simple/infer", json=simple_request()).raise_for_status()
            metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
            rule = one(base, "ConfigMap")["data"]["rules.yaml"]
            for counter in set(re.findall(r"\bnv_[a-z_]+", rule)):
                assert re.search(rf"^{counter}\{{", metrics, re.M), f"{counter} is not exported"
            pre_stop = main["lifecycle"]["preStop"]["exec"]["command"]
            assert pre_stop[:2] == ["python", "-c"]
            code = pre_stop[2].replace("time.sleep(10)", "None").replace(":8000/", f":{server.port}/")
            subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
            assert client.get(main["readinessProbe"]["httpGet"]["path"]).status_code != 200
            assert client.get(main["livenessProbe"]["httpGet"]["path"]).status_code == 200
    finally:
        assert server.stop() == 0


def render_probe_service() -> str:
    """The gRPC health service the grpc-probes component's readiness probe asks for."""
    probe = container(render(K8S / "overlays" / "grpc-probes"))["readinessProbe"]["grpc"]
    assert probe["port"] == int(flags(container(render(K8S / "base"))["args"])["--grpc-port"])
    return probe["service"]


def simple_request() -> dict:
    tensor = {"datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
    return {"inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}]}


# --------------------------------------------------------------------------------------------- images


def dockerfile_instructions(path: Path) -> dict[str, list[str]]:
    """Instruction -> its arguments (the last of each, as Docker keeps it), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.setdefault(word.upper(), []).append(rest.strip())
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_the_images_command_and_healthcheck_run_against_the_example_repository(dockerfile, tmp_path) -> None:
    instructions = dockerfile_instructions(DEPLOY / dockerfile)
    entrypoint, command = json.loads(instructions["ENTRYPOINT"][-1]), json.loads(instructions["CMD"][-1])
    assert entrypoint == ["tensorgate"]  # the console script pyproject.toml installs
    assert instructions["USER"][-1] == "1000:1000" and instructions["STOPSIGNAL"][-1] == "SIGTERM"
    argv = iter(command[1:])
    given = {name: next(argv) for name in argv}
    assert command[0] == "serve" and given["--model-repository"] == "/models"
    assert {int(given[f"--{p}-port"]) for p in ("http", "grpc", "metrics")} == {
        int(p) for p in instructions["EXPOSE"][-1].split()
    }
    args = [
        a
        for n, v in given.items()
        if n not in ("--http-port", "--grpc-port", "--metrics-port")
        for a in (n, v)
    ]
    args[args.index("--model-repository") + 1] = str(EXAMPLES)
    server = ServerProcess(EXAMPLES, tmp_path / "server.log", extra_args=tuple(args)).start()
    try:
        _, _, exec_form = instructions["HEALTHCHECK"][-1].partition(" CMD ")
        probe = json.loads(exec_form)
        probe = [part.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}") for part in probe]
        assert probe[0] == "python"
        assert subprocess.run([sys.executable, *probe[1:]], timeout=30).returncode == 0
        server.send_signal(signal.SIGTERM)  # the STOPSIGNAL: a clean exit
        assert server.wait() == 0
    finally:
        if server.running:
            server.kill()


def test_the_images_copy_every_package_the_wheel_ships() -> None:
    """The images build the wheel from the folders they copy: each of setup.py's PACKAGES must be there."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    (packages,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PACKAGES"
    ]
    assert "server" in packages and "perf" in packages
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        copied = {c.split()[0] for c in dockerfile_instructions(DEPLOY / dockerfile)["COPY"] if c[:2] != "--"}
        assert set(packages) <= copied, (dockerfile, set(packages) - copied)


def test_dockerignore_keeps_what_the_images_copy() -> None:
    ignored = {line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"}
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        for copied in dockerfile_instructions(DEPLOY / dockerfile).get("COPY", []):
            if copied.startswith("--from="):
                continue  # from a build stage, not the context
            sources = [s for s in copied.split()[:-1] if not s.startswith("--")]
            for source in sources:
                assert source not in ignored and source.split("/")[0] not in ignored, (dockerfile, source)
                assert (ROOT / source).exists(), (dockerfile, source)


# --------------------------------------------------------------------------------------------- yamllint


def test_yamllint_passes_on_every_manifest() -> None:
    config = YamlLintConfig(file=str(DEPLOY / ".yamllint.yaml"))
    files = list(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 10
    problems = [
        f"{path.relative_to(ROOT)}:{p.line}: {p.message}"
        for path in files
        for p in linter.run(path.read_text(), config, str(path))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kustomization", ["base", "overlays/gpu", "overlays/grpc-probes"])
def test_the_fallback_renderer_renders_what_kubectl_does(kustomization: str) -> None:
    need_program("kubectl", "the fallback renderer is compared with kubectl kustomize")

    def by_name(objects: list[dict]) -> dict:
        return {(o["kind"], o["metadata"]["name"]): o for o in objects}

    assert by_name(own_render(K8S / kustomization)) == by_name(render(K8S / kustomization))
