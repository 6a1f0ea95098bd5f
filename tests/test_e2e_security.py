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

import tensorgate.proto.inference as pb
from bench.procs import memory_kib, reset_peak_rss

INFER = "/inference.GRPCInferenceService/ModelInfer"
IDENT = "class Model:\n    def execute(self, inputs):\n        return {'OUTPUT0': inputs['INPUT0']}\n"


def peak_rss_mib(server: ServerProcess) -> float:
    """The server's peak RSS (VmHWM) since the last reset_peak."""
    return memory_kib(server.proc.pid)["VmHWM"] / 1024


def reset_peak(server: ServerProcess, model: str) -> float:
    """Resets the server's peak RSS and answers it, having first shown that the reset works: a 48 MiB
    body (whitespace, refused as JSON once read whole) lifts the peak well above the RSS, the reset must
    bring it back down. A reset that fails, or does nothing, fails the test: the "grew by less than"
    checks against a stale peak would test nothing."""
    pid = server.proc.pid
    response = httpx.post(f"{server.base_url}/v2/models/{model}/infer", content=b" " * (48 << 20), timeout=60)
    assert response.status_code == 400, response.text
    lifted = memory_kib(pid)
    assert reset_peak_rss(pid), f"cannot reset the peak RSS of {pid} (/proc/{pid}/clear_refs)"
    after = memory_kib(pid)
    assert lifted["VmHWM"] - after["VmHWM"] > 32 << 10, f"the peak RSS was not reset: {lifted} -> {after}"
    assert after["VmHWM"] - after["VmRSS"] < 4 << 10, f"the peak RSS was not reset: {after}"
    return after["VmHWM"] / 1024


@pytest.mark.parametrize("filename", ["../../../../etc/hostname", "/etc/hostname", "..", "sub/model.onnx"])
def test_a_config_cannot_name_a_model_file_outside_its_version_folder(
    start_server, repo: Path, filename: str
) -> None:
    write_model(repo, "m", int32_config("m"), {1: IDENT})
    server = start_server(repo, extra_args=("--model-control-mode", "explicit"))
    config = {"name": "m", "backend": "onnxruntime", "default_model_filename": filename}
    body = {"parameters": {"config": json.dumps(config)}}
    response = httpx.post(f"{server.base_url}/v2/repository/models/m/load", json=body, timeout=20)
    assert response.status_code == 500  # Triton: the poll fails, INTERNAL
    assert "default_model_filename must be a file name in the version folder" in response.json()["error"]


def test_a_gzip_bomb_is_refused_at_the_limit_and_the_connection_serves_on(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--grpc-max-message-bytes", str(1 << 20)))
    bomb = gzip.compress(bytes(64 << 20))  # ~64 KB on the wire, 64 MiB inflated
    before = reset_peak(server, "simple")
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
    before = reset_peak(server, "ident")
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
EVIL = f"x\n{FORGED}\r\n{FORGED}"
IDENT_OVERRIDE = {  # ident's config, as a JSON config override of the load API
    "name": "ident",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
}


def explicit_ident_server(start_server, repo: Path) -> ServerProcess:
    """`ident` loaded in explicit mode: a reload with a config override that fails leaves it serving and
    logs why it failed, the override's text included."""
    write_model(repo, "ident", int32_config("ident", dims="[ -1 ]"), {1: IDENT})
    args = ("--model-control-mode", "explicit", "--load-model", "ident")
    return start_server(repo, extra_args=args, log_level="debug")


def reload_with(client: httpx.Client, **fields: object) -> httpx.Response:
    config = json.dumps(
        {key: value for key, value in {**IDENT_OVERRIDE, **fields}.items() if value is not None}
    )
    return client.post("/v2/repository/models/ident/load", json={"parameters": {"config": config}})


def failed_reloads(lines: list[str]) -> list[str]:
    return [line for line in lines if "reloading model 'ident' failed" in line]


def test_client_text_cannot_forge_log_lines(start_server, repo: Path) -> None:
    server = explicit_ident_server(start_server, repo)
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        body = {"inputs": [{"name": EVIL, "datatype": "INT32", "shape": [1], "data": [1]}], "id": EVIL}
        client.post("/v2/models/ident/infer", json=body)
        client.post("/v2/models/x%0AFORGED/infer", json=body)
        client.post("/grps/v1/infer/predict", json={"model": EVIL, "str_data": EVIL})
        client.post("/v1/models/ident:predict", json={"instances": [1], "signature_name": EVIL})
        client.post("/v2/repository/models/ident/load", json={"parameters": {"config": EVIL}})
        client.post("/v2/models/ident/infer", content=f'{{"inputs": [{{"name": "{EVIL!r}"'.encode())
        # A reload that fails in the backend: its reason, which quotes the client's text, is logged.
        response = reload_with(client, backend=EVIL)
        assert response.status_code == 400 and FORGED in response.json()["error"], response.text
    with H2Wire(("127.0.0.1", server.grpc_port)) as h2:
        h2.open()
        request = pb.ModelInferRequest(model_name=EVIL, id=EVIL, inputs=[tensor(EVIL, "INT32", [1])])
        open_call(h2, 1, INFER, message(bytes(request)))
        grpc_answer(h2, 1)
    server.stop()
    lines = server.log_path.read_text().splitlines()
    assert not [line for line in lines if line.startswith("FORGED")], "a client wrote a line of its own"
    # The positive control: the client's text did reach the log, escaped, on the failed reload's line.
    reloads = failed_reloads(lines)
    assert len(reloads) == 1, f"the failed reload was not logged: {reloads}"
    (reload,) = reloads
    assert f"x\\n{FORGED}\\r\\n{FORGED}" in reload, reload


# Config overrides whose failed reload logged the client's text as it came, newlines and all (found while
# adding the positive control above): every log message is now escaped where it is formatted
# (server/log_settings.py, TritonFormatter, in both of Triton's layouts).
UNESCAPED = {
    "default_model_filename": {"backend": "onnxruntime", "default_model_filename": f"{EVIL}.onnx"},
    "ensemble step": {
        "backend": None,
        "platform": "ensemble",
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": EVIL,
                    "model_version": -1,
                    "input_map": {"INPUT0": "INPUT0"},
                    "output_map": {"OUTPUT0": "OUTPUT0"},
                }
            ]
        },
    },
}


def test_a_failed_reload_logs_the_clients_text_escaped(start_server, repo: Path) -> None:
    server = explicit_ident_server(start_server, repo)
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        for fields in UNESCAPED.values():
            response = reload_with(client, **fields)
            assert response.status_code == 400 and FORGED in response.json()["error"], response.text
    server.stop()
    lines = server.log_path.read_text().splitlines()
    reloads = failed_reloads(lines)
    assert len(reloads) == len(UNESCAPED), reloads  # the text reached the log: the positive control
    assert not [line for line in lines if line.startswith("FORGED")], "a client wrote a line of its own"
    for reload in reloads:
        assert f"x\\n{FORGED}\\r\\n{FORGED}" in reload, reload
