"""Triton's generate extension against a real server, over HTTP/1.1 and HTTP/2: /generate answers one JSON
object, /generate_stream one Server-Sent Event per answer of a decoupled model; request keys become
inputs or parameters as Triton maps them; errors before and after the first answer; a client that goes
away closes the model's stream."""

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
    assert_error(
        client.post("/v2/models/llm_stream/generate", json={"text_input": "two words"}),
        500,
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
            400,
            "Expected JSON object for keyword: 'parameters'",
        )
        assert_error(
            client.post(f"/v2/models/llm_stream{path}", json={"text_input": ["x", "y"]}),
            400,
            "The schema can not convert input 'text_input' to tensor with proper shape",
        )
        assert_error(client.post(f"/v2/models/llm{path}", json={"text_input": 5}), 400, "text_input")
        assert_error(client.post(f"/v2/models/llm{path}", content=b"{"), 400, "malformed JSON")
    first = client.post("/v2/models/llm_stream/generate_stream", json={"text_input": "fail"})
    assert_error(first, 500, "no such word")


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
