"""`tritonserver`: Triton's command line, as Triton's manifests write it (server/tritonserver.py).

The translation of Triton's flags to `tensorgate serve`'s, checked flag by flag against Triton's flag list
as we state it below; then the console script started with the arguments of Triton's Helm charts and of
KServe's Triton runtime, and the flags that make ports optional, bind addresses, name the server, retry a
model's load and set auto-complete's max_batch_size."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from e2e_helpers import EXAMPLES, A, B, need_module, simple_inputs
from grpc_helpers import DIFFS, SUMS, call, outputs, simple_request

import tensorgate.proto.inference as pb
from tensorgate.server.cli import parse_backend_config
from tensorgate.server.options import build_parser
from tensorgate.server.tritonserver import FLAGS, ParseError, markdown_table, translate

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "operations" / "triton-flags.md"

# Triton's command line as its parser (src/command_line_parser.cc) takes it: each flag and
# the kind of value it takes (none: a flag without a value; the structured ones are strings to it).
TRITON_FLAGS = """
help:none id:string exit-timeout-secs:integer
model-store:string model-repository:string exit-on-error:boolean disable-auto-complete-config:none
strict-readiness:boolean model-control-mode:string repository-poll-secs:integer load-model:string
model-config-name:string model-load-thread-count:integer model-load-retry-count:integer
model-namespacing:boolean enable-peer-access:boolean
allow-http:boolean http-address:string http-port:integer reuse-http-port:boolean
http-header-forward-pattern:string http-thread-count:integer http-max-input-size:integer
http-restricted-api:string
allow-grpc:boolean grpc-address:string grpc-port:integer reuse-grpc-port:boolean
grpc-header-forward-pattern:string grpc-infer-thread-count:integer grpc-infer-allocation-pool-size:integer
grpc-max-response-pool-size:integer grpc-use-ssl:boolean grpc-use-ssl-mutual:boolean grpc-server-cert:string
grpc-server-key:string grpc-root-cert:string grpc-infer-response-compression-level:string
grpc-keepalive-time:integer grpc-keepalive-timeout:integer grpc-keepalive-permit-without-calls:boolean
grpc-http2-max-pings-without-data:integer grpc-http2-min-recv-ping-interval-without-data:integer
grpc-http2-max-ping-strikes:integer grpc-max-connection-age:integer grpc-max-connection-age-grace:integer
grpc-restricted-protocol:string
log-verbose:integer log-info:boolean log-warning:boolean log-error:boolean log-format:string log-file:string
allow-sagemaker:boolean sagemaker-port:integer sagemaker-safe-port-range:string sagemaker-thread-count:integer
allow-vertex-ai:boolean vertex-ai-port:integer vertex-ai-thread-count:integer vertex-ai-default-model:string
allow-metrics:boolean allow-gpu-metrics:boolean allow-cpu-metrics:boolean metrics-address:string
metrics-port:integer metrics-interval-ms:float metrics-config:string
trace-config:string cache-config:string cache-directory:string rate-limit:string rate-limit-resource:string
pinned-memory-pool-byte-size:integer cuda-memory-pool-byte-size:string cuda-virtual-address-size:string
min-supported-compute-capability:float buffer-manager-thread-count:integer host-policy:string
model-load-gpu-limit:string allow-client-shm:boolean backend-directory:string backend-config:string
repoagent-directory:string strict-model-config:boolean response-cache-byte-size:integer
trace-file:string trace-level:string trace-rate:integer trace-count:integer trace-log-frequency:integer
"""

# A value of each kind that Triton's parser takes, for the flags that take any text.
SAMPLES = {"none": None, "boolean": "true", "integer": "1", "float": "2000"}
TEXT_SAMPLES = {
    "model-control-mode": "explicit",
    "log-format": "ISO8601",
    "http-restricted-api": "model-repository:admin-key=secret",
    "grpc-restricted-protocol": "model-repository:admin-key=secret",
    "trace-config": "rate=10",
    "trace-level": "TIMESTAMPS",
    "cache-config": "local,size=1048576",
    "rate-limit": "execution_count",
    "rate-limit-resource": "R1:4:0",
    "backend-config": "default-max-batch-size=8",
    "http-header-forward-pattern": "x-.*",
    "grpc-header-forward-pattern": "x-.*",
    "grpc-infer-response-compression-level": "low",
    "metrics-config": "summary_latencies=true",
    "host-policy": "gpu_0,numa-node=0",
    "cuda-memory-pool-byte-size": "0:67108864",
    "cuda-virtual-address-size": "0:1073741824",
    "model-load-gpu-limit": "0:0.5",
    "sagemaker-safe-port-range": "8080-8090",
}


def triton_flags() -> dict[str, str]:
    return dict(entry.split(":") for entry in TRITON_FLAGS.split())


def parse_serve(serve: list[str]) -> object:
    """`tensorgate serve`'s parser on translated arguments (exits 2 on any it does not take)."""
    return build_parser().parse_args(serve)


# ------------------------------------------------------------------------------------------ the table


def test_every_flag_of_tritons_parser_is_in_the_table_with_its_value_kind() -> None:
    assert {name: flag.value for name, flag in FLAGS.items()} == triton_flags()


def serve_flags() -> set[str]:
    """Every flag `tensorgate serve` takes."""
    return {name for action in build_parser()._actions for name in action.option_strings}


def test_no_flag_warns_that_tensorgate_serve_takes() -> None:
    """A flag the table warns about would be honoured if passed on: the table must say so."""
    warned = [name for name, flag in FLAGS.items() if not flag.serve and name != "help"]
    assert [name for name in warned if f"--{name}" in serve_flags()] == []


def test_every_flag_works_or_is_accepted_with_one_warning_naming_what_we_do() -> None:
    for name, kind in triton_flags().items():
        if name == "help":
            continue
        value = SAMPLES[kind] if kind in SAMPLES else TEXT_SAMPLES.get(name, "/tmp/somewhere")
        argv = [f"--{name}"] if value is None else [f"--{name}={value}"]
        serve, warnings = translate(["--model-repository=/models", *argv])
        extra = serve[len(translate(["--model-repository=/models"])[0]) :]
        if warnings:
            assert extra == [], name
            assert len(warnings) == 1 and "\n" not in warnings[0], name
            assert warnings[0].startswith(f"tritonserver: --{name} is accepted and has no effect here: ")
            assert len(warnings[0]) > len(f"tritonserver: --{name} is accepted and has no effect here: ") + 10
        else:
            assert len(extra) == 1, name
            parse_serve(serve)  # tensorgate serve takes it


def test_helm_chart_arguments_translate_to_serve_arguments() -> None:
    serve, warnings = translate(
        [
            "--model-store=/models",
            "--strict-model-config=false",
            "--log-verbose=true",
            "--allow-gpu-metrics=false",
            "--trace-file",
            "/tmp/trace.json",
            "--trace-rate=100",
        ]
    )
    assert serve == [
        "--id=triton",  # Triton's defaults where ours differ
        "--exit-on-error=true",
        "--model-repository=/models",
        "--strict-model-config=false",
        "--log-verbose=1",
        "--allow-gpu-metrics=false",
        "--trace-config=triton,file=/tmp/trace.json",
        "--trace-config=rate=100",
    ]
    assert warnings == []
    args = parse_serve(serve)
    assert args.model_repository == ["/models"] and args.id == "triton" and args.exit_on_error


def test_flags_repeat_take_prefixes_and_tritons_boolean_spellings() -> None:
    serve, _ = translate(
        [
            "--model-repository",
            "/a",
            "--model-store=/b",
            "--model-repo=/c",
            "--allow-grpc=OFF",
            "--log-info=On",
        ]
    )
    args = parse_serve(serve)
    assert args.model_repository == ["/a", "/b", "/c"]
    assert args.allow_grpc is False and args.log_info is True
    for spelling, meaning in (("true", True), ("1", True), ("TRUE", True), ("false", False), ("0", False)):
        assert (
            parse_serve(translate([f"--allow-http={spelling}", "--model-store=/m"])[0]).allow_http is meaning
        )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag=1"], "tritonserver: unrecognized option '--no-such-flag=1'"),
        (["--allow-grpc=maybe"], 'Bad option: "--allow-grpc".\ninvalid value for bool option: maybe'),
        (["--http-port=eighty"], 'Bad option: "--http-port".\nInvalid option value. Got eighty'),
        (["--http-port"], "tritonserver: option '--http-port' requires an argument"),
        (["--grpc"], "tritonserver: option '--grpc' is ambiguous"),
        (["--disable-auto-complete-config=1"], "doesn't allow an argument"),
        (["/models"], "Unexpected argument: /models"),
    ],
)
def test_what_tritons_parser_refuses_is_refused_with_its_words(argv: list[str], message: str) -> None:
    with pytest.raises(ParseError) as refused:
        translate(argv)
    assert message in str(refused.value)


def test_an_unknown_flag_exits_1_with_tritons_usage_and_serves_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tensorgate.server.tritonserver", "--model-store=/m", "--frobnicate=3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "tritonserver: unrecognized option '--frobnicate=3'" in done.stderr
    assert "Usage: tritonserver [options]" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_a_repository_it_exits_1_with_tritons_words() -> None:
    done = subprocess.run(
        [*tritonserver_command(), "--http-port=0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr == "error: creating server: Invalid argument - --model-repository must be specified\n"


def test_help_lists_every_flag_and_what_it_becomes() -> None:
    done = subprocess.run([*tritonserver_command(), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "  --model-store=<string>  ->  --model-repository" in done.stdout
    assert "  --http-thread-count=<integer>  ->  accepted, no effect: " in done.stdout
    listed = [line for line in done.stdout.splitlines() if line.startswith("  --")]
    assert len(listed) == len(FLAGS) - 1  # every flag but --help itself


def test_backend_config_is_read_as_triton_reads_it() -> None:
    assert parse_backend_config(["default-max-batch-size=8", "onnxruntime,default-max-batch-size=2"]) == {
        "": {"default-max-batch-size": "8"},
        "onnxruntime": {"default-max-batch-size": "2"},
    }
    with pytest.raises(ValueError, match="No backend specified"):
        parse_backend_config([",default-max-batch-size=2"])
    with pytest.raises(ValueError, match="option format is '<backend name>,<setting>=<value>'. Got python,x"):
        parse_backend_config(["python,x"])


def test_the_docs_page_is_the_table() -> None:
    text = PAGE.read_text()
    assert markdown_table() in text, "the page is stale: python docs/hooks/triton_flags.py rewrites it"


# ------------------------------------------------------------------------------------------ end to end

PORT_LINE = re.compile(r"(HTTP|gRPC|Metrics) listening on (\S+):(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tritonserver_command() -> list[str]:
    script = Path(sys.executable).with_name("tritonserver")  # the console script, as installed
    return [str(script)] if script.exists() else [sys.executable, "-m", "tensorgate.server.tritonserver"]


class Tritonserver:
    """`tritonserver ARGS` in a process of its own; `ports`: each port's (address, port) from its log."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [*tritonserver_command(), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        self.ports: dict[str, tuple[str, int]] = {}

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_up(self, last: str = "HTTP", timeout: float = 30) -> Tritonserver:
        """Until the `last` port logs that it listens (HTTP's line comes last)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {name: (host, int(port)) for name, host, port in PORT_LINE.findall(self.text())}
            if last in found:
                self.ports = found
                return self
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"no '{last} listening' line in {timeout} s:\n{self.text()}")

    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['HTTP'][1]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.text()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(EXAMPLES / "simple", models / "simple")
    return models


@pytest.fixture
def started(tmp_path: Path):
    servers: list[Tritonserver] = []

    def start(args: list[str], last: str = "HTTP") -> Tritonserver:
        server = Tritonserver(args, tmp_path / f"tritonserver{len(servers)}.log")
        servers.append(server)
        return server.wait_up(last)

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


def infer_http(server: Tritonserver) -> None:
    body = {"inputs": simple_inputs(A, B, [1, 16])}
    answer = httpx.post(f"{server.url()}/v2/models/simple/infer", json=body, timeout=10).json()
    assert {o["name"]: o["data"] for o in answer["outputs"]} == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


def infer_grpc(port: int) -> None:
    answer = call(SimpleNamespace(grpc_port=port), lambda stub: stub.model_infer(simple_request()))
    assert outputs(answer) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


def test_a_helm_charts_arguments_start_it_and_it_serves(started, repository: Path) -> None:
    # Triton's Helm charts: the repository, strict-model-config, log-verbose and GPU metrics from values,
    # here with free ports where the chart's pod has 8000, 8001 and 8002 to itself.
    server = started(
        [
            f"--model-repository={repository}",
            "--strict-model-config=false",
            "--log-verbose=1",
            "--allow-gpu-metrics=false",
            f"--http-port={free_port()}",
            f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}",
            "--http-thread-count=16",
            "--pinned-memory-pool-byte-size=268435456",
            "--backend-config=python,shm-default-byte-size=10485760",
        ]
    )
    infer_http(server)
    infer_grpc(server.ports["gRPC"][1])
    log = server.text()
    assert "tritonserver: --http-thread-count is accepted and has no effect here: " in log
    assert "tritonserver: --pinned-memory-pool-byte-size is accepted and has no effect here: " in log
    assert "--backend-config python,shm-default-byte-size: no backend here reads it; ignored" in log
    assert server.ports["HTTP"][0] == "0.0.0.0"  # Triton's default address
    metadata = httpx.get(f"{server.url()}/v2", timeout=10).json()
    assert metadata["name"] == "triton"  # Triton's default --id
    server.stop()


def test_kserves_triton_runtime_arguments_start_it(started, repository: Path) -> None:
    # KServe's Triton serving runtime: the model store it mounts, gRPC on 9000 and HTTP on 8080 (here free
    # ports), both allowed; metrics moved to a free port too.
    http, grpc = free_port(), free_port()
    server = started(
        [
            f"--model-store={repository}",
            f"--grpc-port={grpc}",
            f"--http-port={http}",
            "--allow-grpc=true",
            "--allow-http=true",
            f"--metrics-port={free_port()}",
        ]
    )
    assert server.ports["HTTP"][1] == http and server.ports["gRPC"][1] == grpc
    infer_http(server)
    infer_grpc(grpc)
    assert "has no effect here" not in server.text()
    server.stop()


def test_allow_grpc_false_leaves_the_grpc_port_closed(started, repository: Path) -> None:
    grpc = free_port()
    server = started([f"--model-store={repository}", "--http-port=0", f"--grpc-port={grpc}",
                      "--allow-grpc=false", "--allow-metrics=false"])  # fmt: skip
    assert set(server.ports) == {"HTTP"}
    infer_http(server)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", grpc), timeout=5).close()
    server.stop()


def test_allow_http_false_serves_grpc_only(started, repository: Path) -> None:
    server = started(
        [f"--model-store={repository}", "--grpc-port=0", "--allow-http=false", "--allow-metrics=false"],
        last="gRPC",
    )
    assert set(server.ports) == {"gRPC"}
    infer_grpc(server.ports["gRPC"][1])
    server.stop()


def test_each_port_binds_the_address_asked_and_id_names_the_server(started, repository: Path) -> None:
    server = started(
        [
            f"--model-store={repository}",
            "--http-address=127.0.0.1",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
            "--id=inference-eu-1",
        ]
    )
    assert server.ports["HTTP"][0] == "127.0.0.1"
    assert server.ports["Metrics"][0] == "127.0.0.1"  # Triton's: the metrics port follows --http-address
    assert server.ports["gRPC"][0] == "0.0.0.0"
    assert httpx.get(f"{server.url()}/v2", timeout=10).json()["name"] == "inference-eu-1"
    metadata = call(
        SimpleNamespace(grpc_port=server.ports["gRPC"][1]),
        lambda stub: stub.server_metadata(pb.ServerMetadataRequest()),
    )
    assert metadata.name == "inference-eu-1"
    server.stop()


FAILS_ONCE = """
from pathlib import Path

MARKER = Path({marker!r})


class Model:
    def initialize(self, config):
        if not MARKER.exists():
            MARKER.write_text("tried")
            raise RuntimeError("the first load fails")

    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"]}}
"""

FAILS_ONCE_CONFIG = """
name: "flaky"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


def flaky_repository(root: Path) -> Path:
    models = root / "flaky_models"
    (models / "flaky" / "1").mkdir(parents=True)
    (models / "flaky" / "config.pbtxt").write_text(FAILS_ONCE_CONFIG)
    (models / "flaky" / "1" / "model.py").write_text(FAILS_ONCE.format(marker=str(root / "tried")))
    return models


def test_model_load_retry_count_retries_a_model_that_fails_once(started, tmp_path: Path) -> None:
    models = flaky_repository(tmp_path)
    server = started([f"--model-store={models}", "--model-load-retry-count=1", "--http-port=0",
                      "--grpc-port=0", "--allow-metrics=false"])  # fmt: skip
    assert httpx.get(f"{server.url()}/v2/models/flaky/ready", timeout=10).status_code == 200
    assert "the first load fails" in server.text() and "retry 1 of 1" in server.text()
    server.stop()


def test_without_retries_the_failed_load_exits_as_tritons_exit_on_error_does(tmp_path: Path) -> None:
    models = flaky_repository(tmp_path)
    args = [f"--model-store={models}", "--http-port=0", "--grpc-port=0", "--allow-metrics=false"]
    done = subprocess.run([*tritonserver_command(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "error: creating server: Internal - " in done.stderr
    assert "the first load fails" in done.stderr


def test_backend_config_default_max_batch_size_sets_what_auto_complete_gives(started, tmp_path: Path) -> None:
    need_module("onnxruntime", "the onnxruntime backend")
    models = tmp_path / "onnx_models"
    (models / "mlp" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLES / "onnx_mlp" / "1" / "model.onnx", models / "mlp" / "1" / "model.onnx")
    (models / "mlp" / "config.pbtxt").write_text('name: "mlp"\nbackend: "onnxruntime"\n')
    server = started(
        [
            f"--model-store={models}",
            "--backend-config=default-max-batch-size=8",
            "--backend-config=onnxruntime,default-max-batch-size=16",  # a backend's own setting wins
            "--http-port=0",
            "--grpc-port=0",
            "--allow-metrics=false",
        ]
    )
    config = httpx.get(f"{server.url()}/v2/models/mlp/config", timeout=10).json()
    assert config["max_batch_size"] == 16
    assert "dynamic_batching" in config
    server.stop()


def test_two_open_ports_on_one_address_and_port_are_refused_in_tritons_words(repository: Path) -> None:
    port = free_port()
    args = [f"--model-store={repository}", f"--http-port={port}", f"--grpc-port={port}", "--metrics-port=0"]
    done = subprocess.run([*tritonserver_command(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert (
        "The server cannot listen to HTTP requests and GRPC requests at the same address and port "
        f"0.0.0.0:{port}" in done.stderr
    )


def test_a_port_in_use_stops_startup_in_tritons_words(repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [f"--model-store={repository}", "--http-address=127.0.0.1", f"--http-port={port}",
                "--grpc-port=0", "--allow-metrics=false"]  # fmt: skip
        done = subprocess.run([*tritonserver_command(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert (
        f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{port}' already in use" in done.stderr
    )
    assert "Traceback" not in done.stderr
