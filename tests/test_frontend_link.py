"""A worker's end of the link to the engine (server/frontend.py EngineClient, server/link.py): answers
that arrive for calls the worker has already given up on are dropped, and the link keeps working."""

import asyncio

import numpy as np
import pytest

from codec import ipc
from codec.tensor import InferRequest, InferResponse, Tensor
from server.frontend import EngineClient
from server.link import _LENGTH


class Version:
    version_str = "1"


def arrive(client: EngineClient, message: list) -> None:
    """`message` read from the socket, as the event loop hands it to the link."""
    data = ipc.pack(message)
    framed = _LENGTH.pack(len(data)) + data
    client.link.get_buffer(len(framed))[: len(framed)] = framed
    client.link.buffer_updated(len(framed))


def request() -> InferRequest:
    return InferRequest("m", inputs=[Tensor("I", "INT32", (1,), np.ones(1, np.int32))])


def answer(value: int) -> list:
    return ipc.response_out(
        InferResponse("m", "1", [Tensor("O", "INT32", (1,), np.full(1, value, np.int32))])
    )


def test_an_answer_to_a_call_cancelled_in_the_same_pass_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        client = EngineClient()
        left = asyncio.create_task(client.infer(Version(), request()))
        await asyncio.sleep(0)  # sent; waiting for the engine
        left.cancel()  # the client went away: the wait ends at once, the task learns of it on its next step
        arrive(client, [ipc.RESULT, client.next_id, answer(1)])  # the engine's answer is already here
        arrive(client, [ipc.ERROR, client.next_id, [400, "late"]])
        with pytest.raises(asyncio.CancelledError):
            await left
        assert client.calls == {}
        served = asyncio.create_task(client.infer(Version(), request()))  # the link still serves
        await asyncio.sleep(0)
        arrive(client, [ipc.RESULT, client.next_id, answer(7)])
        assert int((await served).outputs[0].data[0]) == 7

    asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
