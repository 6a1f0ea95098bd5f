"""Triton's restricted APIs (--http-restricted-api, --grpc-restricted-protocol; docs/operations/security.md):
every protocol's routes and methods in a restricted group answer only with the header, on REST over HTTP/1.1
and HTTP/2 and on gRPC; the other groups stay open.

What the test relies on about Triton, in its own words: a REST request to a restricted API without the header
(or with another value) is answered 403 with the body {"error": "This API is restricted, expecting header
'<key>'"}; a gRPC call ends UNAVAILABLE with "This protocol is restricted, expecting header
'triton-grpc-protocol-<key>'", the metadata key being the flag's key after that prefix.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from e2e_helpers import EXAMPLES, HTTP_SERVER, ServerProcess, make_client, stop_all

import tensorgate.proto.grps.protos.v1 as grps
import tensorgate.proto.inference as pb
import tensorgate.proto.tensorflow as tf
import tensorgate.proto.tensorflow.serving as tfs

ADMIN = ("x-admin-key", "s3cret")  # model-repository and shared-memory
INFER = ("x-infer-key", "abc")  # inference
FLAGS = (
    "--http-restricted-api", f"model-repository,shared-memory:{ADMIN[0]}={ADMIN[1]}",
    f"--http-restricted-api=inference:{INFER[0]}={INFER[1]}",
    "--grpc-restricted-protocol", f"model-repository,shared-memory:{ADMIN[0]}={ADMIN[1]}",
    f"--grpc-restricted-protocol=inference:{INFER[0]}={INFER[1]}",
)  # fmt: skip
SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    started = ServerProcess(EXAMPLES, tmp_path_factory.mktemp("restricted") / "server.log", extra_args=FLAGS)
    yield started.start()
    stop_all([started])


GRPS_X = {"name": "x", "dtype": "DT_FLOAT32", "shape": [1, 1], "flat_float32": [1.0]}
# (group, method, path, JSON body): one route of each protocol in each restricted group
REST_ROUTES = [
    (INFER, "POST", "/v2/models/simple/infer", SIMPLE),
    (INFER, "POST", "/v2/models/simple/generate", {"INPUT0": list(range(16)), "INPUT1": [1] * 16}),
    (INFER, "POST", "/v1/models/half_plus_two:predict", {"instances": [1.0]}),
    (INFER, "POST", "/grps/v1/infer/predict", {"model": "half_plus_two", "gtensors": {"tensors": [GRPS_X]}}),
    (ADMIN, "POST", "/v2/repository/index", {}),
    (ADMIN, "GET", "/v2/systemsharedmemory/status", None),
    (ADMIN, "GET", "/v2/cudasharedmemory/status", None),
]
OPEN_ROUTES = [
    "/v2/health/ready",
    "/v2",
    "/v2/models/simple",
    "/v2/models/simple/config",
    "/v1/models/half_plus_two",
]


@pytest.mark.parametrize("http_version", ["http1", "http2"])
def test_rest_needs_the_header_on_restricted_groups_only(server: ServerProcess, http_version: str) -> None:
    with make_client(server.base_url, http_version) as client:
        for (key, value), method, path, body in REST_ROUTES:
            refused = client.request(method, path, json=body)
            assert refused.status_code == 403, (path, refused.text)
            assert f"This API is restricted, expecting header '{key}'" in refused.text, refused.text
            wrong = client.request(method, path, json=body, headers={key: value + "x"})
            assert wrong.status_code == 403, (path, wrong.text)
            allowed = client.request(method, path, json=body, headers={key.upper(): value})  # names: any case
            assert allowed.status_code == 200, (path, allowed.text)
        assert client.post("/v2/models/simple/infer", json=SIMPLE, headers=dict([ADMIN])).status_code == 403
        for path in OPEN_ROUTES:
            assert client.get(path).status_code == 200, path


def test_the_refusal_is_each_protocols_error_body(server: ServerProcess) -> None:
    with make_client(server.base_url, "http1") as client:
        v2 = client.post("/v2/models/simple/infer", json=SIMPLE)
        assert v2.json() == {"error": f"This API is restricted, expecting header '{INFER[0]}'"}
        tf_rest = client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
        assert tf_rest.json() == {"error": f"This API is restricted, expecting header '{INFER[0]}'"}
        status = client.post("/grps/v1/infer/predict", json={"tensors": []}).json()["status"]
        assert (status["code"], status["status"]) == (403, "FAILURE") and INFER[0] in status["msg"]


def grpc_calls(channel: grpc.Channel) -> list:
    """(group, a call) for one method of each protocol in each restricted group, and ones left open."""

    def unary(path: str, request, answer):
        method = channel.unary_unary(path, request_serializer=bytes, response_deserializer=answer.parse)
        return lambda metadata=(): method(request, timeout=30, metadata=metadata)

    infer = pb.ModelInferRequest(
        model_name="simple",
        inputs=[pb.ModelInferRequestInferInputTensor(n, "INT32", [1, 16]) for n in ("INPUT0", "INPUT1")],
        raw_input_contents=[np.arange(16, dtype="<i4").tobytes(), np.ones(16, dtype="<i4").tobytes()],
    )
    shape = tf.TensorShapeProto(dim=[tf.TensorShapeProtoDim(size=1)])
    x = tf.TensorProto(
        dtype=tf.DataType.DT_FLOAT, tensor_shape=shape, tensor_content=np.ones(1, np.float32).tobytes()
    )
    v2, tfp = "/inference.GRPCInferenceService/", "/tensorflow.serving.PredictionService/"
    return [
        (INFER, unary(v2 + "ModelInfer", infer, pb.ModelInferResponse)),
        (
            INFER,
            unary(
                tfp + "Predict",
                tfs.PredictRequest(model_spec=tfs.ModelSpec(name="half_plus_two"), inputs={"x": x}),
                tfs.PredictResponse,
            ),
        ),  # fmt: skip
        (
            INFER,
            unary("/grps.protos.v1.GrpsService/Predict", grps.GrpsMessage(str_data="hi"), grps.GrpsMessage),
        ),
        (ADMIN, unary(v2 + "RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse)),
        (
            ADMIN,
            unary(
                v2 + "SystemSharedMemoryStatus",
                pb.SystemSharedMemoryStatusRequest(),
                pb.SystemSharedMemoryStatusResponse,
            ),
        ),  # fmt: skip
        (None, unary(v2 + "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse)),
        (None, unary(v2 + "ModelMetadata", pb.ModelMetadataRequest(name="simple"), pb.ModelMetadataResponse)),
    ]


# gRPC on the HTTP port is our transport's; the reference transport (hypercorn) serves REST only there
@pytest.mark.parametrize("port", ["grpc"] if HTTP_SERVER == "hypercorn" else ["grpc", "http"])
def test_grpc_needs_the_prefixed_metadata_on_restricted_groups_only(server: ServerProcess, port: str) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port if port == 'grpc' else server.port}") as channel:
        for group, call in grpc_calls(channel):
            if group is None:
                call()  # open: answered without any metadata
                continue
            key, value = group
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (
                caught.value.details()
                == f"This protocol is restricted, expecting header 'triton-grpc-protocol-{key}'"
            )
            with pytest.raises(grpc.RpcError):
                call(((key, value),))  # the key without Triton's prefix is not it
            call(((f"triton-grpc-protocol-{key}", value),))


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--http-restricted-api=nope:k=v", "unknown restricted api 'nope'"),
        ("--grpc-restricted-protocol=inference:k",
         "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got inference:k"),
        ("--http-restricted-api=inference,inference:k=v",
         "restricted api 'inference' can not be specified in multiple config groups"),
    ],
)  # fmt: skip
def test_malformed_flags_stop_startup_with_tritons_texts(tmp_path: Path, flag: str, message: str) -> None:
    command = [sys.executable, "-m", "tensorgate.server", "serve", "--model-repository", str(EXAMPLES), flag]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
