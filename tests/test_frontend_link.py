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


def test_what_a_worker_serves_itself_is_inference_on_every_protocol() -> None:
    """The endpoints marked `front_end` (server/router.py), REST and gRPC alike: a worker serves these
    and forwards every other route and method to the engine."""
    from tensorgate.server import grpc
    from tensorgate.server.endpoints.generate import GenerateEndpoints
    from tensorgate.server.endpoints.grps import GrpsEndpoints
    from tensorgate.server.endpoints.repository import RepositoryEndpoints
    from tensorgate.server.endpoints.tfserving import TFServingEndpoints
    from tensorgate.server.endpoints.v2 import V2Endpoints, error_response
    from tensorgate.server.engine_client import InProcess
    from tensorgate.server.log_settings import LogControl, LogSettings
    from tensorgate.server.router import Router, is_front_end
    from tensorgate.server.served_models import ServedModels
    from tensorgate.server.shared_memory import SharedMemory
    from tensorgate.server.tracing.settings import TraceSetting
    from tensorgate.server.tracing.tracer import Tracer

    repository, shared_memory, tracer = ServedModels(), SharedMemory(False), Tracer(TraceSetting())
    engine = InProcess(repository, shared_memory)
    router = Router(error_response)
    V2Endpoints(engine, repository, shared_memory, tracer).install(router)  # type: ignore[arg-type]
    GenerateEndpoints(engine, tracer).install(router)
    GrpsEndpoints(engine, repository).install(router)  # type: ignore[arg-type]
    TFServingEndpoints(engine, repository).install(router)  # type: ignore[arg-type]
    RepositoryEndpoints(repository).install(router)  # type: ignore[arg-type]
    served = {
        f"{type(route.handler.__self__).__name__}.{route.handler.__name__}"
        for routes in router.routes.values()
        for route in routes
        if is_front_end(route.handler)
    }
    assert served == {
        "V2Endpoints.infer",
        "GenerateEndpoints.generate",
        "GenerateEndpoints.generate_stream",
        "GrpsEndpoints.predict",
        "TFServingEndpoints.predict",  # TF Serving's REST verbs, with and without a version or label
        "TFServingEndpoints.classify",
        "TFServingEndpoints.regress",
    }
    forwarded = [r for routes in router.routes.values() for r in routes if not is_front_end(r.handler)]
    assert len(forwarded) > 20  # health, metadata, statistics, shared memory, the repository API, ...
    logs = LogControl(LogSettings())
    services = grpc.services(engine, repository, None, 1 << 20, shared_memory, logs, tracer)  # type: ignore[arg-type]
    methods = sorted(path for path, handler in services.handlers.items() if is_front_end(handler.func))
    assert methods == [
        "/grps.protos.v1.GrpsService/Predict",
        "/grps.protos.v1.GrpsService/PredictStreaming",
        "/inference.GRPCInferenceService/ModelInfer",
        "/inference.GRPCInferenceService/ModelStreamInfer",
        "/tensorflow.serving.PredictionService/Predict",
    ]
