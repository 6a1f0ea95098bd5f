"""Triton's generate extension against a real server, over HTTP/1.1 and HTTP/2: /generate answers one JSON
object, /generate_stream one Server-Sent Event per answer of a decoupled model; request keys become
inputs or parameters as Triton maps them, keys written twice read as Triton reads them; the size limit
on what the JSON expands to; errors before the model runs, as its first answer and after it; a client
that goes away closes the model's stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, assert_error, make_client, write_model
from grps_helpers import ticker_end

# A Triton python model: text_output is the text, its word count as n_words, and the parameters it got.
LLM = """
name: "llm"
backend: "python"
max_batch_size: 4
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "n_words" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "parameters" data_type: TYPE_STRING dims: [ 1 ] }
]
"""
LLM_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            if text[0, 0] == b"boom":
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("it went boom")))
                continue
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            words = text[0, 0].decode().split()
            if limit is not None:
                words = words[: int(limit.as_numpy()[0, 0])]
            text = np.array([[" ".join(words).upper().encode()]], dtype=object)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", text),
                pb_utils.Tensor("n_words", np.array([[len(words)]], dtype=np.int32)),
                pb_utils.Tensor("parameters", np.array([[request.parameters().encode()]], dtype=object)),
            ]))
        return responses
"""
# A decoupled Triton python model: one response per word of text_input; a word "fail" is answered with an
# error response, which ends the stream.
STREAM = """
name: "llm_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
STREAM_PY = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            words = text[0].decode().split()
            threading.Thread(target=self.answer, args=(words, request.get_response_sender())).start()
        return None

    def answer(self, words, sender):
        for word in words:
            if word == "fail":
                error = pb_utils.TritonError("no such word")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                return
            text = pb_utils.Tensor("text_output", np.array([word.encode()], dtype=object))
            sender.send(pb_utils.InferenceResponse([text]))
        sender.send(flags=FINAL)
"""
# tokens (INT64) and a prompt (BYTES), both of any length: the count of tokens
IDS = """
name: "ids"
backend: "python"
max_batch_size: 0
input [
  { name: "prompt" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [ { name: "count" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
IDS_PY = """
import numpy as np

class Model:
    def execute(self, inputs):
        return {"count": np.array([inputs["tokens"].size], dtype=np.int64)}
"""
TICKER_CONFIG = """
name: "ticker"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from e2e_helpers import stop_all
    from grps_helpers import TICKER

    root = tmp_path_factory.mktemp("generate")
    repo = root / "models"
    repo.mkdir()
    write_model(repo, "llm", LLM, {1: LLM_PY})
    write_model(repo, "llm_stream", STREAM, {1: STREAM_PY})
    write_model(repo, "ticker", TICKER_CONFIG, {1: TICKER})
    write_model(repo, "ids", IDS, {1: IDS_PY})
    started = ServerProcess(repo, root / "server.log").start()
    yield started
    stop_all([started])


@pytest.fixture
def client(server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(server.base_url, http_version) as c:
        yield c


def events(response: httpx.Response) -> list[dict]:
    """The Server-Sent Events of a streamed answer: the JSON of each event's `data:` line."""
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    text = response.read().decode()
    assert text.endswith("\n\n"), text
    chunks = text[:-2].split("\n\n")
    assert all(chunk.startswith("data: ") for chunk in chunks), text
    return [json.loads(chunk[len("data: ") :]) for chunk in chunks]


def test_generate_maps_keys_to_inputs_and_parameters(client: httpx.Client) -> None:
    body = {
        "id": "42",
        "text_input": "one two three",
        "parameters": {"max_tokens": 2, "temperature": 0.5, "stream": False, "tag": "x"},
    }
    response = client.post("/v2/models/llm/generate", json=body)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    answer = response.json()
    parameters = json.loads(answer.pop("parameters"))
    assert answer == {
        "id": "42",
        "model_name": "llm",
        "model_version": "1",
        "text_output": "ONE TWO",  # max_tokens (an input) limited it to two words
        "n_words": 2,
    }
    # everything that names no input is a parameter; id too, as Triton passes it
    assert parameters == {"temperature": 0.5, "stream": False, "tag": "x", "id": "42"}
    versioned = client.post("/v2/models/llm/versions/1/generate", json={"text_input": "a b c"})
    assert versioned.json()["text_output"] == "A B C" and "id" not in versioned.json()


def test_generate_stream_sends_one_event_per_response(client: httpx.Client) -> None:
    body = {"text_input": "red green blue"}
    with client.stream("POST", "/v2/models/llm_stream/generate_stream", json=body) as r:
        assert r.status_code == 200
        answers = events(r)
    assert [a["text_output"] for a in answers] == ["red", "green", "blue"]
    assert all(a["model_name"] == "llm_stream" and a["model_version"] == "1" for a in answers)
    # a model that does not stream answers in one event
    with client.stream("POST", "/v2/models/llm/generate_stream", json={"text_input": "x y"}) as r:
        assert [a["text_output"] for a in events(r)] == ["X Y"]


def test_generate_on_a_decoupled_model_needs_exactly_one_response(client: httpx.Client) -> None:
    one = client.post("/v2/models/llm_stream/generate", json={"text_input": "solo"})
    assert one.status_code == 200 and one.json()["text_output"] == "solo"
    # Triton's status for it: 200, sent with the first answer before the second shows the error
    assert_error(
        client.post("/v2/models/llm_stream/generate", json={"text_input": "two words"}),
        200,
        "generate expects model to produce exactly 1 response",
    )


def test_errors_before_the_first_answer_have_their_status(client: httpx.Client) -> None:
    for path in ("/generate", "/generate_stream"):
        assert_error(client.post(f"/v2/models/nosuch{path}", json={}), 404, "nosuch")
        bad_parameter = {"text_input": "x", "parameters": {"stop": ["a", "b"]}}
        assert_error(
            client.post(f"/v2/models/llm{path}", json=bad_parameter),
            400,
            "parameter 'stop' has invalid type. It should be either 'int', 'bool', or 'string'.",
        )
        assert_error(
            client.post(f"/v2/models/llm{path}", json={"text_input": "x", "parameters": 3}),
            500,  # Triton's: its JSON reader's errors are INTERNAL
            "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object",
        )
        assert_error(
            client.post(f"/v2/models/llm_stream{path}", json={"text_input": ["x", "y"]}),
            400,
            "The schema can not convert input 'text_input' to tensor with proper shape",
        )
        assert_error(client.post(f"/v2/models/llm{path}", content=b"{"), 400, "malformed JSON")
        assert_error(
            client.post(f"/v2/models/llm{path}", json={"id": 7, "text_input": "x"}),
            500,
            "Unable to parse 'id': attempt to access JSON non-string as string",
        )


@pytest.mark.parametrize("value", [5, ["a", 5], None, True, {"a": "b"}])
def test_a_bytes_input_takes_only_strings(client: httpx.Client, value: object) -> None:
    for model, name in (("llm", "text_input"), ("ids", "prompt")):
        assert_error(
            client.post(f"/v2/models/{model}/generate", json={name: value}),
            500,  # Triton's: its JSON reader's errors are INTERNAL
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        )


def test_keys_written_twice_read_as_triton_reads_them(client: httpx.Client) -> None:
    """RapidJSON keeps both members and finds the first: an input given twice is added twice, which
    Triton's core refuses; a parameter or id given twice is read as its first value."""
    twice = b'{"text_input": "a b", "text_input": "c"}'
    for path in ("/generate", "/generate_stream"):
        assert_error(
            client.post(f"/v2/models/llm{path}", content=twice),
            400,
            "[request id: <id_unknown>] input 'text_input' already exists in request",
        )
    assert_error(
        client.post("/v2/models/llm/generate", content=b'{"id": "7", "text_input": "a", "text_input": "a"}'),
        400,
        "[request id: 7] input 'text_input' already exists in request",
    )
    nested = b'{"text_input": "a", "parameters": {"max_tokens": 1, "text_input": "b"}}'
    assert_error(
        client.post("/v2/models/llm/generate", content=nested),
        400,
        "Converting keyword: 'parameters': [request id: <id_unknown>] input 'text_input' already exists",
    )
    body = b'{"id": "1", "text_input": "x y", "tag": "first", "id": "2", "tag": "second"}'
    answer = client.post("/v2/models/llm/generate", content=body).json()
    assert answer["id"] == "1" and answer["text_output"] == "X Y"
    assert json.loads(answer["parameters"]) == {"id": "1", "tag": "first"}


def test_what_the_json_expands_to_is_limited(client: httpx.Client) -> None:
    """Triton's --http-max-input-size (64 MiB by default) bounds the tensor bytes of a request's inputs,
    added up in the order they come: 8 bytes per INT64 token, a string's bytes and 4 for its length."""
    assert (
        client.post("/v2/models/ids/generate", json={"prompt": "hi", "tokens": [1, 2, 3]}).json()["count"]
        == 3
    )
    tokens = 1 << 23  # 64 MiB of INT64, written as 16 MiB of JSON
    body = b'{"prompt": "hi", "tokens": [' + b"0," * (tokens - 1) + b"0]}"
    assert_error(
        client.post("/v2/models/ids/generate", content=body),
        400,
        f"request size of 6 bytes with input 'tokens' of size {8 * tokens} bytes exceeds the maximum allowed "
        f"input size of {1 << 26}. Use --http-max-input-size to increase the limit.",
    )
    alone = b'{"tokens": [' + b"0," * (tokens - 1) + b"0]}"  # exactly the limit: it runs
    assert client.post("/v2/models/ids/generate", content=alone).json()["count"] == tokens


def test_a_failure_as_the_first_answer_is_an_error_event(client: httpx.Client) -> None:
    """As Triton: once the model runs, /generate_stream answers in events, a failure too, with its
    status; /generate answers it as a JSON error."""
    for model, text, message in (("llm_stream", "fail", "no such word"), ("llm", "boom", "it went boom")):
        with client.stream("POST", f"/v2/models/{model}/generate_stream", json={"text_input": text}) as r:
            assert r.status_code == 500
            assert events(r) == [{"error": message}]
        assert_error(client.post(f"/v2/models/{model}/generate", json={"text_input": text}), 500, message)


def test_an_error_after_the_first_answer_is_an_error_event(client: httpx.Client) -> None:
    with client.stream("POST", "/v2/models/llm_stream/generate_stream", json={"text_input": "ok fail"}) as r:
        assert r.status_code == 200
        answers = events(r)
    assert answers[0]["text_output"] == "ok"
    assert answers[1:] == [{"error": "no such word"}]


def test_a_client_that_goes_away_closes_the_model_stream(
    server: ServerProcess, http_version: str, tmp_path: Path
) -> None:
    marker = tmp_path / "closed"
    with make_client(server.base_url, http_version) as c:
        body = {"TEXT": str(marker)}
        with c.stream("POST", "/v2/models/ticker/generate_stream", json=body) as response:
            received = b""
            for piece in response.iter_raw():
                received += piece
                if received.count(b"\n\n") >= 2:
                    break
    assert json.loads(received.split(b"\n\n")[0][len(b"data: ") :])["TOKEN"] == "tick 0"
    assert ticker_end(marker).startswith("closed after"), "the model's stream was not closed"
