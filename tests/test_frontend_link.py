"""A worker's end of the link to the engine (server/frontend.py LinkedEngine, server/link.py): answers
that arrive for calls the worker has already given up on are dropped, and the link keeps working; no call
waits forever (a message that cannot be handled, bytes that do not decode, an engine that never answers);
a link whose engine does not read holds new calls back."""

import asyncio
import contextlib
import socket
import time
from typing import Any

import numpy as np
import pytest

from tensorgate.codec import ipc
from tensorgate.codec import messages as msg
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.framing import LENGTH, pack, unpack
from tensorgate.codec.tensor import InferRequest, InferResponse, Tensor
from tensorgate.server.arena import YOURS, Arena
from tensorgate.server.frontend import LinkedEngine


class Version:
    """A version of the engine's, as a worker knows it (no scheduler of its own)."""

    version_str = "1"
    scheduler = None


def arrive(client: LinkedEngine, message: Any) -> None:
    """`message` read from the socket, as the event loop hands it to the link."""
    data = pack(message)
    framed = LENGTH.pack(len(data)) + data
    client.link.get_buffer(len(framed))[: len(framed)] = framed
    client.link.buffer_updated(len(framed))


def request() -> InferRequest:
    return InferRequest("m", inputs=[Tensor("I", "INT32", (1,), np.ones(1, np.int32))])


def answer(value: int) -> msg.Response:
    return ipc.response_out(
        InferResponse("m", "1", [Tensor("O", "INT32", (1,), np.full(1, value, np.int32))])
    )


def test_an_answer_to_a_call_cancelled_in_the_same_pass_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        client = LinkedEngine()
        left = asyncio.create_task(client.infer(Version(), request()))
        await asyncio.sleep(0)  # sent; waiting for the engine
        left.cancel()  # the client went away: the wait ends at once, the task learns of it on its next step
        arrive(client, msg.Result(client.next_id, answer(1)))  # the engine's answer is already here
        arrive(client, msg.Error(client.next_id, "invalid argument", "late"))
        with pytest.raises(asyncio.CancelledError):
            await left
        assert client.calls == {}
        served = asyncio.create_task(client.infer(Version(), request()))  # the link still serves
        await asyncio.sleep(0)
        arrive(client, msg.Result(client.next_id, answer(7)))
        assert int((await served).outputs[0].data[0]) == 7

    asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


def test_a_message_whose_handling_raises_fails_its_call_and_the_link_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A RESULT without its payload (an engine's bug): the decoder refuses it, and the call it names
    fails now, with INTERNAL, instead of waiting for an answer that was dropped; the next call is
    answered."""

    async def scenario() -> None:
        client = LinkedEngine()
        broken = asyncio.create_task(client.infer(Version(), request()))
        await asyncio.sleep(0)
        arrive(client, [msg.RESULT, client.next_id])
        with pytest.raises(InferError) as failed:
            await asyncio.wait_for(broken, 5)
        assert failed.value.kind is ErrorKind.INTERNAL
        assert "the engine's answer could not be read (Invalid)" in failed.value.message
        served = asyncio.create_task(client.infer(Version(), request()))
        await asyncio.sleep(0)
        arrive(client, msg.Result(client.next_id, answer(7)))
        assert int((await served).outputs[0].data[0]) == 7

    asyncio.run(scenario())
    assert (
        "a message over the link does not match its kind: Expected `array` of at least length 3, got 2"
        in caplog.text
    )


async def linked(client: LinkedEngine) -> socket.socket:
    """The client's link on one end of a socketpair; the other end (the engine's), raw."""
    ours, engine = socket.socketpair()
    await asyncio.get_running_loop().create_unix_connection(lambda: client.link, sock=ours)
    engine.setblocking(False)
    return engine


async def engine_reads(engine: socket.socket) -> list:
    """The messages the worker sent so far."""
    await asyncio.sleep(0.05)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := engine.recv(65536):
            data += chunk
    messages = []
    while data:
        (length,) = LENGTH.unpack_from(data)
        messages.append(unpack(data[4 : 4 + length]))
        data = data[4 + length :]
    return messages


def test_bytes_that_do_not_decode_end_the_link_and_fail_every_call() -> None:
    async def scenario() -> None:
        client = LinkedEngine()
        engine = await linked(client)
        waiting = asyncio.create_task(client.infer(Version(), request()))
        await asyncio.sleep(0)
        engine.send(LENGTH.pack(3) + b"\xc1\xc1\xc1")  # 0xc1: never used in MessagePack
        with pytest.raises(InferError) as failed:
            await asyncio.wait_for(waiting, 5)
        assert failed.value.kind is ErrorKind.UNAVAILABLE
        assert client.gone.is_set()
        engine.close()

    asyncio.run(scenario())


def test_a_call_the_engine_never_answers_fails_at_the_deadline_and_is_cancelled_there() -> None:
    async def scenario() -> None:
        client = LinkedEngine(call_timeout=0.5)
        engine = await linked(client)
        started = time.monotonic()
        with pytest.raises(InferError) as failed:
            await asyncio.wait_for(client.infer(Version(), request()), 5)
        waited = time.monotonic() - started
        assert failed.value.kind is ErrorKind.UNAVAILABLE
        assert "did not answer within 0.5 s (--worker-call-timeout)" in failed.value.message
        assert 0.5 <= waited < 2.5  # the sweep runs each second
        kinds = [message[0] for message in await engine_reads(engine)]
        assert kinds == [msg.INFER, msg.CANCEL]
        assert client.calls == {} and client.heard == {}
        engine.close()

    asyncio.run(scenario())


def test_a_stream_whose_reader_is_behind_is_not_timed_out() -> None:
    """The deadline is the engine's silence while the worker waits: answers waiting for their reader
    keep the stream alive past it."""

    async def scenario() -> None:
        client = LinkedEngine(call_timeout=0.5)
        engine = await linked(client)
        stream = client.infer_stream(Version(), request())
        first = asyncio.create_task(anext(stream))
        await asyncio.sleep(0.05)
        for value in (1, 2):
            arrive(client, msg.Message(client.next_id, answer(value)))
        assert int((await first).outputs[0].data[0]) == 1
        await asyncio.sleep(1.6)  # the reader is slow: the second answer waits for it
        assert int((await anext(stream)).outputs[0].data[0]) == 2
        arrive(client, msg.End(client.next_id))
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        kinds = [message[0] for message in await engine_reads(engine)]
        assert msg.CANCEL not in kinds
        engine.close()

    asyncio.run(scenario())


def test_while_the_engine_does_not_read_new_calls_wait_and_then_go() -> None:
    async def scenario() -> None:
        client = LinkedEngine()
        engine = await linked(client)
        client.link.pause_writing()  # as the transport says when the socket's buffer is full
        waiting = asyncio.create_task(client.infer(Version(), request()))
        assert [m[0] for m in await engine_reads(engine)] == []
        client.link.resume_writing()
        assert [m[0] for m in await engine_reads(engine)] == [msg.INFER]
        arrive(client, msg.Result(client.next_id, answer(3)))
        assert int((await waiting).outputs[0].data[0]) == 3
        engine.close()

    asyncio.run(scenario())


def test_an_answer_over_this_workers_arena_is_read_before_the_release_that_follows_it() -> None:
    """An identity model answers its input, which lies in this worker's arena: the engine's answer names
    it (YOURS) and the engine's Release of its own view follows in the same read. The answer's tensor
    must be taken before that Release frees the region (it was: `offset outside every region in use`)."""

    async def scenario() -> None:
        client = LinkedEngine((Arena(1 << 20), Arena(1 << 20)))
        values = np.arange(30_000, dtype=np.float32)  # 120 KB: past INLINE_MAX, it crosses in the arena
        request = InferRequest("m", inputs=[Tensor("I", "FP32", values.shape, values)])
        answered = asyncio.create_task(client.infer(Version(), request))
        await asyncio.sleep(0)
        (offset,) = client.arenas.mine.regions  # copied there once, held for the engine
        echoed = msg.Tensor("O", "FP32", [30_000], [YOURS, offset, values.nbytes])
        data = b"".join(
            LENGTH.pack(len(body)) + body
            for body in (
                pack(msg.Result(client.next_id, msg.Response("m", "1", None, None, [echoed]))),
                pack(msg.Release(offset)),
            )
        )
        client.link.get_buffer(len(data))[: len(data)] = data
        client.link.buffer_updated(len(data))
        response = await asyncio.wait_for(answered, 5)
        np.testing.assert_array_equal(response.outputs[0].data.view(np.float32), values)
        del response, answered  # the task keeps its result
        assert client.arenas.mine.regions == {}  # freed once the answer is gone

    asyncio.run(scenario())


def test_a_worker_builds_only_the_front_end_and_forwards_every_other_route_and_method() -> None:
    """What a worker serves itself is inference on every protocol, REST and gRPC alike (server/assembly.py
    install_front_end); every other route and method, and any path it has no route for, goes to the
    engine, which answers it (404 and 405 too) as the one server it is."""
    from tensorgate.server import assembly
    from tensorgate.server.engine_client import InProcess
    from tensorgate.server.log_settings import LogControl, LogSettings
    from tensorgate.server.options import build_parser
    from tensorgate.server.router import HttpRequest, body_response
    from tensorgate.server.served_models import ServedModels
    from tensorgate.server.shared_memory import SharedMemory
    from tensorgate.server.tracing.settings import TraceSetting
    from tensorgate.server.tracing.tracer import Tracer

    forwarded: list[tuple[str, ...]] = []

    class Engine:
        async def http(self, port: str, request: HttpRequest) -> Any:
            forwarded.append((port, request.method, request.path))
            return body_response(b"the engine's")

        async def grpc(self, path: str, call: Any) -> None:
            forwarded.append(("grpc", path))

    args = build_parser().parse_args(["--model-repository", "unused"])
    args.http_restrictions = args.grpc_restrictions = {}  # as server/cli.py leaves them
    args.http_forward = args.grpc_forward = None
    repository, shared_memory, tracer = ServedModels(), SharedMemory(False), Tracer(TraceSetting())
    client = InProcess(repository, shared_memory)  # an EngineClient: what the front end asks for
    worker = assembly.build_worker(args, client, tracer, Engine())
    routes = [route for routes in worker.routers["HTTP"].routes.values() for route in routes]
    served = {f"{type(route.handler.__self__).__name__}.{route.handler.__name__}" for route in routes}
    assert served == {
        "V2Inference.infer",
        "GenerateEndpoints.generate",
        "GenerateEndpoints.generate_stream",
        "GrpsPredict.predict",
        "TFServingInference.predict",  # TF Serving's REST verbs, with and without a version or label
        "TFServingInference.classify",
        "TFServingInference.regress",
    }
    assert {route.method for route in routes} == {"POST"}
    assert sorted(worker.grpc_services.handlers) == [
        "/grps.protos.v1.GrpsService/Predict",
        "/grps.protos.v1.GrpsService/PredictStreaming",
        "/inference.GRPCInferenceService/ModelInfer",
        "/inference.GRPCInferenceService/ModelStreamInfer",
        "/tensorflow.serving.PredictionService/Predict",
    ]

    async def ask(port: str, method: str, path: str) -> None:
        router = worker.routers[port]
        found = router.find(method, path)
        assert isinstance(found, tuple), f"{port} {method} {path} was answered by the worker"
        answer = await router.call(found[0], HttpRequest(method, path, b"", {}))
        assert answer.chunks == [b"the engine's"]

    async def scenario() -> None:
        await ask("HTTP", "GET", "/v2/health/ready")
        await ask("HTTP", "GET", "/v2/models/simple/infer")  # the engine's 405, not the worker's
        await ask("HTTP", "POST", "/no/such/path")  # the engine's 404
        await ask("HTTP", "POST", "/v2/repository/index")
        await ask("Metrics", "GET", "/metrics")
        for path in ("/inference.GRPCInferenceService/ServerLive", "/no.Such/Method"):
            handler = worker.grpc_services.handler(path)
            assert handler is not None
            await handler.func(None)

    asyncio.run(scenario())
    assert forwarded == [
        ("HTTP", "GET", "/v2/health/ready"),
        ("HTTP", "GET", "/v2/models/simple/infer"),
        ("HTTP", "POST", "/no/such/path"),
        ("HTTP", "POST", "/v2/repository/index"),
        ("Metrics", "GET", "/metrics"),
        ("grpc", "/inference.GRPCInferenceService/ServerLive"),
        ("grpc", "/no.Such/Method"),
    ]

    # One process serves the same front end, and everything else beside it.
    whole = assembly.build(args, repository, shared_memory, None, LogControl(LogSettings()), tracer)  # type: ignore[arg-type]
    everything = [route for routes in whole.routers["HTTP"].routes.values() for route in routes]
    assert {r.pattern.pattern for r in routes} < {r.pattern.pattern for r in everything}
    assert (
        len(everything) - len(routes) > 20
    )  # health, metadata, statistics, shared memory, the repository API
    assert set(worker.grpc_services.handlers) < set(whole.grpc_services.handlers)
    assert whole.grpc_services.handler("/no.Such/Method") is None  # UNIMPLEMENTED, here
