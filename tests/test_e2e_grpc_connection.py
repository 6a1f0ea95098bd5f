"""gRPC connection management as grpc-core's servers (so Triton's) do it, with Triton's flags: keepalive PINGs
that find dead peers (--grpc-keepalive-*, --grpc-http2-max-pings-without-data), the maximum connection age's
graceful GOAWAY that L4 load balancers need (--grpc-max-connection-age*), and the compression of inference
answers (--grpc-infer-response-compression-level). Raw HTTP/2 frames show what is on the wire; grpcio shows
what a real client makes of it."""

from __future__ import annotations

import gzip
import struct
import time
import zlib
from collections.abc import Iterator

import grpc
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, stop_all
from grpc_helpers import (
    DIFFS,
    SUMS,
    answer,
    message,
    messages_of,
    open_call,
    outputs,
    simple_request,
    status_of,
)
from h2_wire import ACK, DATA, GOAWAY, NO_ERROR, PING, Frame, H2Wire, frame

import tensorgate.proto.inference as pb
from tensorgate.server.http.grpc_wire import encoding_for_level

pytestmark = pytest.mark.ours  # gRPC is served by our transport only

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
SIMPLE = bytes(simple_request())
ACCEPT_ALL = [("grpc-accept-encoding", "identity,deflate,gzip")]


def _server(factory: pytest.TempPathFactory, name: str, *args: str, log_level: str = "info") -> ServerProcess:
    log = factory.mktemp(name) / "server.log"
    return ServerProcess(EXAMPLES, log, extra_args=args, log_level=log_level).start()


@pytest.fixture(scope="module")
def pinging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Keepalive PINGs every 200 ms, on every connection, with no limit; 200 ms for each ACK."""
    server = _server(
        tmp_path_factory,
        "pinging",
        "--grpc-keepalive-time",
        "200",
        "--grpc-keepalive-timeout",
        "200",
        "--grpc-keepalive-permit-without-calls",
        "true",
        "--grpc-http2-max-pings-without-data",
        "0",
    )
    yield server
    stop_all([server])


@pytest.fixture(scope="module")
def pinging_calls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Keepalive every 200 ms, otherwise Triton's defaults: no PINGs without calls, 2 without data."""
    server = _server(
        tmp_path_factory, "pinging_calls", "--grpc-keepalive-time", "200", "--grpc-keepalive-timeout", "200"
    )
    yield server
    stop_all([server])


@pytest.fixture(scope="module")
def aging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Connections live 500 ms (+-10%); calls in flight then have 1.5 s."""
    server = _server(
        tmp_path_factory,
        "aging",
        "--grpc-max-connection-age",
        "500",
        "--grpc-max-connection-age-grace",
        "1500",
        log_level="debug",
    )
    yield server
    stop_all([server])


@pytest.fixture(scope="module")
def compressing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _server(tmp_path_factory, "compressing", "--grpc-infer-response-compression-level", "high")
    yield server
    stop_all([server])


def _wire(server: ServerProcess) -> H2Wire:
    return H2Wire(("127.0.0.1", server.grpc_port), timeout=5.0).open()


def _goaway(got: Frame) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY."""
    last, code = struct.unpack(">II", got.payload[:8])
    return last & 0x7FFFFFFF, code, got.payload[8:]


def _closed(h2: H2Wire) -> bool:
    """Reads on until the server closes the connection (True), passing over any frame."""
    return h2.frames_until(lambda f: False)[-1] is None


def _pings_for(h2: H2Wire, seconds: float) -> int:
    """The server's PINGs (each ACKed) in the next `seconds`; no GOAWAY meanwhile."""
    count, end = 0, time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            got = h2.read_frame(timeout=left)
        except TimeoutError:
            break
        assert got is not None, "connection closed"
        assert got.kind != GOAWAY, f"GOAWAY {_goaway(got)}"
        if got.kind == PING and not got.flags & ACK:
            count += 1
            h2.send(frame(PING, ACK, 0, got.payload))
    return count


# ------------------------------------------------------------------------------------------ keepalive


def test_a_peer_that_never_acks_the_keepalive_ping_is_closed(pinging: ServerProcess) -> None:
    with _wire(pinging) as h2:
        seen = h2.frames_until(lambda f: f.kind == GOAWAY)
        assert seen[-1] is not None, "closed without GOAWAY"
        # the unanswered PING came first (unless the handshake's reading passed over it)
        assert any(f.kind == PING and not f.flags & ACK for f in seen[:-1]) or len(seen) == 1
        _, code, debug = _goaway(seen[-1])
        assert (code, debug) == (NO_ERROR, b"keepalive watchdog timeout")
        assert _closed(h2)


def test_a_peer_that_acks_stays_connected_and_served(pinging: ServerProcess) -> None:
    with _wire(pinging) as h2:
        assert _pings_for(h2, 1.5) >= 3, "a PING every 200 ms"
        open_call(h2, 1, LIVE, message(bytes(pb.ServerLiveRequest())))
        blocks, data = answer(h2, 1)
        assert status_of(blocks) == (0, "")
        [(_, body)] = messages_of(data)
        assert pb.ServerLiveResponse.parse(body).live
        h2.expect_alive()


def test_keepalive_pings_only_while_a_call_is_open_and_two_without_data(pinging_calls: ServerProcess) -> None:
    """As grpc-core with keepalive_permit_without_calls false: an idle connection gets no PING. With a call
    open, PINGs come, but no more than --grpc-http2-max-pings-without-data (2) until an answer's frames go
    out; then they resume."""
    with _wire(pinging_calls) as h2:
        assert _pings_for(h2, 1.0) == 0, "no call, no PING"
        open_call(h2, 1, STREAM_INFER)  # HEADERS only: the call stays open, nothing is answered yet
        assert _pings_for(h2, 1.5) == 2, "two PINGs, then none until data"
        h2.send(frame(DATA, 0, 1, message(SIMPLE)))  # an answer goes out
        answered = False
        while not answered:
            got = h2.read_frame()
            assert got is not None and got.kind != GOAWAY
            answered = got.kind == DATA and got.stream == 1
        assert _pings_for(h2, 1.5) == 2, "the answer's DATA allows two more"
        h2.send(frame(DATA, 0x1, 1, b""))  # END_STREAM: the call ends
        blocks, _ = answer(h2, 1)
        assert status_of(blocks) == (0, "")


def test_keepalive_flags_take_tritons_spellings(start_server) -> None:
    server = start_server(
        EXAMPLES,
        extra_args=(
            "--grpc-keepalive-time=7200000",
            "--grpc-keepalive-timeout=20000",
            "--grpc-keepalive-permit-without-calls=0",
            "--grpc-http2-max-pings-without-data=2",
            "--grpc-max-connection-age=0",
            "--grpc-max-connection-age-grace=0",
            "--grpc-infer-response-compression-level=NONE",
        ),
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary(
            INFER, request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
        )
        assert outputs(infer(simple_request(), timeout=10)) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


# ------------------------------------------------------------------------------------------ connection age


def test_max_age_is_a_graceful_double_goaway(aging: ServerProcess) -> None:
    """grpc-core's dance: GOAWAY with the largest stream id and a PING; a stream opened meanwhile is
    served; the PING's ACK brings the final GOAWAY (the last stream id, "max_age"); the call in flight
    finishes, then the connection closes."""
    with _wire(aging) as h2:
        open_call(h2, 1, STREAM_INFER)  # in flight across the age
        first = h2.frames_until(lambda f: f.kind == GOAWAY)[-1]
        assert first is not None
        assert _goaway(first) == ((1 << 31) - 1, NO_ERROR, b"")
        ping = h2.frames_until(lambda f: f.kind == PING)[-1]
        assert ping is not None and not ping.flags & ACK
        open_call(h2, 3, LIVE, message(bytes(pb.ServerLiveRequest())))
        assert status_of(answer(h2, 3)[0]) == (0, ""), "a stream opened before the final GOAWAY is served"
        h2.send(frame(PING, ACK, 0, ping.payload))
        final = h2.frames_until(lambda f: f.kind == GOAWAY)[-1]
        assert final is not None
        assert _goaway(final) == (3, NO_ERROR, b"max_age")
        h2.send(frame(DATA, 0x1, 1, message(SIMPLE)))
        blocks, data = answer(h2, 1)
        assert status_of(blocks) == (0, ""), "the call in flight finishes"
        [(_, body)] = messages_of(data)
        response = pb.ModelStreamInferResponse.parse(body)
        assert outputs(response.infer_response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}
        assert _closed(h2)


def test_max_age_grace_ends_calls_that_outlive_it(aging: ServerProcess) -> None:
    with _wire(aging) as h2:
        open_call(h2, 1, STREAM_INFER)  # never ends
        seen = h2.frames_until(lambda f: f.kind == PING)
        assert seen[-1] is not None
        h2.send(frame(PING, ACK, 0, seen[-1].payload))
        later = h2.frames_until(lambda f: False)
        assert later[-1] is None, "closed"
        goaways = [f for f in seen + later[:-1] if f.kind == GOAWAY]
        # the graceful GOAWAY's two, then the grace's end
        assert [_goaway(f)[2] for f in goaways] == [b"", b"max_age", b"max_age"]


def test_grpcio_reconnects_at_each_age_and_no_call_fails(aging: ServerProcess) -> None:
    """A long-lived channel calling on across several ages: every call succeeds, and the server aged
    connections out more than once (its log), so the channel reconnected."""
    with grpc.insecure_channel(f"127.0.0.1:{aging.grpc_port}") as channel:
        infer = channel.unary_unary(
            INFER, request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
        )
        end, calls = time.monotonic() + 2.5, 0
        while time.monotonic() < end:
            assert outputs(infer(simple_request(), timeout=10)) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}
            calls += 1
    assert calls > 10
    assert aging.log_text().count("at its maximum age") >= 2


# ------------------------------------------------------------------------------------------ compression


def test_compression_levels_pick_as_grpc_core_does() -> None:
    every = b"identity,deflate,gzip"
    assert [encoding_for_level(level, every) for level in ("none", "low", "medium", "high")] == [
        None,
        b"gzip",
        b"deflate",
        b"deflate",
    ]
    assert [encoding_for_level(level, b"identity, gzip") for level in ("low", "medium", "high")] == [
        b"gzip"
    ] * 3
    assert encoding_for_level("high", b"identity") is None
    assert encoding_for_level("high", None) is None


@pytest.mark.parametrize(
    ("accepted", "encoding"), [("identity,deflate,gzip", "deflate"), ("identity,gzip", "gzip")]
)
def test_infer_answers_are_compressed_at_level_high(
    compressing: ServerProcess, accepted: str, encoding: str
) -> None:
    with _wire(compressing) as h2:
        open_call(h2, 1, INFER, message(SIMPLE), extra=[("grpc-accept-encoding", accepted)])
        blocks, data = answer(h2, 1)
        assert status_of(blocks) == (0, "")
        assert blocks[0][1]["grpc-encoding"] == encoding
        [(compressed, body)] = messages_of(data)
        assert compressed
        unpacked = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
        assert outputs(pb.ModelInferResponse.parse(unpacked)) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


def test_no_compression_where_the_client_accepts_none_or_the_call_is_not_inference(
    compressing: ServerProcess,
) -> None:
    with _wire(compressing) as h2:
        open_call(h2, 1, INFER, message(SIMPLE))  # no grpc-accept-encoding
        blocks, data = answer(h2, 1)
        assert "grpc-encoding" not in blocks[0][1]
        assert [compressed for compressed, _ in messages_of(data)] == [False]
        open_call(h2, 3, LIVE, message(bytes(pb.ServerLiveRequest())), extra=ACCEPT_ALL)
        blocks, data = answer(h2, 3)
        assert "grpc-encoding" not in blocks[0][1]
        assert [compressed for compressed, _ in messages_of(data)] == [False]


def test_stream_infer_answers_are_compressed_too(compressing: ServerProcess) -> None:
    with _wire(compressing) as h2:
        open_call(h2, 1, STREAM_INFER, message(SIMPLE), extra=ACCEPT_ALL)
        blocks, data = answer(h2, 1)
        assert status_of(blocks) == (0, "")
        assert blocks[0][1]["grpc-encoding"] == "deflate"
        [(compressed, body)] = messages_of(data)
        assert compressed
        response = pb.ModelStreamInferResponse.parse(zlib.decompress(body))
        assert outputs(response.infer_response) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}


def test_grpcio_reads_compressed_answers_as_the_same_tensors(compressing: ServerProcess, v2_server) -> None:
    def infer(port: int) -> pb.ModelInferResponse:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                INFER, request_serializer=bytes, response_deserializer=pb.ModelInferResponse.parse
            )
            return call(simple_request(), timeout=10)

    compressed, plain = infer(compressing.grpc_port), infer(v2_server.grpc_port)
    assert outputs(compressed) == outputs(plain) == {"OUTPUT0": SUMS, "OUTPUT1": DIFFS}
    assert compressed.raw_output_contents == plain.raw_output_contents
