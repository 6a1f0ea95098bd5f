"""KServe v2 REST end to end, over HTTP/1.1 and HTTP/2 (h2c prior knowledge), against a real server."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    A,
    B,
    assert_connection_reused,
    assert_error,
    binary_body,
    decode_bytes_elements,
    encode_bytes_elements,
    local_port,
    simple_inputs,
    split_binary_response,
)


def outputs_by_name(doc: dict) -> dict[str, dict]:
    names = [o["name"] for o in doc["outputs"]]
    assert len(names) == len(set(names)), names
    return {o["name"]: o for o in doc["outputs"]}


# ------------------------------------------------------------------------------------------ server


def test_server_metadata(client: httpx.Client) -> None:
    response = client.get("/v2")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    doc = response.json()
    assert doc["name"] == "tensorgate"
    assert isinstance(doc["version"], str) and doc["version"]
    assert sorted(doc["extensions"]) == [
        "binary_tensor_data",
        "classification",
        "cuda_shared_memory",
        "generate",
        "logging",
        "model_configuration",
        "model_repository",
        "model_repository(unload_dependents)",
        "parameters",
        "schedule_policy",
        "sequence",
        "sequence(string_id)",
        "statistics",
        "system_shared_memory",
        "trace",
    ]


def test_health_live_and_ready(client: httpx.Client) -> None:
    live = client.get("/v2/health/live")
    assert (live.status_code, live.json()) == (200, {"live": True})
    ready = client.get("/v2/health/ready")
    assert (ready.status_code, ready.json()) == (200, {"ready": True})


# ------------------------------------------------------------------------------------------ models

METADATA = {
    "simple": (
        [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])],
        [("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])],
    ),
    "simple_string": (
        [("INPUT0", "BYTES", [-1, 16]), ("INPUT1", "BYTES", [-1, 16])],
        [("OUTPUT0", "BYTES", [-1, 16]), ("OUTPUT1", "BYTES", [-1, 16])],
    ),
    "simple_identity": ([("INPUT0", "BYTES", [-1, -1])], [("OUTPUT0", "BYTES", [-1, -1])]),
    "identity_fp32": ([("INPUT0", "FP32", [-1])], [("OUTPUT0", "FP32", [-1])]),
    "half_plus_two": ([("x", "FP32", [-1, 1])], [("y", "FP32", [-1, 1])]),
}


def _tensors(specs: list[tuple[str, str, list[int]]]) -> list[dict]:
    return [{"name": n, "datatype": d, "shape": s} for n, d, s in specs]


@pytest.mark.parametrize("model", sorted(METADATA))
def test_model_metadata(client: httpx.Client, model: str) -> None:
    inputs, outputs = METADATA[model]
    for path in (f"/v2/models/{model}", f"/v2/models/{model}/versions/1"):
        response = client.get(path)
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["name"] == model
        assert doc["versions"] == ["1"]
        assert doc["platform"] == "python"
        assert doc["inputs"] == _tensors(inputs)
        assert doc["outputs"] == _tensors(outputs)


@pytest.mark.parametrize("model", sorted(METADATA))
def test_model_ready(client: httpx.Client, model: str) -> None:
    for path in (f"/v2/models/{model}/ready", f"/v2/models/{model}/versions/1/ready"):
        response = client.get(path)
        assert (response.status_code, response.json()) == (200, {"name": model, "ready": True})


def test_model_config_pbtxt(client: httpx.Client) -> None:
    response = client.get("/v2/models/simple/config")
    assert response.status_code == 200
    config = response.json()
    assert config["name"] == "simple"
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]),
        ("INPUT1", "TYPE_INT32", [16]),
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_INT32", [16]),
        ("OUTPUT1", "TYPE_INT32", [16]),
    ]
    assert client.get("/v2/models/simple/versions/1/config").json() == config


def test_model_config_reshape_and_batching(client: httpx.Client) -> None:
    config = client.get("/v2/models/half_plus_two/config").json()
    assert config["max_batch_size"] == 64
    assert config["input"][0]["reshape"] == {"shape": []}
    assert config["output"][0]["dims"] == [1]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100


def test_model_config_json(client: httpx.Client) -> None:
    config = client.get("/v2/models/identity_fp32/config").json()
    assert config["name"] == "identity_fp32"
    assert config["max_batch_size"] == 0
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [-1])
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [-1])
    ]


# ------------------------------------------------------------------------------------------ infer


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_infer_simple_batch_of_one(client: httpx.Client, nested: bool) -> None:
    a, b = ([A], [B]) if nested else (A, B)
    response = client.post("/v2/models/simple/infer", json={"inputs": simple_inputs(a, b, [1, 16])})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    doc = response.json()
    assert doc["model_name"] == "simple"
    assert doc["model_version"] == "1"
    assert "id" not in doc
    out = outputs_by_name(doc)
    assert set(out) == {"OUTPUT0", "OUTPUT1"}
    assert out["OUTPUT0"] == {
        "name": "OUTPUT0",
        "datatype": "INT32",
        "shape": [1, 16],
        "data": [x + y for x, y in zip(A, B, strict=True)],
    }
    assert out["OUTPUT1"]["data"] == [x - y for x, y in zip(A, B, strict=True)]
    assert out["OUTPUT1"]["shape"] == [1, 16]


def test_infer_simple_batch_of_eight_with_id(client: httpx.Client) -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(-1000, 1000, size=(8, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(8, 16), dtype=np.int32)
    body = {"id": "req-42", "inputs": simple_inputs(a.tolist(), b.reshape(-1).tolist(), [8, 16])}
    response = client.post("/v2/models/simple/infer", json=body)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["id"] == "req-42"
    out = outputs_by_name(doc)
    assert out["OUTPUT0"]["shape"] == [8, 16]
    assert out["OUTPUT0"]["data"] == (a + b).reshape(-1).tolist()
    assert out["OUTPUT1"]["data"] == (a - b).reshape(-1).tolist()


def test_infer_simple_outputs_subset_and_version_url(client: httpx.Client) -> None:
    body = {"inputs": simple_inputs(A, B, [1, 16]), "outputs": [{"name": "OUTPUT1"}]}
    response = client.post("/v2/models/simple/versions/1/infer", json=body)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["model_version"] == "1"
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT1"]
    assert doc["outputs"][0]["data"] == [x - y for x, y in zip(A, B, strict=True)]


def test_infer_simple_string(client: httpx.Client) -> None:
    a = [str(i) for i in range(16)]
    b = [str(-5 * i + 7) for i in range(16)] * 2
    inputs = [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [2, 16], "data": a * 2},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [2, 16], "data": b},
    ]
    response = client.post("/v2/models/simple_string/infer", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    out = outputs_by_name(response.json())
    assert out["OUTPUT0"]["datatype"] == "BYTES"
    assert out["OUTPUT0"]["shape"] == [2, 16]
    assert out["OUTPUT0"]["data"] == [str(int(x) + int(y)) for x, y in zip(a * 2, b, strict=True)]
    assert out["OUTPUT1"]["data"] == [str(int(x) - int(y)) for x, y in zip(a * 2, b, strict=True)]


def test_infer_simple_identity_json_unicode(client: httpx.Client) -> None:
    strings = ["", "plain", "naïve café", "日本語", "emoji 🚀", 'quote " and \\ backslash']
    inputs = [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 3], "data": [strings[:3], strings[3:]]}]
    response = client.post("/v2/models/simple_identity/infer", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert out == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [2, 3], "data": strings}


NON_UTF8 = [b"\xff\xfe\x00\x01", b"", b"\x80abc", "valid ü".encode(), bytes(range(256))]


def test_infer_simple_identity_binary_non_utf8(client: httpx.Client) -> None:
    raw = encode_bytes_elements(NON_UTF8)
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BYTES",
                "shape": [1, len(NON_UTF8)],
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    body, headers = binary_body(header, raw)
    response = client.post("/v2/models/simple_identity/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    doc, chunks = split_binary_response(response)
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("OUTPUT0", "BYTES", [1, len(NON_UTF8)])
    assert chunks["OUTPUT0"] == raw
    assert decode_bytes_elements(chunks["OUTPUT0"]) == NON_UTF8


def test_infer_non_utf8_output_as_json_is_a_clear_error(client: httpx.Client) -> None:
    raw = encode_bytes_elements([b"\xff\xfe"])
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BYTES",
                "shape": [1, 1],
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    body, headers = binary_body(header, raw)
    response = client.post("/v2/models/simple_identity/infer", content=body, headers=headers)
    assert_error(response, 400, "simple_identity", "OUTPUT0")
    assert_connection_reused(client, response)


def test_infer_identity_fp32_json(client: httpx.Client) -> None:
    values = [0.0, -1.5, 2.25, 1024.125, -0.0078125, 3.0e10]
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]
    response = client.post("/v2/models/identity_fp32/infer", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert out == {"name": "OUTPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}


def test_infer_identity_fp32_binary_round_trip_few_mib(client: httpx.Client) -> None:
    count = 3 * (1 << 20) // 4 + 5  # a bit over 3 MiB of float32
    array = np.random.default_rng(1).standard_normal(count).astype("<f4")
    array[:4] = [np.nan, np.inf, -np.inf, -0.0]
    raw = array.tobytes()
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [count],
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, raw)
    response = client.post("/v2/models/identity_fp32/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text[:500]
    assert int(response.headers["content-length"]) == len(response.content)
    doc, chunks = split_binary_response(response)
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("OUTPUT0", "FP32", [count])
    assert out["parameters"]["binary_data_size"] == len(raw)
    assert chunks["OUTPUT0"] == raw


def test_infer_half_plus_two(client: httpx.Client) -> None:
    x = [[-4.0], [0.0], [1.0], [3.5], [1000.0]]
    inputs = [{"name": "x", "datatype": "FP32", "shape": [5, 1], "data": x}]
    response = client.post("/v2/models/half_plus_two/infer", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", "FP32", [5, 1])
    assert out["data"] == [0.5 * row[0] + 2.0 for row in x]


def test_binary_data_output_for_every_output(client: httpx.Client) -> None:
    body = {"inputs": simple_inputs(A, B, [1, 16]), "parameters": {"binary_data_output": True}}
    response = client.post("/v2/models/simple/infer", json=body)
    assert response.status_code == 200, response.text
    doc, chunks = split_binary_response(response)
    assert set(chunks) == {"OUTPUT0", "OUTPUT1"}
    out = outputs_by_name(doc)
    for name, expected in (("OUTPUT0", np.add(A, B)), ("OUTPUT1", np.subtract(A, B))):
        assert out[name]["shape"] == [1, 16]
        assert out[name]["parameters"]["binary_data_size"] == 64
        assert np.frombuffer(chunks[name], dtype="<i4").tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("default", "override", "binary_names"),
    [(True, {"OUTPUT0": False}, {"OUTPUT1"}), (False, {"OUTPUT1": True}, {"OUTPUT1"})],
    ids=["default-binary-one-json", "default-json-one-binary"],
)
def test_binary_data_per_output_override(
    client: httpx.Client, default: bool, override: dict[str, bool], binary_names: set[str]
) -> None:
    outputs = [
        {"name": name, "parameters": {"binary_data": override[name]}} if name in override else {"name": name}
        for name in ("OUTPUT0", "OUTPUT1")
    ]
    body = {
        "inputs": simple_inputs(A, B, [1, 16]),
        "outputs": outputs,
        "parameters": {"binary_data_output": default},
    }
    response = client.post("/v2/models/simple/infer", json=body)
    assert response.status_code == 200, response.text
    doc, chunks = split_binary_response(response)
    assert set(chunks) == binary_names
    out = outputs_by_name(doc)
    assert out["OUTPUT0"]["data"] == np.add(A, B).tolist()
    assert np.frombuffer(chunks["OUTPUT1"], dtype="<i4").tolist() == np.subtract(A, B).tolist()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/octet-stream"])
def test_any_or_no_content_type_accepted(client: httpx.Client, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = json.dumps({"inputs": simple_inputs(A, B, [1, 16]), "outputs": [{"name": "OUTPUT0"}]}).encode()
    response = client.post("/v2/models/simple/infer", content=body, headers=headers)
    assert response.request.headers.get("content-type") == content_type
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == np.add(A, B).tolist()

    raw = np.arange(6, dtype="<f4").tobytes()
    header = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [6], "parameters": {"binary_data_size": 24}}
        ]
    }
    body, binary_headers = binary_body(header, raw)
    response = client.post("/v2/models/identity_fp32/infer", content=body, headers=headers | binary_headers)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == list(range(6))


def test_concurrent_requests_on_one_client(v2_server, http_version: str) -> None:  # noqa: ANN001
    """32 requests at once from one client; over HTTP/2 they are multiplexed on one connection.

    httpx's AsyncClient, on one event loop: its sync client shared by threads is not safe over HTTP/2
    (httpcore allocates a stream id and sends its HEADERS without one lock, so a later id can go out
    first, which RFC 9113 section 5.1.1 makes a connection error; pydantic/httpx2#1153)."""

    def body(i: int) -> dict:
        return {
            "id": f"c{i}",
            "inputs": simple_inputs([i] * 16, B, [1, 16]),
            "outputs": [{"name": "OUTPUT0"}],
        }

    async def burst() -> tuple[list[httpx.Response], set[int]]:
        http2 = http_version == "http2"
        async with httpx.AsyncClient(
            base_url=v2_server.base_url, http1=not http2, http2=http2, timeout=15
        ) as c:
            # One request first: httpx may open a second HTTP/2 connection for requests racing the first
            # one's setup (encode/httpx#514); the burst then finds the connection open and must share it.
            assert (await c.post("/v2/models/simple/infer", json=body(-1))).status_code == 200
            posts = (c.post("/v2/models/simple/infer", json=body(i)) for i in range(32))
            answers = await asyncio.gather(*posts)
            # HTTP/2: the connections each answer came on, while they are open (HTTP/1.1: the pool may
            # have closed some already, past its keep-alive limit)
            return answers, {local_port(r) for r in answers} if http2 else set()

    responses, ports = asyncio.run(burst())
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        assert response.http_version == ("HTTP/2" if http_version == "http2" else "HTTP/1.1")
        doc = response.json()
        assert doc["id"] == f"c{i}"
        assert doc["outputs"][0]["data"] == [i + b for b in B]
    if http_version == "http2":
        assert len(ports) == 1
