"""Regenerate the betterproto2 modules in proto/ from the .proto sources beside them.

`make proto` runs `python -m tensorgate.proto.generate`; tests/test_proto.py calls `generate(tmp_dir)` and
compares the result with the committed files. Needs the `proto` extra (grpcio-tools, betterproto2-compiler).

The betterproto2 plugin formats its output with the `ruff` it finds on PATH, configured by the
pyproject.toml of the working directory, so this always runs protoc from the repository root with the
interpreter's bin directory first on PATH: the output depends only on the sources and the pinned tools.
"""

import os
import subprocess
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
SOURCES = (
    "google/protobuf/any.proto",  # ours, wire-identical: the generated module holds only what we wrote
    "google/protobuf/wrappers.proto",
    "grpc_service.proto",
    "model_config.proto",
    "grps.proto",
    "grpc_health.proto",
    "grpc_reflection_v1.proto",
    "grpc_reflection_v1alpha.proto",
    # TensorFlow Serving's gRPC API, at the published import paths (protoc -I proto): TensorFlow's messages
    # it uses, then its configuration and its APIs.
    "tensorflow/core/framework/types.proto",
    "tensorflow/core/framework/tensor_shape.proto",
    "tensorflow/core/framework/resource_handle.proto",
    "tensorflow/core/framework/tensor.proto",
    "tensorflow/core/example/feature.proto",
    "tensorflow/core/example/example.proto",
    "tensorflow/core/protobuf/struct.proto",
    "tensorflow/core/protobuf/meta_graph.proto",
    "tensorflow/core/protobuf/error_codes.proto",
    "tensorflow_serving/config/file_system_storage_path_source.proto",
    "tensorflow_serving/config/log_collector_config.proto",
    "tensorflow_serving/config/logging_config.proto",
    "tensorflow_serving/config/model_server_config.proto",
    "tensorflow_serving/apis/model.proto",
    "tensorflow_serving/apis/status.proto",
    "tensorflow_serving/apis/input.proto",
    "tensorflow_serving/apis/classification.proto",
    "tensorflow_serving/apis/regression.proto",
    "tensorflow_serving/apis/inference.proto",
    "tensorflow_serving/apis/predict.proto",
    "tensorflow_serving/apis/get_model_metadata.proto",
    "tensorflow_serving/apis/get_model_status.proto",
    "tensorflow_serving/apis/model_management.proto",
    "tensorflow_serving/apis/prediction_service.proto",
    "tensorflow_serving/apis/model_service.proto",
)
# Every source's FileDescriptorProto, for server reflection (server/grpc/reflection.py) to serve.
DESCRIPTORS = "descriptors.binpb"
PLUGIN_OPTIONS = "server_generation=async,client_generation=async"
# What the plugin writes: modules and the py.typed marker (this script and the sources are not), and the
# descriptor set.
GENERATED_SUFFIXES = (".py", ".typed", ".binpb")


def generate(out_dir: Path) -> list[Path]:
    """Compile SOURCES into out_dir; returns the Python files now in out_dir, relative to it."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR.relative_to(REPO_ROOT)}",
        f"--python_betterproto2_out={out_dir}",
        f"--python_betterproto2_opt={PLUGIN_OPTIONS}",
        f"--descriptor_set_out={out_dir / DESCRIPTORS}",
        *(str((PROTO_DIR / name).relative_to(REPO_ROOT)) for name in SOURCES),
    ]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"protoc failed ({result.returncode}):\n{result.stderr}")
    return sorted(
        p.relative_to(out_dir)
        for p in out_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in GENERATED_SUFFIXES
    )


if __name__ == "__main__":
    generate(PROTO_DIR)
