"""The security review of issue 18, each point against a real server: what a client can make the server
read or write on disk (config overrides naming files elsewhere; file overrides are in
test_e2e_repository_api.py), decompression bombs through gRPC gzip, huge dims and counts (no
allocation before the size is checked), and client text that reaches the log (no forged log lines).
The page at `/` escaping names is tests/test_e2e_monitor.py; shared-memory ranges are
tests/test_e2e_shared_memory.py and the shared_memory fuzz target."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, int32_config, write_model
from grpc_helpers import answer as grpc_answer
from grpc_helpers import message, open_call, simple_request, status_of, tensor
from h2_wire import H2Wire

import proto.inference as pb
from bench.procs import memory_kib, reset_peak_rss

INFER = "/inference.GRPCInferenceService/ModelInfer"
IDENT = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': inputs['INPUT0']}\n"


def peak_rss_mib(server: ServerProcess, reset: bool = False) -> float:
    """The server's peak RSS (since the last reset, where the kernel lets us reset it)."""
    if reset:
        reset_peak_rss(server.proc.pid)
    return memory_kib(server.proc.pid)["VmHWM"] / 1024


@pytest.mark.parametrize("filename", ["../../../../etc/hostname", "/etc/hostname", "..", "sub/model.onnx"])
def test_a_config_cannot_name_a_model_file_outside_its_version_folder(
    start_server, repo: Path, filename: str
) -> None:
    write_model(repo, "m", int32_config("m"), {1: IDENT})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit"))
    config = {"name": "m", "backend": "onnxruntime", "default_model_filename": filename}
    body = {"parameters": {"config": json.dumps(config)}}
    response = httpx.post(f"{server.base_url}/v2/repository/models/m/load", json=body, timeout=20)
    assert response.status_code == 400
    assert "default_model_filename must be a file name in the version folder" in response.json()["error"]


def test_a_gzip_bomb_is_refused_at_the_limit_and_the_connection_serves_on(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--grpc-max-message-bytes", str(1 << 20)))
    bomb = gzip.compress(bytes(64 << 20))  # ~64 KB on the wire, 64 MiB inflated
    before = peak_rss_mib(server, reset=True)
    with H2Wire(("127.0.0.1", server.grpc_port)) as h2:
        h2.open()
        open_call(h2, 1, INFER, message(bomb, True), extra=[("grpc-encoding", "gzip")])
        status, text = status_of(grpc_answer(h2, 1)[0])
        assert status == 8 and "decompressed" in text  # RESOURCE_EXHAUSTED
        open_call(h2, 3, INFER, message(bytes(simple_request())))
        assert status_of(grpc_answer(h2, 3)[0]) == (0, "")
    assert peak_rss_mib(server) - before < 32, "inflating stopped at the limit, not at 64 MiB"


def test_huge_shapes_are_refused_before_anything_is_allocated(start_server, repo: Path) -> None:
    write_model(repo, "ident", int32_config("ident", dims="[ -1 ]"), {1: IDENT})
    huge = """
name: "huge"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4611686018427387904 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4611686018427387904 ] } ]
"""
    write_model(repo, "huge", huge, {1: IDENT})  # a config that names 2^62 elements loads: nothing allocated
    server = start_server(repo)
    before = peak_rss_mib(server, reset=True)
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        for shape in ([1 << 40], [1 << 31, 1 << 31], [4611686018427387904]):
            body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": [1]}]}
            response = client.post("/v2/models/ident/infer", json=body)
            assert response.status_code == 400, response.text
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "INT32",
                        "shape": [1 << 40],
                        "parameters": {"binary_data_size": 4},
                    }
                ]
            }
        ).encode()
        response = client.post(
            "/v2/models/ident/infer",
            content=header + b"\0\0\0\0",
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert response.status_code == 400
        assert client.get("/v2/models/huge/ready").status_code == 200
    request = pb.ModelInferRequest(
        model_name="ident",
        inputs=[tensor("INPUT0", "INT32", [1 << 31, 1 << 31])],
        raw_input_contents=[np.zeros(1, "<i4").tobytes()],
    )
    with H2Wire(("127.0.0.1", server.grpc_port)) as h2:
        h2.open()
        open_call(h2, 1, INFER, message(bytes(request)))
        assert status_of(grpc_answer(h2, 1)[0])[0] == 3  # INVALID_ARGUMENT
    assert peak_rss_mib(server) - before < 32


FORGED = "FORGED tensorgate.repository: model 'admin' ready"


def test_client_text_cannot_forge_log_lines(start_server, repo: Path) -> None:
    write_model(repo, "ident", int32_config("ident", dims="[ -1 ]"), {1: IDENT})
    server = start_server(repo, log_level="debug")
    evil = f"x\n{FORGED}\r\n{FORGED}"
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        body = {"inputs": [{"name": evil, "datatype": "INT32", "shape": [1], "data": [1]}], "id": evil}
        client.post("/v2/models/ident/infer", json=body)
        client.post("/v2/models/x%0AFORGED/infer", json=body)
        client.post("/grps/v1/infer/predict", json={"model": evil, "str_data": evil})
        client.post("/v1/models/ident:predict", json={"instances": [1], "signature_name": evil})
        client.post("/v2/repository/models/ident/load", json={"parameters": {"config": evil}})
        client.post("/v2/models/ident/infer", content=f'{{"inputs": [{{"name": "{evil!r}"'.encode())
    with H2Wire(("127.0.0.1", server.grpc_port)) as h2:
        h2.open()
        request = pb.ModelInferRequest(model_name=evil, id=evil, inputs=[tensor(evil, "INT32", [1])])
        open_call(h2, 1, INFER, message(bytes(request)))
        grpc_answer(h2, 1)
    server.stop()
    lines = server.log_path.read_text().splitlines()
    assert not [line for line in lines if line.startswith("FORGED")], "a client wrote a line of its own"
