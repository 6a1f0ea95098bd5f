"""gRPC over our HTTP/2, frame by frame (grpc/grpc doc/PROTOCOL-HTTP2.md): what a client sees on the wire,
malformed input included, on the gRPC port and on the HTTP port (one port for everything)."""

from __future__ import annotations

import contextlib
import gzip
import time
import zlib

import httpx
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, write_model
from grpc_helpers import (
    SUMS,
    answer,
    message,
    messages_of,
    open_call,
    simple_request,
    stalled_stream,
    status_of,
    tensor,
)
from h2_wire import (
    ACK,
    DATA,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    NO_ERROR,
    PING,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    WINDOW_UPDATE,
    H2Wire,
    frame,
    settings,
)
from test_e2e_grpc_deadlines import GATED_CONFIG, GATED_MODEL
from test_e2e_grpc_deadlines import request as gated_request

import tensorgate.proto.inference as pb

pytestmark = pytest.mark.ours  # gRPC is served by our transport only

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SIMPLE = bytes(simple_request())


def inference_count(server: ServerProcess, model: str) -> int:
    doc = httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()
    return doc["model_stats"][0]["inference_count"]


@pytest.fixture(params=["grpc-port", "http-port"])
def wire(request: pytest.FixtureRequest, v2_server: ServerProcess):
    port = v2_server.grpc_port if request.param == "grpc-port" else v2_server.port
    with H2Wire(("127.0.0.1", port)) as h2:
        h2.open()
        yield h2


def test_a_call_is_headers_messages_and_trailers(wire: H2Wire) -> None:
    open_call(wire, 1, INFER, message(SIMPLE))
    blocks, data = answer(wire, 1)
    assert len(blocks) == 2, "HEADERS, then trailers"
    flags, head = blocks[0]
    assert not flags & END_STREAM
    assert head[":status"] == "200" and head["content-type"] == "application/grpc"
    assert "gzip" in head["grpc-accept-encoding"]
    assert blocks[1][0] & END_STREAM and status_of(blocks) == (0, "")
    [(compressed, body)] = messages_of(data)
    assert not compressed
    response = pb.ModelInferResponse.parse(body)
    assert response.model_name == "simple"
    assert list(memoryview(response.raw_output_contents[0]).cast("i")) == SUMS


def test_errors_are_trailers_only_with_a_percent_encoded_message(wire: H2Wire) -> None:
    request = bytes(simple_request(model_name="nö model"))
    open_call(wire, 1, INFER, message(request))
    blocks, data = answer(wire, 1)
    assert len(blocks) == 1 and blocks[0][0] & END_STREAM, "one HEADERS frame ends the call"
    head = blocks[0][1]
    assert head[":status"] == "200" and head["content-type"] == "application/grpc"
    assert data == b""
    assert head["grpc-status"] == "5"  # NOT_FOUND
    assert "%C3%B6" in head["grpc-message"], "non-ASCII is percent-encoded (UTF-8)"
    assert status_of(blocks)[1] == "Request for unknown model: 'nö model' is not found"


def test_unknown_method_content_subtype_encoding_and_timeout(wire: H2Wire) -> None:
    open_call(wire, 1, "/inference.GRPCInferenceService/NoSuchMethod", message(b""))
    status, text = status_of(answer(wire, 1)[0])
    assert status == 12 and "NoSuchMethod" in text  # UNIMPLEMENTED
    open_call(wire, 3, INFER, message(SIMPLE), extra=[("content-type", "application/grpc+json")])
    assert status_of(answer(wire, 3)[0])[0] == 12
    open_call(wire, 5, INFER, message(SIMPLE, True), extra=[("grpc-encoding", "snappy")])
    blocks, _ = answer(wire, 5)
    assert status_of(blocks)[0] == 12 and "snappy" in status_of(blocks)[1]
    assert "gzip" in blocks[0][1]["grpc-accept-encoding"], "the answer says what we accept"
    open_call(wire, 7, INFER, message(SIMPLE), extra=[("grpc-timeout", "soon")])
    status, text = status_of(answer(wire, 7)[0])
    assert status == 13 and "grpc-timeout" in text  # INTERNAL, as grpc-go answers it
    open_call(wire, 9, INFER, message(SIMPLE))
    assert status_of(answer(wire, 9)[0]) == (0, ""), "the connection serves on"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_messages_both_ways(wire: H2Wire, encoding: str) -> None:
    """A compressed request is answered compressed, in its encoding: the answer's grpc-encoding header and
    its message's compressed flag (what grpcio, which decompresses without a word, cannot show)."""
    packed = gzip.compress(SIMPLE) if encoding == "gzip" else zlib.compress(SIMPLE)
    open_call(wire, 1, INFER, message(packed, True), extra=[("grpc-encoding", encoding)])
    blocks, data = answer(wire, 1)
    assert status_of(blocks) == (0, "")
    assert blocks[0][1]["grpc-encoding"] == encoding, "answered in the request's encoding"
    [(compressed, body)] = messages_of(data)
    assert compressed
    unpacked = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
    assert pb.ModelInferResponse.parse(unpacked).model_name == "simple"


def test_compressed_flag_without_an_encoding_and_a_bad_prefix_are_internal(wire: H2Wire) -> None:
    open_call(wire, 1, INFER, message(SIMPLE, True))
    status, text = status_of(answer(wire, 1)[0])
    assert status == 13 and "grpc-encoding" in text
    open_call(wire, 3, INFER, b"\x02" + message(SIMPLE)[1:])
    status, text = status_of(answer(wire, 3)[0])
    assert status == 13 and "compressed flag 2" in text
    open_call(wire, 5, INFER, message(SIMPLE)[:-3])  # the stream ends inside the message
    status, text = status_of(answer(wire, 5)[0])
    assert status == 13 and "inside a message" in text
    open_call(wire, 7, INFER, message(b"\xff\xff\xff"))  # not a ModelInferRequest
    assert status_of(answer(wire, 7)[0])[0] == 3  # INVALID_ARGUMENT, as REST answers a malformed body
    wire.expect_alive()


def test_a_message_split_across_many_data_frames(wire: H2Wire) -> None:
    body = message(SIMPLE)
    open_call(wire, 1, INFER)
    wire.send(b"".join(frame(DATA, 0, 1, body[i : i + 1]) for i in range(len(body))))  # 1 byte a frame
    wire.send(frame(DATA, END_STREAM, 1, b""))
    blocks, data = answer(wire, 1)
    assert status_of(blocks) == (0, "")
    assert pb.ModelInferResponse.parse(messages_of(data)[0][1]).model_name == "simple"


def test_an_oversized_message_is_refused_at_its_prefix(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=("--grpc-max-message-bytes", "4096"))
    with H2Wire(("127.0.0.1", server.grpc_port)) as h2:
        h2.open()
        # A prefix announcing 1 GiB and a few bytes of it: the answer comes without the rest.
        open_call(h2, 1, INFER, (1 << 30).to_bytes(5, "big") + b"12345", end=False)
        blocks, _ = answer(h2, 1)
        status, text = status_of(blocks)
        assert status == 8 and "1073741824 bytes" in text and "--grpc-max-message-bytes" in text
        reset = h2.frames_until(lambda f: f.kind == RST_STREAM and f.stream == 1)[-1]
        assert reset.error_code == NO_ERROR, "the client is told to stop sending (as grpc-core does)"
        h2.send(frame(DATA, 0, 1, b"x" * 1000))  # still coming: dropped
        open_call(h2, 3, INFER, message(SIMPLE))
        assert status_of(answer(h2, 3)[0]) == (0, ""), "the connection stays usable"


def test_a_stream_of_messages_in_one_frame_and_across_frames(wire: H2Wire) -> None:
    body = message(SIMPLE) * 5
    open_call(wire, 1, STREAM_INFER)
    wire.send(
        frame(DATA, 0, 1, body[:7]) + frame(DATA, 0, 1, body[7:300]) + frame(DATA, END_STREAM, 1, body[300:])
    )
    blocks, data = answer(wire, 1)
    assert status_of(blocks) == (0, "")
    answers = [pb.ModelStreamInferResponse.parse(m) for _, m in messages_of(data)]
    assert len(answers) == 5 and all(a.infer_response.model_name == "simple" for a in answers)


def test_a_slow_reader_holds_a_stream_at_its_window(v2_server: ServerProcess) -> None:
    """The client's window stops the answers (they are not buffered past it); WINDOW_UPDATE lets them on."""
    before = inference_count(v2_server, "simple")
    with H2Wire(("127.0.0.1", v2_server.grpc_port)) as h2:
        h2.open(settings((S_INITIAL_WINDOW_SIZE, 1000)))
        open_call(h2, 1, STREAM_INFER, message(SIMPLE) * 50)
        got = b""
        while len(got) < 1000:
            f = h2.read_frame()
            if f.kind == DATA:
                got += f.payload
        assert len(got) == 1000, "DATA past the stream's window"
        # Every answer is made (the statistics count the 50), so any that could go has gone before the
        # answer to a PING sent now: none may have, past the window.
        deadline = time.monotonic() + 10
        while inference_count(v2_server, "simple") < before + 50:
            assert time.monotonic() < deadline, "the 50 requests were not all run"
            time.sleep(0.01)
        h2.send(frame(PING, 0, 0, b"window!!"))
        frames = h2.frames_until(lambda f: f.kind == PING and f.flags & ACK)
        assert [f for f in frames if f is None or f.kind == DATA] == [], "DATA past the stream's window"
        h2.send(frame(WINDOW_UPDATE, 0, 1, (1 << 20).to_bytes(4, "big")))
        blocks, data = answer(h2, 1)
        assert status_of(blocks) == (0, "")
        assert len(messages_of(got + data)) == 50


def test_binary_metadata_is_accepted_and_malformed_base64_refused(wire: H2Wire) -> None:
    open_call(wire, 1, INFER, message(SIMPLE), extra=[("x-trace-bin", "AAEC/w"), ("x-user", "ann")])
    assert status_of(answer(wire, 1)[0]) == (0, "")
    open_call(wire, 3, INFER, message(SIMPLE), extra=[("x-trace-bin", "!!not base64!!")])
    status, text = status_of(answer(wire, 3)[0])
    assert status == 13 and "metadata" in text


def test_too_many_pings_is_goaway_enhance_your_calm(start_server) -> None:
    server = start_server(
        EXAMPLES,
        extra_args=(
            "--grpc-http2-min-recv-ping-interval-without-data",
            "60000",
            "--grpc-http2-max-ping-strikes",
            "2",
        ),
    )
    with H2Wire(("127.0.0.1", server.grpc_port)) as h2:
        h2.open()
        for round_no in range(3):  # an answer between PINGs forgives them
            for _ in range(2):
                h2.send(frame(PING, 0, 0, b"keepaliv"))
                assert h2.frames_until(lambda f: f.kind == PING and f.flags & ACK)[-1] is not None
            open_call(h2, 1 + 2 * round_no, INFER, message(SIMPLE))
            assert status_of(answer(h2, 1 + 2 * round_no)[0]) == (0, "")
        for _ in range(4):  # the first PING sets the clock, then 2 strikes, the third is one too many
            h2.send(frame(PING, 0, 0, b"keepaliv"))
        goaway = h2.frames_until(lambda f: f.kind == GOAWAY)[-1]
        assert goaway.error_code == ENHANCE_YOUR_CALM and goaway.payload[8:] == b"too_many_pings"


COUNTING_STREAM_MODEL = """
import pathlib
import numpy as np
HERE = pathlib.Path(__file__).parent

class Model:
    def execute(self, inputs):
        raise NotImplementedError

    async def execute_stream(self, inputs):
        for i in range(1000):
            (HERE / "yielded").write_text(str(i + 1))
            yield {"OUTPUT0": np.full(1000, i, dtype=np.int32)}
"""
COUNTING_STREAM_CONFIG = """
name: "counting"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_slow_reader_pauses_the_models_generator(start_server, repo, mode: str) -> None:
    """Each answer is ~4 KB: a client that gives the default 64 KB of window and reads nothing gets ~16
    of them, and the model's generator waits there instead of running on into memory; in a process of
    its own too (the stream's credit: 8 answers past those the server took)."""
    config = (
        COUNTING_STREAM_CONFIG
        + f'parameters {{ key: "EXECUTION_MODE" value: {{ string_value: "{mode}" }} }}\n'
    )
    version_dir = write_model(repo, "counting", config, {1: COUNTING_STREAM_MODEL}) / "1"
    server = start_server(repo)
    request = pb.ModelInferRequest(
        model_name="counting", inputs=[tensor("INPUT0", "INT32", [1], int_contents=[1])]
    )
    steps, bodies = stalled_stream(server.grpc_port, STREAM_INFER, bytes(request), version_dir / "yielded")
    assert steps < 40, f"the generator ran {steps} steps ahead of a client that reads nothing"
    answers = [pb.ModelStreamInferResponse.parse(body) for body in bodies]
    firsts = [memoryview(a.infer_response.raw_output_contents[0]).cast("i")[0] for a in answers]
    assert firsts == list(range(1000)), "every answer, in order"


def test_requests_that_wait_stop_crediting_the_client(start_server, repo) -> None:
    """Requests to a busy model pile up: past the 64 started ahead of their answers the call holds the
    rest unread and gives the client no window for them; once the model answers, the window opens."""
    version_dir = write_model(repo, "gated", GATED_CONFIG, {1: GATED_MODEL}) / "1"
    server = start_server(repo)
    pad = {"pad": pb.InferParameter(string_param="x" * (64 << 10))}  # 64 KB a request
    gated = pb.ModelInferRequest.parse(gated_request(1))
    one = message(bytes(pb.ModelInferRequest(model_name="gated", inputs=gated.inputs, parameters=pad)))
    try:
        with H2Wire(("127.0.0.1", server.grpc_port), timeout=5) as h2:
            h2.open()
            window = h2.server_settings[S_INITIAL_WINDOW_SIZE]
            open_call(h2, 1, STREAM_INFER, end=False)
            sent, credited = 0, 0
            while sent < window + credited and sent < 256 << 20:
                at = sent % len(one)  # the requests back to back, cut where the window allows
                piece = (one[at:] + one[:at])[: window + credited - sent]
                h2.send(frame(DATA, 0, 1, piece))
                sent += len(piece)
                with contextlib.suppress(TimeoutError):
                    while True:
                        got = h2.read_frame(timeout=0.01)
                        if got.kind == WINDOW_UPDATE and got.stream == 1:
                            credited += int.from_bytes(got.payload, "big")
            assert sent == window + credited < 256 << 20, "the client's window ran out"
            with pytest.raises(TimeoutError):  # and stays out
                h2.frames_until(lambda f: f.kind == WINDOW_UPDATE and f.stream == 1, timeout=0.5)
            assert credited <= 65 * len(one), "credit for the requests started and the one coming, no more"
            (version_dir / "release").write_text("1")
            credit = h2.frames_until(lambda f: f.kind == WINDOW_UPDATE and f.stream == 1, timeout=30)[-1]
            assert credit is not None, "credit again once the model answers"
    finally:
        (version_dir / "release").write_text("1")
