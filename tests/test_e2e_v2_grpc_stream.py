"""KServe v2 over gRPC end to end, ModelStreamInfer and grpcio: one answer per request in order, one per
yield of a streaming model, errors answered in the stream as error_message while it goes on; a client
leaving mid-stream closes the model's generator. grpcio (the C-core HTTP/2 client most users have) calls
the same methods with bytes serialized by our messages."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from e2e_helpers import EXAMPLES, IDENTITY_MODEL, A, B, ServerProcess, int32_config, write_model
from grpc_helpers import (
    DIFFS,
    SERVICE,
    SUMS,
    Stub,
    call,
    open_stream,
    outputs,
    rest,
    simple_request,
    stream,
    tensor,
    text_request,
)

import tensorgate.proto.inference as pb

GOOD0 = tensor("INPUT0", "INT32", [1, 16], int_contents=A)


def test_stream_answers_each_request_in_order_and_survives_errors(v2_server: ServerProcess) -> None:
    requests = [
        simple_request(id="a"),
        simple_request(id="b", model_name="nope"),
        simple_request(b=list(range(16)), id="c"),
        pb.ModelInferRequest(
            model_name="simple",
            id="d",
            inputs=[GOOD0, tensor("INPUT1", "INT32", [1, 3], int_contents=[1, 2, 3])],
        ),
        simple_request(a=B, b=A, id="e"),
    ]
    answers = stream(v2_server, requests)
    assert [(m.error_message == "", m.infer_response.id) for m in answers] == [
        (True, "a"), (False, "b"), (True, "c"), (False, "d"), (True, "e"),
    ]  # fmt: skip
    assert answers[1].error_message == "Request for unknown model: 'nope' is not found"
    assert "unexpected shape for input 'INPUT1'" in answers[3].error_message
    assert "got [1,3]" in answers[3].error_message
    assert outputs(answers[0].infer_response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}
    assert outputs(answers[2].infer_response)["OUTPUT0"] == [2 * x for x in A]
    assert outputs(answers[4].infer_response)["OUTPUT1"] == [-d for d in DIFFS]


def test_streaming_model_answers_one_message_per_word(v2_server: ServerProcess) -> None:
    answers = stream(v2_server, [text_request("the quick brown fox", id="t1"), simple_request(id="after")])
    assert [m.error_message for m in answers] == [""] * 5
    words = [outputs(m.infer_response)["TOKEN"] for m in answers[:4]]
    assert words == [[b"the"], [b"quick"], [b"brown"], [b"fox"]]
    assert {m.infer_response.id for m in answers[:4]} == {"t1"} and answers[4].infer_response.id == "after"


def test_empty_final_response_when_asked(v2_server: ServerProcess) -> None:
    enable = {"triton_enable_empty_final_response": pb.InferParameter(bool_param=True)}
    answers = stream(
        v2_server,
        [text_request("one two", id="w", parameters=enable), simple_request(id="s", parameters=enable)],
    )
    flags = [m.infer_response.parameters["triton_final_response"].bool_param for m in answers]
    assert flags == [False, False, True, True]
    assert answers[2].infer_response.outputs == [] and answers[2].infer_response.id == "w"
    assert outputs(answers[3].infer_response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


def test_every_answer_says_whether_it_is_final(v2_server: ServerProcess) -> None:
    """As Triton: `triton_final_response` on every answer, asked for or not (Triton's C++ client takes an
    answer without it as the last of its request)."""
    answers = stream(v2_server, [text_request("one two", id="w"), simple_request(id="s")])
    flags = [
        (m.infer_response.id, m.infer_response.parameters["triton_final_response"].bool_param)
        for m in answers
    ]
    assert flags == [("w", False), ("w", False), ("s", True)]


def stream_counts(server: ServerProcess, model: str) -> tuple[int, int, int]:
    """(success, fail, execution) counts of `model` from the statistics extension."""
    stats = rest(server, "GET", f"/v2/models/{model}/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"], stats["execution_count"]


def test_streamed_requests_are_counted_in_the_statistics(v2_server: ServerProcess) -> None:
    """perf_analyzer --streaming reads the statistics: a streamed request counts once, when it ends."""
    before = stream_counts(v2_server, "token_stream")
    answers = stream(v2_server, [text_request("one two", id="a"), text_request("three", id="b")])
    assert [m.error_message for m in answers] == [""] * 3
    assert stream_counts(v2_server, "token_stream") == (before[0] + 2, before[1], before[2] + 2)


STREAM_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
# Counts up from INPUT0 for ever, 20 ms a number; says when its generator was closed.
ENDLESS_MODEL = """
import asyncio
from pathlib import Path

import numpy as np


class Model:
    async def execute_stream(self, inputs):
        n = int(inputs["INPUT0"][0])
        try:
            while True:
                yield {"OUTPUT0": np.array([n], np.int32)}
                n += 1
                await asyncio.sleep(0.02)
        finally:
            # written whole, then renamed: the test reads it as soon as it exists
            here = Path(__file__).parent
            (here / "closed.tmp").write_text(str(n))
            (here / "closed.tmp").replace(here / "closed")
"""
# Yields twice, then fails.
FAILING_MODEL = """
import numpy as np


class Model:
    async def execute_stream(self, inputs):
        yield {"OUTPUT0": np.array([1], np.int32)}
        yield {"OUTPUT0": np.array([2], np.int32)}
        raise RuntimeError("out of tokens")
"""


def int_request(model: str, value: int, request_id: str) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model, id=request_id, inputs=[tensor("INPUT0", "INT32", [1], int_contents=[value])]
    )


def test_streaming_model_failing_or_left_mid_stream(start_server, repo: Path) -> None:
    write_model(repo, "endless", STREAM_CONFIG.format(name="endless"), {1: ENDLESS_MODEL})
    write_model(repo, "failing", STREAM_CONFIG.format(name="failing"), {1: FAILING_MODEL})
    write_model(repo, "plain", int32_config("plain"), {1: IDENTITY_MODEL})
    server = start_server(repo)

    answers = stream(server, [int_request("failing", 0, "f"), int_request("plain", 7, "p")])
    failed = "model 'failing' version 1 failed: RuntimeError: out of tokens"
    assert [(m.infer_response.id, m.error_message) for m in answers] == [
        ("f", ""), ("f", ""), ("f", failed), ("p", ""),
    ]  # fmt: skip
    assert [outputs(m.infer_response).get("OUTPUT0") for m in answers] == [[1], [2], None, [7]]
    assert stream_counts(server, "failing") == (0, 1, 0)

    async def leave_early(stub: Stub) -> list[int]:
        async with open_stream(stub) as s:
            await s.send_message(int_request("endless", 10, "e"))
            got = [outputs((await s.recv_message()).infer_response)["OUTPUT0"][0] for _ in range(3)]
            await s.cancel()
        return got

    closed = repo / "endless" / "1" / "closed"
    assert call(server, leave_early) == [10, 11, 12]
    deadline = time.monotonic() + 5
    while not closed.exists():
        assert time.monotonic() < deadline, "the model's generator was not closed when its client left"
        time.sleep(0.02)
    assert 12 <= int(closed.read_text()) < 250, "the generator ran on after its client left"
    deadline = time.monotonic() + 5
    while stream_counts(server, "endless")[1] != 1:  # left early: a failed request, once it is closed
        assert time.monotonic() < deadline, stream_counts(server, "endless")
        time.sleep(0.02)
    assert call(server, lambda s: s.server_live()).live


# --------------------------------------------------------------------------------------------- grpcio


def test_grpcio_client(v2_server: ServerProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{v2_server.grpc_port}") as channel:
        live = channel.unary_unary(
            SERVICE + "ServerLive",
            request_serializer=bytes,
            response_deserializer=pb.ServerLiveResponse.parse,
        )
        assert live(pb.ServerLiveRequest(), timeout=10).live is True
        infer = channel.unary_unary(
            SERVICE + "ModelInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelInferResponse.parse,
        )
        response = infer(simple_request(id="g"), timeout=10)
        assert response.id == "g" and outputs(response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}
        with pytest.raises(grpc.RpcError) as excinfo:
            infer(simple_request(model_name="nope"), timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.NOT_FOUND
        assert excinfo.value.details() == "Request for unknown model: 'nope' is not found"
        streaming = channel.stream_stream(
            SERVICE + "ModelStreamInfer",
            request_serializer=bytes,
            response_deserializer=pb.ModelStreamInferResponse.parse,
        )
        answers = list(
            streaming(
                iter(
                    [simple_request(id="1"), simple_request(id="2", model_name="nope"), text_request("a b")]
                ),
                timeout=20,
            )
        )
        assert [(m.infer_response.id, m.error_message) for m in answers] == [
            ("1", ""), ("2", "Request for unknown model: 'nope' is not found"), ("", ""), ("", ""),
        ]  # fmt: skip
        assert [outputs(m.infer_response)["TOKEN"] for m in answers[2:]] == [[b"a"], [b"b"]]


FINALIZE_MARKING = """
import asyncio
from pathlib import Path

import numpy as np


class Model:
    finalized = False

    async def execute_stream(self, inputs):
        for word in inputs["TEXT"][0].split():
            await asyncio.sleep(0.1)
            yield {"TOKEN": np.array([word + (b"-after-finalize" if self.finalized else b"")], dtype=object)}
            (Path(__file__).parent / "streaming").write_text("yes")

    def finalize(self):
        self.finalized = True
"""


def test_a_request_queued_on_a_stream_never_runs_on_an_unloaded_model(start_server, repo: Path) -> None:
    """Two requests on one ModelStreamInfer call; the model is unloaded while the first streams. The first
    finishes (unload waits for it); the second is answered "not ready" instead of running finalized."""
    source = (EXAMPLES / "token_stream" / "config.pbtxt").read_text()
    write_model(repo, "token_stream", source, {1: FINALIZE_MARKING})
    server = start_server(
        repo, extra_args=("--model-control-mode", "explicit", "--load-model", "token_stream")
    )
    with ThreadPoolExecutor(1) as pool:

        def unload_soon() -> int:
            deadline = time.monotonic() + 10
            while not (repo / "token_stream" / "1" / "streaming").exists():  # the first answer is out
                assert time.monotonic() < deadline, "the stream never started"
                time.sleep(0.01)
            return httpx.post(
                f"{server.base_url}/v2/repository/models/token_stream/unload", timeout=15
            ).status_code

        unloading = pool.submit(unload_soon)
        answers = stream(server, [text_request("a b c d", id="r1"), text_request("e f g h", id="r2")])
        assert unloading.result() == 200
    first = [m for m in answers if m.infer_response and m.infer_response.id == "r1" and not m.error_message]
    assert [outputs(m.infer_response)["TOKEN"] for m in first] == [[b"a"], [b"b"], [b"c"], [b"d"]]
    second = [m for m in answers if m not in first]
    assert len(second) == 1, second
    message = second[0].error_message  # Triton's texts: the version unloading, or the model unloaded
    assert "'token_stream' version 1 is not at ready state" in message or "has no available" in message
