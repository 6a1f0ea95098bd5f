"""The fuzz targets (fuzz/targets.py) in the suite: each seed parses (or, named `refused_*`, is refused
with its parser's own error), the targets' own checks (HPACK against the `hpack` package, gRPC messages
reassembled, the transport's output read back) catch what they are there to catch, and each target
runs under atheris for a few thousand inputs from a fixed seed (the same on every machine; `make fuzz`
searches for longer), all of which must run. atheris missing skips the runs, except under `make test`
(TENSORGATE_REQUIRE_FUZZ=1), where it fails them.
Inputs the fuzzer found that once broke a parser are named regression tests here."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorgate.proto.grps.protos.v1 as pb
from fuzz import transport
from fuzz.readback import Mismatch, http1_answers, http2_answers
from fuzz.targets import REFUSED, TARGETS, run_one, seeds
from tensorgate.codec.errors import InferError
from tensorgate.codec.grps import payload_from_message
from tensorgate.server.config_error import ConfigError
from tensorgate.server.endpoints.v2 import error_response
from tensorgate.server.http.grpc_wire import MessageReader
from tensorgate.server.http.hpack_decode import Decoder
from tensorgate.server.model_config import normalize_config
from tensorgate.server.pbtxt import parse_pbtxt
from tensorgate.server.router import HttpRequest, HttpResponse, Router

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = 3000  # inputs per target, from a fixed seed: the same run on every machine

# The seeds that are bad inputs on purpose, and the parser's own error each must be refused with.
REFUSED_SEEDS = {
    ("config_pbtxt", "refused_reshape"): (ConfigError, r"reshape \[\] does not fit dims \[-1\]"),
    ("repository_load", "refused_traversal"): (InferError, "the path must stay within the model directory"),
    ("shared_memory", "refused_past"): (InferError, "Invalid offset \\+ byte size"),
    ("tfserving_predict", "refused_plain_list"): (InferError, "'instances' is a plain list"),
    ("tfserving_grpc_predict", "refused_wrong_dtype"): (InferError, r"Expects arg\[0\] to be DT_FLOAT"),
}


def require_atheris() -> None:
    """Skips without atheris; fails instead where TENSORGATE_REQUIRE_FUZZ is set (make test does)."""
    try:
        import atheris  # noqa: F401
    except ImportError as e:
        if os.environ.get("TENSORGATE_REQUIRE_FUZZ", "") not in ("", "0"):
            pytest.fail(f"atheris is missing ({e}) and TENSORGATE_REQUIRE_FUZZ is set (make test)")
        pytest.skip(f"atheris is missing ({e}); make test requires it")


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_seed_parses_or_is_refused_as_its_name_says(name: str) -> None:
    corpus = seeds(name)
    assert any(not f.startswith(REFUSED) for f, _ in corpus), f"fuzz/corpus/{name} has no valid seed"
    for filename, data in corpus:
        if filename.startswith(REFUSED):
            error, message = REFUSED_SEEDS[name, filename]
            with pytest.raises(error, match=message):
                TARGETS[name](data)
        else:  # no parser's error, and not refused before the parser
            assert TARGETS[name](data) is not None, f"fuzz/corpus/{name}/{filename} did not parse"
            assert run_one(name, data)


def test_every_refused_seed_is_listed() -> None:
    named = {(name, f) for name in TARGETS for f, _ in seeds(name) if f.startswith(REFUSED)}
    assert named == set(REFUSED_SEEDS)


def test_the_transport_seeds_get_their_answers() -> None:
    def statuses(answers: list) -> list[tuple[int, bytes]]:
        return [(a.status, a.body) for a in answers]

    def seed(path: str) -> bytes:
        with open(os.path.join(ROOT, "fuzz", "corpus", path), "rb") as f:
            return f.read()

    expect = [(100, b""), (200, b"abc")]
    assert statuses(transport.http1(seed("http1/expect"))) == expect
    pipelined = [(200, b"hello"), (200, b"one two"), (400, b'{"error":"refused"}')]
    assert statuses(transport.http1(seed("http1/pipelined"))) == pipelined
    assert statuses(transport.http1(seed("http1/after_a_request"))) == [(200, b"hello"), *pipelined]
    streams = transport.http2(seed("http2/requests"))
    assert {i: (s.status, bytes(s.body), s.ended) for i, s in streams.items()} == {
        1: (200, b"abc", True),
        3: (200, b"one two", True),
    }


# --- the targets' own checks ------------------------------------------------------------------------------

_names = st.sampled_from([b"content-type", b"x-a", b"grpc-timeout", b"cookie", b"authorization", b":path"])
_fields = st.lists(st.tuples(st.one_of(_names, st.binary(max_size=20)), st.binary(max_size=60)), max_size=8)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blocks=st.lists(
        st.tuples(_fields, st.booleans(), st.booleans(), st.sampled_from([None, 0, 64, 4096])), max_size=6
    )
)
def test_our_hpack_decoder_and_the_hpack_package_read_what_was_encoded(blocks: list) -> None:
    """Blocks of one connection, encoded by the hpack package (Huffman or not, indexed or never, table
    size updates): our decoder, and the hpack package's, give back the header lists encoded."""
    encoder = hpack.Encoder()
    ours, theirs = Decoder(max_header_list_size=1 << 20), hpack.Decoder(max_header_list_size=1 << 20)
    for fields, huffman, sensitive, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        tuples = [
            (hpack.NeverIndexedHeaderTuple if sensitive else hpack.HeaderTuple)(n, v) for n, v in fields
        ]
        block = encoder.encode(tuples, huffman=huffman)
        assert [tuple(map(bytes, f)) for f in ours.decode(block)] == fields
        assert [tuple(map(bytes, f)) for f in theirs.decode(block, raw=True)] == fields


def test_the_hpack_target_finds_a_decoder_that_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive control of the HPACK target's comparison: our decoder made to drop a header."""
    (_, seed), *_ = seeds("hpack")
    decode = Decoder.decode
    monkeypatch.setattr(Decoder, "decode", lambda self, block: decode(self, block)[:-1])
    with pytest.raises(Mismatch, match="the hpack package's"):
        TARGETS["hpack"](seed)


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(st.tuples(st.booleans(), st.binary(max_size=300)), max_size=8),
    large=st.sampled_from([0, 70_000, 1 << 20]),
    sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
)
def test_grpc_messages_reassemble_to_what_was_framed(messages: list, large: int, sizes: list[int]) -> None:
    """Length-prefixed messages fed to the reader in pieces of any sizes: the same messages come out,
    and nothing is left begun. When asked, a large one too (1 MiB, the limit, is received into numpy
    memory), in pieces scaled up to keep the test quick."""
    if large:
        messages = [*messages, (True, bytes(range(256)) * (large // 256))]
        sizes = [size * (large // 4096) for size in sizes]
    stream = memoryview(b"".join(bytes([c]) + len(m).to_bytes(4, "big") + m for c, m in messages))
    reader, out, start, turn = MessageReader(1 << 20), [], 0, 0
    while start < len(stream):
        size = sizes[turn % len(sizes)]
        reader.feed(stream[start : start + size], out)
        start, turn = start + size, turn + 1
    assert [(c, bytes(m)) for c, m in out] == messages
    assert not reader.partial


def test_the_grpc_target_finds_a_reader_that_loses_a_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive control of the gRPC framing target: the reader made to lose a message's last byte."""
    feed = MessageReader.feed

    def lossy(self: MessageReader, data: memoryview, messages: list) -> None:
        before = len(messages)
        feed(self, data, messages)
        messages[before:] = [(c, bytes(m)[:-1]) for c, m in messages[before:]]

    monkeypatch.setattr(MessageReader, "feed", lossy)
    with pytest.raises(Mismatch, match="reassembled"):
        TARGETS["grpc_framing"](b"\x03\x05hello\x83abc")


OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@pytest.mark.parametrize(
    "out, methods, why",
    [
        (OK_HEAD[:-1], ["GET"], "under content-length"),
        (OK_HEAD + b"HTTP/1.1 200 OK\r\n", ["GET", "GET"], "malformed header line"),
        (OK_HEAD + b"garbage", ["GET"], "no status line"),
        (OK_HEAD, [], "more answers than requests"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab\r\n", ["GET"], "not ended by CRLF"),
        (
            OK_HEAD.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n") + OK_HEAD,
            ["GET"] * 2,
            "after an answer",
        ),
        (OK_HEAD.replace(b"\r\n\r\n", b"\r\ncontent-length: 2\r\n\r\n"), ["GET"], "twice"),
        (OK_HEAD.replace(b"200 OK", b"200 OK Traceback"), ["GET"], None),  # fine: a reason phrase
    ],
)
def test_what_http1_output_does_not_read_back(out: bytes, methods: list[str], why: str | None) -> None:
    """The positive controls of the HTTP/1.1 output check (and one that reads)."""
    if why is None:
        http1_answers(out, methods)
        return
    with pytest.raises(Mismatch, match=why):
        http1_answers(out, methods)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


SERVER_SETTINGS = _frame(4, 0, 0, b"")
STATUS_200 = hpack.Encoder().encode([(":status", "200")])


@pytest.mark.parametrize(
    "frames, why",
    [
        ([_frame(1, 4, 1, STATUS_200)], "does not start with the server's SETTINGS"),
        ([SERVER_SETTINGS, _frame(0, 1, 1, b"x")], "DATA before the stream's headers"),
        (
            [SERVER_SETTINGS, _frame(1, 5, 1, STATUS_200), _frame(0, 1, 1, b"x")],
            "after the stream's END_STREAM",
        ),
        ([SERVER_SETTINGS, _frame(1, 4, 1, b"\xff\xff\xff\xff")], "the hpack package refuses"),
        ([SERVER_SETTINGS, _frame(1, 4, 1, hpack.Encoder().encode([("a", "b")]))], "without one :status"),
        (
            [SERVER_SETTINGS, _frame(1, 0, 1, STATUS_200), _frame(6, 0, 0, bytes(8))],
            "interrupts the header block",
        ),
        ([SERVER_SETTINGS, _frame(6, 1, 1, bytes(8))], "on the wrong stream"),
        ([SERVER_SETTINGS, _frame(8, 0, 0, bytes(4))], "a window increment of 0"),
        ([SERVER_SETTINGS, _frame(0, 0, 1, bytes(16385))], "over the client's 16384"),
        ([SERVER_SETTINGS, _frame(3, 0, 1, bytes(4))[:-1]], "cut"),
    ],
)
def test_what_http2_output_does_not_read_back(frames: list[bytes], why: str) -> None:
    """The positive controls of the HTTP/2 output check."""
    with pytest.raises(Mismatch, match=why):
        http2_answers(b"".join(frames))


def _router_with_echo(handler) -> Router:
    routes = Router(fallback_errors=error_response)
    routes.add("POST", "/echo", handler, error_response)
    return routes


def test_the_transport_targets_fail_on_what_a_client_should_never_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The positive controls of the transport targets: traceback text in an answer, a valid request put
    first (the first byte's bit) that gets no answer, a handler's traceback in the log."""
    text = b"Traceback (most recent call last):"
    with pytest.raises(Mismatch, match="traceback text"):  # the echo sends it back
        transport.http1(b"\x3fPOST /echo HTTP/1.1\r\ncontent-length: %d\r\n\r\n%b" % (len(text), text))

    async def never(request: HttpRequest) -> HttpResponse:
        await asyncio.Event().wait()
        raise AssertionError

    monkeypatch.setattr(transport, "ROUTER", _router_with_echo(never))
    with pytest.raises(Mismatch, match="a valid request got no answer"):
        transport.http1(b"\x40")
    with pytest.raises(Mismatch, match="a valid request got no answer"):
        transport.http2(b"\x80")

    async def broken(request: HttpRequest) -> HttpResponse:
        raise RuntimeError("a bug")

    monkeypatch.setattr(transport, "ROUTER", _router_with_echo(broken))
    with pytest.raises(transport.LoopError, match="the server logged a traceback"):
        transport.http1(b"\x3fPOST /echo HTTP/1.1\r\ncontent-length: 1\r\n\r\nx")


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_short_fuzz_run_runs_every_input_and_finds_nothing(name: str, tmp_path) -> None:
    require_atheris()
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", "--runs", str(RUNS), "--only", name, "--report", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = json.loads(report.read_text())
    assert result["found"] == ""
    assert (result["runs"], result["inputs"]) == (RUNS, RUNS)  # as libFuzzer and as the target counted
    valid = sum(not f.startswith(REFUSED) for f, _ in seeds(name))
    assert result["accepted"] >= valid  # the seeds at least went through the parser


# --- what the fuzzers found (each failed with another exception than the parser's own error) ------------


def test_found_a_config_tensor_name_that_is_not_a_string() -> None:
    """config_json and repository_load, 2026-11-26: `"name": [[[]]]` raised TypeError (unhashable)."""
    doc = {
        "name": "m",
        "backend": "onnxruntime",
        "inputs": [{"name": "I", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": [[[]]], "datatype": "FP32", "shape": [[1]]}],
    }
    with pytest.raises(ConfigError, match="output #0: 'name' must be a string"):
        normalize_config(doc, "m")


@pytest.mark.parametrize("escape", ["\\u", "\\x", "\\U", "\\uZZZZ", "\\UFFFFFFFF"])
def test_found_a_pbtxt_escape_without_its_digits(escape: str) -> None:
    """config_pbtxt, 2026-11-26: `"\\u<"` raised ValueError from int(''); an escape past the last code
    point would have raised it from chr()."""
    with pytest.raises(ConfigError, match="invalid escape"):
        parse_pbtxt(f'name: "a{escape}<"')


def test_found_a_v2_metadata_datatype_that_is_not_a_string() -> None:
    """config_json, 2026-11-26 (second run): `"datatype": [...]` in the metadata form raised TypeError."""
    doc = {
        "name": "m",
        "backend": "onnxruntime",
        "inputs": [{"name": "I", "datatype": ["FP32"], "shape": [1]}],
    }
    with pytest.raises(ConfigError, match="input 'I' has unknown datatype"):
        normalize_config(doc, "m")


def test_found_a_pbtxt_escape_of_a_digit_that_is_not_octal() -> None:
    """config_pbtxt, 2026-11-26 (second run): `\\9` raised ValueError from int('9', 8)."""
    with pytest.raises(ConfigError, match="invalid escape"):
        parse_pbtxt('name: "a\\9"')


def test_found_a_gtensor_dtype_the_enum_does_not_have() -> None:
    """grps_protobuf, 2026-11-26 (second run): dtype 0xfffffff7 parsed as None; int(None) raised."""
    message = pb.GrpsMessage.parse(b"*\x14\n\x12\n\x01a\x10\x07\xff\xff\xff\xfe*\x14\n\x80?\x00\x00\x00@")
    with pytest.raises(InferError, match="unknown dtype"):
        payload_from_message(message)


def test_found_a_gtensors_list_holding_a_number() -> None:
    """grps_protobuf, 2026-11-26 (make test's short run): a field of the wrong wire type inside gtensors
    parsed as an int in the list of tensors; reading its dtype raised AttributeError."""
    message = pb.GrpsMessage.parse(b"*R\x08\x00\x00\x83?\xff\xff\x00\xc3")
    with pytest.raises(InferError, match="malformed GrpsMessage"):
        payload_from_message(message)


def test_found_a_grps_message_with_two_members_of_its_oneof() -> None:
    """grps_protobuf, 2026-11-26: str_data then gtensors on the wire (protobuf allows it) made
    betterproto2 raise RuntimeError; the gRPC door answered an internal error."""
    with pytest.raises(InferError, match="more than one of data_oneof"):
        payload_from_message(pb.GrpsMessage.parse(b'"\x02hi*\x14'))


def test_found_a_streamed_answer_cancelled_before_its_task_first_ran() -> None:
    """http1, 2026-11-26: a malformed request pipelined behind one being answered in a stream closes the
    connection, which cancels the answer's task before that task's first step. The task ended at once,
    but the answer's coroutine (started eagerly, server/http/eager.py) never learned: it stayed suspended
    until the garbage collector closed it, and its stream's generator failed to close ("aclose():
    asynchronous generator is already running"). A model's stream would have stayed open the same way."""
    transport.http1(
        b"\x07POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello"
        b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n"
        b"PO\xad\xab /refuseHTTP/1.1\r\nhost: x\r\ntransfer-e5coding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )


def test_a_task_cancelled_before_its_first_step_cancels_the_eager_coroutine() -> None:
    """The fix of the finding above, at its root: the coroutine eager.start began receives the
    cancellation, and its finally blocks run, even when its task never ran."""
    import asyncio

    from tensorgate.server.http import eager

    async def main() -> list[str]:
        seen: list[str] = []
        never = asyncio.get_running_loop().create_future()

        async def answer() -> None:
            try:
                await never
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("finally")

        task = eager.start(answer(), asyncio.get_running_loop())
        task.cancel()  # before the task's first step
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        return seen

    assert asyncio.run(main()) == ["cancelled", "finally"]


# --- found by the output checks (2026-11-27, the first run that read the output back), fixed in h1.py

AFTER_CLOSE = b"\x3fGET /nothere HTTP/1.1\r\nconnection: close\r\n\r\nGET /echo HTTP/1.1\r\n\r\n"
INSIDE_A_STREAM = b"\x3fGET /stream HTTP/1.1\r\n\r\nBAD\x01 / HTTP/1.1\r\n\r\n"


def test_found_an_answer_after_an_early_answer_that_said_close() -> None:
    """http1: a request answered from its head alone (404) with `connection: close`, as it asked, was
    followed by a 400 for the bytes after it; the client's last request ends what is read."""
    assert [a.status for a in transport.http1(AFTER_CLOSE)] == [404]


def test_found_a_400_written_into_a_streamed_answer() -> None:
    """http1: a malformed request pipelined behind a streamed answer being written got its 400 written
    straight into that answer's chunked body (the client read its status line as a chunk size); it now
    waits its turn and is the last answer."""
    answers = transport.http1(INSIDE_A_STREAM)
    assert [(a.status, a.complete, a.headers.get(b"connection")) for a in answers] == [
        (200, True, None),
        (400, True, b"close"),
    ]


# found by `make test`'s http1 run on 2026-11-27, after the fix above: a request line without a version
# (HTTP/0.9-like, so not keep-alive) answered 404 from its head, then its malformed chunked body got a
# 400 after that answer's `connection: close`.
AFTER_A_LAST_REQUEST = (
    b"GPOST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello"
    b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n"
    b"POST /xefuse[HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n4\r\n\x19bc\r\n0\r\n\r\n"
)


def test_found_a_400_after_the_last_request_was_answered() -> None:
    """The client's last request (not keep-alive) is answered, and nothing after it."""
    answers = transport.http1(AFTER_A_LAST_REQUEST)
    assert [a.status for a in answers] == [200, 200, 200, 404]
    assert answers[-1].headers.get(b"connection") == b"close"


# --- found by `python -m fuzz --runs 3000` (2026-11-27, once issue 28 moved its coverage), fixed in h1.py

CLOSE_THEN_BAD_BODY = b"\x07POST /nothere HTTP/1.0\r\ntransfer-encoding: ochnked\r\n\r\n0\r\nabc0\r\n\r\n"


def test_found_a_400_after_an_early_answer_that_said_close_while_its_body_came() -> None:
    """http1: an HTTP/1.0 request answered from its head alone (404, `connection: close`) whose body,
    still coming, turned out malformed got a 400 written after that last answer; the early answer of a
    client's last request now ends what is read, as `connection: close` says."""
    assert [a.status for a in transport.http1(CLOSE_THEN_BAD_BODY)] == [404]
