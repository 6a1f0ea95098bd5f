"""Triton's texts and statuses for the last cases that differed, end to end over REST (httpx) and gRPC
(grpclib): a requested version that is not a number, the limit on what a JSON input expands to, and the
load parameters Triton's front ends and core refuse."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    EXAMPLES,
    IDENTITY_MODEL,
    A,
    ServerProcess,
    assert_error,
    int32_config,
    make_client,
    simple_inputs,
    stop_all,
    write_model,
)
from grpc_helpers import call, grpc_error, outputs, simple_request, stream
from grpclib.const import Status

import tensorgate.proto.inference as pb
from tensorgate.codec.errors import InferError
from tensorgate.codec.v2_http import decode_request

NOT_A_NUMBER = (
    "failed to get model version from specified version string '{}' (details: stol), "
    "version should be an integral value > 0"
)
NEGATIVE = "invalid model version specified '{}' , version should be an integral value > 0"
BAD_VERSIONS = [
    ("abc", NOT_A_NUMBER),
    ("latest", NOT_A_NUMBER),
    ("99999999999999999999", NOT_A_NUMBER),  # past int64: std::stol's out_of_range
    ("-1", NEGATIVE),
]
INFER = {"inputs": simple_inputs(A, A, [1, 16])}


@pytest.fixture
def client(v2_server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(v2_server.base_url, http_version) as c:
        yield c


# ------------------------------------------------------------------------------------------ versions


@pytest.mark.parametrize(("version", "text"), BAD_VERSIONS)
def test_a_version_that_is_not_a_number_on_every_rest_endpoint(
    client: httpx.Client, version: str, text: str
) -> None:
    base = f"/v2/models/simple/versions/{version}"
    expected = text.format(version)
    for method, path, body in (
        ("GET", base, None),
        ("GET", base + "/ready", None),
        ("GET", base + "/config", None),
        ("GET", base + "/stats", None),
        ("POST", base + "/infer", INFER),
        ("POST", base + "/generate", {"INPUT0": A, "INPUT1": A}),
        ("POST", base + "/generate_stream", {"INPUT0": A, "INPUT1": A}),
    ):
        response = client.request(method, path, json=body)
        assert assert_error(response, 400) == expected, path
    # read before the model is looked up, as Triton reads it
    assert assert_error(client.get("/v2/models/nosuch/versions/abc"), 400) == NOT_A_NUMBER.format("abc")


def test_a_version_is_read_as_std_stol_reads_it(client: httpx.Client) -> None:
    """Leading zeros and what follows the digits are left out, as Triton's parser leaves them out."""
    for version in ("01", "1", "001"):
        ready = client.get(f"/v2/models/simple/versions/{version}/ready")
        assert ready.status_code == 200 and ready.json() == {"name": "simple", "ready": True}
        answer = client.post(f"/v2/models/simple/versions/{version}/infer", json=INFER)
        assert answer.status_code == 200 and answer.json()["model_version"] == "1"


@pytest.mark.parametrize(("version", "text"), BAD_VERSIONS)
def test_a_version_that_is_not_a_number_on_every_grpc_rpc(
    v2_server: ServerProcess, version: str, text: str
) -> None:
    expected = text.format(version)
    for rpc in (
        lambda s: s.model_ready(pb.ModelReadyRequest(name="simple", version=version)),
        lambda s: s.model_metadata(pb.ModelMetadataRequest(name="simple", version=version)),
        lambda s: s.model_config(pb.ModelConfigRequest(name="simple", version=version)),
        lambda s: s.model_statistics(pb.ModelStatisticsRequest(name="simple", version=version)),
        lambda s: s.model_infer(simple_request(model_version=version)),
    ):
        assert grpc_error(v2_server, rpc, Status.INVALID_ARGUMENT) == expected
    answer = call(v2_server, lambda s: s.model_infer(simple_request(model_version="01")))
    plain = call(v2_server, lambda s: s.model_infer(simple_request()))
    assert answer.model_version == "1" and outputs(answer) == outputs(plain)
    # ModelStreamInfer answers it in the stream, and goes on
    requests = [simple_request(id="bad", model_version=version), simple_request(id="good")]
    bad, good = stream(v2_server, requests)
    assert bad.error_message == expected
    assert not good.error_message and outputs(good.infer_response) == outputs(plain)


# ------------------------------------------------------------------------------- the JSON input limit


def test_a_json_input_past_the_limit_is_refused_before_it_is_read(client: httpx.Client) -> None:
    """Triton's --http-max-input-size (64 MiB by default): an input's shape and datatype say what its
    JSON data expands to; past the limit it is refused before the data is read."""
    elements = (1 << 24) + 1  # INT32: 4 bytes past 64 MiB
    inputs = [{"name": "INPUT0", "datatype": "INT32", "shape": [1, elements], "data": A}, INFER["inputs"][1]]
    assert assert_error(client.post("/v2/models/simple/infer", json={"inputs": inputs}), 400) == (
        f"JSON input 'INPUT0' has a byte_size ({4 * elements} bytes) that exceeds the maximum allowed value "
        f"of {1 << 26} bytes. Use --http-max-input-size to increase the limit."
    )


def test_the_json_limits_in_the_codec() -> None:
    """The limit on the JSON itself, and on BYTES data (a string's bytes and 4 for its length, so 100
    empty strings are 400 bytes), at a small limit (a body past the default limit is 64 MiB)."""
    strings = {"inputs": [{"name": "T", "datatype": "BYTES", "shape": [100], "data": [""] * 100}]}
    body = json.dumps(strings, separators=(",", ":")).encode()
    assert len(body) < 399

    def refused(limit: int) -> str:
        with pytest.raises(InferError) as caught:
            decode_request(body, None, "m", "", limit)
        return caught.value.message

    assert decode_request(body, None, "m", "", 400).inputs[0].data.tolist() == [b""] * 100
    assert refused(399) == (
        "JSON input 'T' has a byte_size (400 bytes) that exceeds the maximum allowed value of 399 bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    assert refused(len(body) - 1) == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of {len(body) - 1} "
        "bytes. Use --http-max-input-size to increase the limit."
    )


def test_the_flag_sets_the_limit(tmp_path: Path) -> None:
    """--http-max-input-size 1000: a small request is served; an input that would expand past 1000 bytes,
    and a JSON body longer than 1000 bytes, get Triton's texts naming the limit, on infer and generate."""
    repository = tmp_path / "models"
    shutil.copytree(EXAMPLES / "simple", repository / "simple")
    server = ServerProcess(repository, tmp_path / "server.log", extra_args=("--http-max-input-size", "1000"))
    server.start()
    try:
        with make_client(server.base_url, "http1") as client:
            assert client.post("/v2/models/simple/infer", json=INFER).status_code == 200
            wide = [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 300], "data": [0] * 300}]
            assert assert_error(client.post("/v2/models/simple/infer", json={"inputs": wide}), 400) == (
                "JSON input 'INPUT0' has a byte_size (1200 bytes) that exceeds the maximum allowed value of "
                "1000 bytes. Use --http-max-input-size to increase the limit."
            )
            padded = json.dumps({**INFER, "parameters": {"pad": "x" * 1000}}).encode()
            assert_error(
                client.post("/v2/models/simple/infer", content=padded),
                400,
                f"request JSON size of {len(padded)} bytes exceeds the maximum allowed input size of 1000",
            )
            long_input = {"INPUT0": [0] * 300, "INPUT1": [0] * 16}
            assert_error(
                client.post("/v2/models/simple/generate", json=long_input),
                400,
                "maximum allowed input size of 1000",
            )
    finally:
        stop_all([server])


# ------------------------------------------------------------------------------------ load parameters


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton_texts")
    repo = root / "models"
    repo.mkdir()
    write_model(repo, "good", int32_config("good"), {1: IDENTITY_MODEL})
    server = ServerProcess(
        repo, root / "server.log", extra_args=("--model-control-mode", "explicit", "--load-model", "good")
    ).start()
    yield server
    stop_all([server])


POLL_FAILED = "failed to load 'good', failed to poll from model repository"
REST_LOADS = {  # parameters -> what Triton answers: 500 (INTERNAL) and its text
    "config not JSON": ({"config": "{not json"}, POLL_FAILED),
    "files without config": ({"file:1/model.py": b64(IDENTITY_MODEL)}, POLL_FAILED),
    "config not a string": ({"config": {"name": "good"}}, "attempt to access JSON non-string as string"),
    "file not a string": ({"file:1/model.py": 5}, "attempt to access JSON non-string as string"),
    "unknown parameter": ({"color": "blue"}, "unexpected error on creating Triton parameter"),
}


def _serves(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        inputs = [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [4, 5]}]
        assert c.post("/v2/models/good/infer", json={"inputs": inputs}).json()["outputs"][0]["data"] == [4, 5]


@pytest.mark.parametrize("case", sorted(REST_LOADS))
def test_load_parameters_triton_refuses_over_rest(explicit_server: ServerProcess, case: str) -> None:
    parameters, text = REST_LOADS[case]
    with httpx.Client(base_url=explicit_server.base_url, timeout=10) as c:
        response = c.post("/v2/repository/models/good/load", json={"parameters": parameters})
    assert assert_error(response, 500).startswith(text)
    _serves(explicit_server)


def _parameter(**value: object) -> pb.ModelRepositoryParameter:
    return pb.ModelRepositoryParameter(**value)


GRPC_LOADS = {  # parameters -> Triton's status and text
    "config not JSON": ({"config": _parameter(string_param="{not json")}, Status.INTERNAL, POLL_FAILED),
    "files without config": (
        {"file:1/model.py": _parameter(bytes_param=IDENTITY_MODEL.encode())},
        Status.INTERNAL,
        POLL_FAILED,
    ),
    "config as bytes": (
        {"config": _parameter(bytes_param=b"{}")},
        Status.INVALID_ARGUMENT,
        "invalid value type for load parameter 'config', expected string_param.",
    ),
    "file as a string": (
        {"file:1/model.py": _parameter(string_param=IDENTITY_MODEL)},
        Status.INVALID_ARGUMENT,
        "invalid value type for load parameter 'file:1/model.py', expected bytes_param.",
    ),
    "unknown parameter": (
        {"color": _parameter(string_param="blue")},
        Status.INVALID_ARGUMENT,
        "unrecognized load parameter 'color'.",
    ),
}


@pytest.mark.parametrize("case", sorted(GRPC_LOADS))
def test_load_parameters_triton_refuses_over_grpc(explicit_server: ServerProcess, case: str) -> None:
    parameters, status, text = GRPC_LOADS[case]
    request = pb.RepositoryModelLoadRequest(model_name="good", parameters=parameters)
    message = grpc_error(explicit_server, lambda s: s.repository_model_load(request), status)
    assert message.startswith(text), message
    _serves(explicit_server)


def test_a_good_override_still_loads(explicit_server: ServerProcess, tmp_path: Path) -> None:
    config = json.dumps(
        {
            "name": "good",
            "backend": "python",
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        }
    )
    with httpx.Client(base_url=explicit_server.base_url, timeout=30) as c:
        body = {"parameters": {"config": config, "file:1/model.py": b64(IDENTITY_MODEL)}}
        assert c.post("/v2/repository/models/good/load", json=body).status_code == 200
    _serves(explicit_server)
