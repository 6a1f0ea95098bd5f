"""Triton's header forwarding (--http-header-forward-pattern, --grpc-header-forward-pattern;
docs/operations/security.md): the headers and metadata an inference request carries whose names the pattern
matches reach the model as string parameters, on REST (HTTP/1.1 and HTTP/2) and on gRPC ModelInfer and
ModelStreamInfer; the others do not; a reserved name fails the request with Triton's text; without the flags
nothing is forwarded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from e2e_helpers import ServerProcess, make_client, stop_all, write_model
from test_e2e_parameters import SCALED, SCALED_CONFIG

import tensorgate.proto.inference as pb

PATTERN = "^x-fwd-|^triton_|^timeout$"
BODY = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
V2 = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    base = tmp_path_factory.mktemp("forwarding")
    write_model(base / "models", "seen", SCALED_CONFIG % ("seen", ""), {1: SCALED})
    flags = ("--http-header-forward-pattern", PATTERN, "--grpc-header-forward-pattern", PATTERN)
    forwarding = ServerProcess(base / "models", base / "forwarding.log", extra_args=flags).start()
    plain = ServerProcess(base / "models", base / "plain.log").start()
    yield forwarding, plain
    stop_all([forwarding, plain])


def seen_rest(server: ServerProcess, http_version: str, headers: dict) -> tuple[int, dict]:
    with make_client(server.base_url, http_version) as client:
        answer = client.post("/v2/models/seen/infer", json=BODY, headers=headers)
    if answer.status_code != 200:
        return answer.status_code, answer.json()
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    return 200, json.loads(outputs["SEEN"][0])


@pytest.mark.parametrize("http_version", ["http1", "http2"])
def test_rest_forwards_the_matching_headers(servers, http_version: str) -> None:
    forwarding, plain = servers
    headers = {"X-Fwd-User": "alice", "x-fwd-team": "blue", "x-other": "no"}
    assert seen_rest(forwarding, http_version, headers) == (
        200,
        {"x-fwd-team": "blue", "x-fwd-user": "alice"},
    )
    assert seen_rest(plain, http_version, headers) == (200, {})  # no flag: nothing forwarded
    for reserved in ("triton_thing", "timeout"):
        status, error = seen_rest(forwarding, http_version, {reserved: "1"})
        assert status == 400
        assert error == {
            "error": f"Header '{reserved}' is reserved for Triton usage and cannot be forwarded."
        }


def infer_request() -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequestInferInputTensor("INPUT0", "INT32", [1, 2])
    return pb.ModelInferRequest(
        model_name="seen", inputs=[tensor], raw_input_contents=[np.array([1, 2], "<i4").tobytes()]
    )


def seen_grpc(answer: pb.ModelInferResponse) -> dict:
    index = [o.name for o in answer.outputs].index("SEEN")
    raw = answer.raw_output_contents[index]
    return json.loads(raw[4 : 4 + int.from_bytes(raw[:4], "little")])


@pytest.mark.parametrize("kind", ["unary", "stream"])
def test_grpc_forwards_the_matching_metadata(servers, kind: str) -> None:
    forwarding, plain = servers
    metadata = (("x-fwd-user", "alice"), ("x-other", "no"))

    def call(server: ServerProcess, given: tuple) -> dict:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            if kind == "unary":
                infer = channel.unary_unary(
                    V2 + "ModelInfer",
                    request_serializer=bytes,
                    response_deserializer=pb.ModelInferResponse.parse,
                )
                return seen_grpc(infer(infer_request(), metadata=given, timeout=30))
            stream = channel.stream_stream(
                V2 + "ModelStreamInfer",
                request_serializer=bytes,
                response_deserializer=pb.ModelStreamInferResponse.parse,
            )
            (answer,) = list(stream(iter([infer_request()]), metadata=given, timeout=30))
            if answer.error_message:
                raise AssertionError(answer.error_message)
            return seen_grpc(answer.infer_response)

    assert call(forwarding, metadata) == {"x-fwd-user": "alice"}
    assert call(plain, metadata) == {}
    with pytest.raises((grpc.RpcError, AssertionError)) as caught:
        call(forwarding, (("triton_thing", "1"),))
    text = caught.value.details() if isinstance(caught.value, grpc.RpcError) else str(caught.value)
    assert "Header 'triton_thing' is reserved for Triton usage and cannot be forwarded." in text


def test_a_pattern_that_is_not_a_regular_expression_stops_startup(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tensorgate.server", "serve", "--model-repository", str(tmp_path),
               "--grpc-header-forward-pattern", "x-(unclosed"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not a regular expression" in done.stderr, done.stderr
