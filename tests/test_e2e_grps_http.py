"""grps over REST (/grps/v1/...) against a real server, with httpx over HTTP/1.1 and HTTP/2: every route,
every payload kind, model selection, status mirrored as the HTTP status, errors, offline (streaming:
test_e2e_grps_http_streaming.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import ServerFactory
from e2e_helpers import (
    A,
    B,
    assert_connection_reused,
    make_client,
    write_model,
)
from grps_helpers import (
    OK_STATUS,
    PREDICT,
    bytes_config,
    echo_version,
    failure,
    gtensor,
    ok,
    predict,
    write_grps_repository,
)

# ------------------------------------------------------------------------------- health, metadata


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("route", ["health/live", "health/ready", "health/online"])
def test_health_routes_answer_get_and_post(client: httpx.Client, method: str, route: str) -> None:
    response = client.request(method, f"/grps/v1/{route}", content=b"{}" if method == "POST" else None)
    assert ok(response) == {"status": OK_STATUS}


def test_server_metadata_is_yaml_in_str_data(client: httpx.Client) -> None:
    for response in (
        client.get("/grps/v1/metadata/server"),
        client.post("/grps/v1/metadata/server", content=b"{}"),
    ):
        text = ok(response)["str_data"]
        assert text.startswith("server:\n  name: tensorgate\n")
        assert '  - name: simple\n    versions:\n      - "1"\n    ready: true\n' in text
        assert "\nonline: true\n" in text and "\ndefault_model: null\n" in text


def test_model_metadata_is_yaml_with_grps_dtypes(client: httpx.Client) -> None:
    for name in ("simple", "simple-1"):
        text = ok(client.post("/grps/v1/metadata/model", json={"str_data": name}))["str_data"]
        assert text.startswith(
            'name: simple\nversions:\n  - "1"\nplatform: python\ninputs:\n  - name: INPUT0\n'
        )
        assert "    datatype: INT32\n    shape:\n      - -1\n      - 16\n    dtype: DT_INT32\n" in text
        assert text.endswith("max_batch_size: 8\nstreaming: false\n")
    stream_text = ok(client.post("/grps/v1/metadata/model", json={"strData": "token_stream"}))["str_data"]
    assert "dtype: DT_STRING" in stream_text and stream_text.endswith("streaming: true\n")
    failure(
        client.post("/grps/v1/metadata/model", json={"str_data": "nosuch"}), 404, "unknown model 'nosuch'"
    )
    failure(
        client.post("/grps/v1/metadata/model", json={"str_data": "simple-9"}),
        404,
        "'simple' version 9 is not found",
    )
    failure(client.post("/grps/v1/metadata/model", json={"str_data": ""}), 400, "no model name")
    failure(client.post("/grps/v1/metadata/model", json={"gmap": {"s_s": {"a": "b"}}}), 400, "as str_data")
    response = client.get("/grps/v1/metadata/model")
    failure(response, 405, "use POST")
    assert response.headers["allow"] == "POST"


# -------------------------------------------------------------------------------------- inference


def test_gtensors_by_name_in_either_json_spelling(client: httpx.Client) -> None:
    for body in (
        {
            "model": "simple",
            "gtensors": {
                "tensors": [
                    gtensor("INPUT0", "DT_INT32", [1, 16], A),
                    gtensor("INPUT1", "DT_INT32", [1, 16], B),
                ]
            },
        },
        {
            "model": "simple",
            "gtensors": {
                "tensors": [
                    gtensor("INPUT1", 4, [1, 16], B, "flatInt32"),
                    gtensor("INPUT0", 4, [1, 16], A, "flatInt32"),
                ]
            },
        },
    ):
        tensors = ok(predict(client, body))["gtensors"]["tensors"]
        assert tensors == [
            gtensor("OUTPUT0", "DT_INT32", [1, 16], [a + b for a, b in zip(A, B, strict=True)]),
            gtensor("OUTPUT1", "DT_INT32", [1, 16], [a - b for a, b in zip(A, B, strict=True)]),
        ]


def test_ndarray_fills_the_float_input_and_return_ndarray_answers_one(client: httpx.Client) -> None:
    doc = ok(
        predict(client, {"ndarray": [[1], [2], [5]]}, model="half_plus_two", **{"return-ndarray": "true"})
    )
    assert doc == {"status": OK_STATUS, "ndarray": [[2.5], [3.0], [4.5]]}
    plain = ok(predict(client, {"ndarray": [0.5, -1]}, model="identity_fp32"))
    assert plain["gtensors"]["tensors"] == [gtensor("OUTPUT0", "DT_FLOAT32", [2], [0.5, -1.0])]
    both_ways = ok(
        predict(client, {"ndarray": [0.25, 8]}, model="identity_fp32", **{"return-ndarray": "TRUE"})
    )
    assert both_ways["ndarray"] == [0.25, 8.0]
    ints = {
        "gtensors": {
            "tensors": [gtensor("INPUT0", "DT_INT32", [1, 16], A), gtensor("INPUT1", "DT_INT32", [1, 16], B)]
        }
    }
    response = predict(client, ints, model="simple", **{"return-ndarray": "true"})
    failure(
        response, 400, "return-ndarray needs one floating-point output", "OUTPUT0 (INT32), OUTPUT1 (INT32)"
    )


def test_str_data_answers_str_data(client: httpx.Client) -> None:
    doc = ok(predict(client, {"str_data": "hello grps ☺", "model": "simple_identity"}))
    assert doc == {"status": OK_STATUS, "str_data": "hello grps ☺"}


def test_octet_stream_is_bin_data_both_ways(client: httpx.Client) -> None:
    raw = bytes(range(256)) * 3
    response = predict(client, raw=raw, model="simple_identity")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.content == raw
    as_json = predict(client, {"bin_data": "AP8=", "model": "simple_identity"})
    assert as_json.headers["content-type"] == "application/octet-stream" and as_json.content == b"\x00\xff"


def test_gmap_values_go_to_inputs_by_key(client: httpx.Client) -> None:
    for body in ({"gmap": {"s_f": {"x": 3}}}, {"gmap": {"sI32": {"x": 3}}}, {"gmap": {"s_d": {"x": "3"}}}):
        doc = ok(predict(client, body, model="half_plus_two"))
        assert doc == {"status": OK_STATUS, "gmap": {"s_f": {"y": 3.5}}}


def test_several_output_elements_come_back_as_gtensors(client: httpx.Client) -> None:
    doc = ok(predict(client, {"str_data": "streaming models answer plainly too", "model": "token_stream"}))
    words = ["streaming", "models", "answer", "plainly", "too"]
    assert doc["gtensors"]["tensors"] == [gtensor("TOKEN", "DT_STRING", [5], words)]


def test_model_selection_name_version_body_wins_over_query(grps_client: httpx.Client) -> None:
    def answer(body: dict, **params: str) -> str:
        return ok(predict(grps_client, {"str_data": "x", **body}, **params))["str_data"]

    assert answer({"model": "echo"}) == "v2:x"  # the newest version
    assert answer({"model": "echo-1"}) == "v1:x"
    assert answer({}, model="echo-1") == "v1:x"
    assert answer({"model": "echo-2"}, model="echo-1") == "v2:x"
    assert answer({"model": "my-model"}) == "v7:x"
    assert answer({"model": "my-model-1"}) == "v7:x"
    failure(predict(grps_client, {"str_data": "x", "model": "echo-3"}), 404, "'echo' version 3 is not found")
    failure(predict(grps_client, {"str_data": "x"}, model="nosuch"), 404, "unknown model 'nosuch'")
    failure(predict(grps_client, {"str_data": "x"}), 400, "no model selected", "--grps-default-model")


def test_default_model_from_the_flag_or_the_only_model(start_server: ServerFactory, tmp_path: Path) -> None:
    both = write_grps_repository(tmp_path / "both")
    with make_client(
        start_server(both, extra_args=("--grps-default-model", "echo-1")).base_url, "http1"
    ) as c:
        assert ok(predict(c, {"str_data": "a"}))["str_data"] == "v1:a"
        assert ok(predict(c, {"str_data": "a", "model": "echo-2"}))["str_data"] == "v2:a"
    single = tmp_path / "single"
    write_model(single, "only", bytes_config("only"), {3: echo_version(3)})
    with make_client(start_server(single).base_url, "http2") as c:
        assert ok(predict(c, {"str_data": "b"}))["str_data"] == "v3:b"
        assert "\ndefault_model: only\n" in ok(c.get("/grps/v1/metadata/server"))["str_data"]


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "params", "code", "fragment"),
    [
        (b"{", {}, 400, "malformed JSON"),
        (b"", {}, 400, "body is empty"),
        (b"{}", {"model": "simple"}, 400, "carries no data"),
        (
            b'{"model": "simple", "gtensors": {"tensors": [{"name": "INPUT0", "flat_int32": [1, 2, 3]}]}}',
            {},
            400,
            "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [3]",
        ),
        (
            b'{"model": "simple", "gmap": {"s_i32": {"NOPE": 1}}}',
            {},
            400,
            "unexpected inference input 'NOPE' for model 'simple'",
        ),
        (b'{"str_data": "1"}', {"model": "simple_string"}, 400, "model 'simple_string' has 2 of them"),
        (b'{"ndarray": [1]}', {"model": "simple"}, 400, "only floating-point input"),
        (
            b'{"gmap": {"s_f": {"x": 1.5}}}',
            {"model": "simple", "x": "1"},
            400,
            "unexpected inference input 'x'",
        ),
        (
            b'{"gmap": {"s_s": {"x": "1"}}}',
            {"model": "half_plus_two"},
            400,
            "is FP32: DT_STRING values cannot fill it",
        ),
        (b'{"str_data": "x", "model": "simple-x"}', {}, 404, "'simple' version x is not found"),
        (
            b'{"gtensors": {"tensors": [{"name": "x", "dtype": "DT_FLOAT64", "flat_float64": [1e300]}]}}',
            {"model": "half_plus_two"},
            400,
            "input 'x' is FP32: the values are outside its range",
        ),
        (
            b'{"model": "simple", "gtensors": {"tensors": [{"name": "INPUT0", "flat_int32": 0}]}}',
            {},
            400,
            "flat_int32 must be a list",
        ),
    ],
)
def test_bad_requests_get_their_status_and_keep_the_connection(
    client: httpx.Client, body: bytes, params: dict, code: int, fragment: str
) -> None:
    response = client.post(PREDICT, content=body, params=params, headers={"content-type": "application/json"})
    failure(response, code, fragment)
    assert_connection_reused(client, response)


def test_wrong_method_and_model_failures(grps_client: httpx.Client) -> None:
    response = grps_client.get(PREDICT)
    failure(response, 405, "use POST")
    assert response.headers["allow"] == "POST"
    failure(
        predict(grps_client, {"str_data": "x", "model": "broken"}),
        500,
        "model 'broken'",
        "RuntimeError: kaput",
    )
    failure(
        predict(grps_client, {"str_data": "x", "model": "unloadable"}),
        503,
        "'unloadable' has no available versions",
        "cannot load",
    )
    failure(predict(grps_client, raw=b"x" * 70000, model="echo"), 413, "--max-request-bytes")
    assert_connection_reused(grps_client, predict(grps_client, {"str_data": "x", "model": "echo"}))


# ------------------------------------------------------------------------------------------ offline


def test_offline_drains_every_readiness_probe_while_requests_are_served(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_model(repository, "echo", bytes_config("echo"), {1: echo_version(1)})
    server = start_server(repository)
    for version in ("http1", "http2"):
        with make_client(server.base_url, version) as c:
            ok(c.get("/grps/v1/health/ready"))
            assert c.get("/v2/health/ready").status_code == 200
            ok(c.post("/grps/v1/health/offline", content=b"{}"))
            failure(c.get("/grps/v1/health/ready"), 503, "offline")
            failure(c.post("/grps/v1/health/ready"), 503, "offline")
            ready = c.get("/v2/health/ready")
            assert (ready.status_code, ready.json()) == (400, {"ready": False})
            ok(c.get("/grps/v1/health/live"))
            assert c.get("/v2/health/live").status_code == 200
            assert ok(predict(c, {"str_data": "still served"}))["str_data"] == "v1:still served"
            ok(c.get("/grps/v1/health/online"))
            ok(c.get("/grps/v1/health/ready"))
            assert c.get("/v2/health/ready").json() == {"ready": True}
