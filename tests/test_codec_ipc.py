"""The messages between a front end and the engine (codec/ipc.py, codec/messages.py): every field of a
request and an answer arrives as it left, tensors included, and the engine's models may write what they
receive; a message whose fields do not match its kind is refused by the decoder, naming the field, and
fails the call it names while the messages after it still arrive."""

import msgspec
import numpy as np
import pytest

from tensorgate.codec import ipc
from tensorgate.codec import messages as msg
from tensorgate.codec.framing import NOTHING, FrameReader, Invalid, frame, pack, unpack
from tensorgate.codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor

TO_ENGINE = msgspec.msgpack.Decoder(msg.TO_ENGINE)
TO_WORKER = msgspec.msgpack.Decoder(msg.TO_WORKER)


def crossed(message: msg.Request | msg.Response) -> msg.Request | msg.Response:
    """The payload as the other side decodes it: inside its message, with the decoder of that link."""
    if isinstance(message, msg.Request):
        return TO_ENGINE.decode(pack(msg.Infer(1, message))).request
    return TO_WORKER.decode(pack(msg.Result(1, message))).response


def test_a_request_crosses_with_every_field() -> None:
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"a", b"", b"\xff\x00"], dtype=object)
    request = InferRequest(
        "m",
        "2",
        "id-1",
        [
            Tensor("F", "FP32", (2, 3), floats),
            Tensor("S", "BYTES", (3,), words),
            Tensor("SHM", "INT32", (4,), None, {"shared_memory_region": "r", "shared_memory_byte_size": 16}),
        ],
        [RequestedOutput("OUT", True, {"x": 1}, 3), RequestedOutput("OTHER")],
        {"custom": "kept", "priority": 2},
        True,
        True,
        sequence_id="corr-7",
        sequence_flags=3,
    )
    got = ipc.request_in(crossed(ipc.request_out(request)))
    assert (got.model_name, got.model_version, got.id) == ("m", "2", "id-1")
    assert (got.parameters, got.binary_output, got.shared_memory) == (
        {"custom": "kept", "priority": 2},
        True,
        True,
    )
    assert (got.sequence_id, got.sequence_flags) == ("corr-7", 3)
    assert got.outputs == [RequestedOutput("OUT", True, {"x": 1}, 3), RequestedOutput("OTHER")]
    f, s, shm = got.inputs
    np.testing.assert_array_equal(f.data, floats)
    assert f.data.dtype == np.float32 and f.shape == (2, 3)
    assert list(s.data) == [b"a", b"", b"\xff\x00"]
    assert shm.data is None and shm.parameters["shared_memory_region"] == "r"
    f.data[0, 0] = 99  # a model may write its inputs
    assert floats[0, 0] == 0


@pytest.mark.parametrize("nbytes", [20, 28])
def test_a_tensor_whose_bytes_do_not_fill_its_shape_is_refused(nbytes: int) -> None:
    # too few bytes, or more than the shape holds: never a tensor over part of them
    item = msg.Tensor("x", "INT32", [2, 3], bytes(nbytes), None)
    with pytest.raises((ValueError, TypeError)):
        ipc.tensor_in(item)


def test_a_numeric_sequence_id_stays_a_number() -> None:
    request = InferRequest("m", inputs=[Tensor("I", "INT32", (1,), np.ones(1, np.int32))])
    request.sequence_id, request.sequence_flags = 2**64 - 1, 1
    got = ipc.request_in(crossed(ipc.request_out(request)))
    assert (got.sequence_id, got.sequence_flags) == (2**64 - 1, 1)
    assert got.outputs is None and got.parameters == {}


def test_an_answer_crosses_with_its_parameters() -> None:
    out = np.array([[1, -2]], dtype=np.int64)
    response = InferResponse(
        "m", "1", [Tensor("OUT", "INT64", (1, 2), out)], "id", {"triton_final_response": True}
    )
    got = ipc.response_in(crossed(ipc.response_out(response)))
    assert (got.model_name, got.model_version, got.id) == ("m", "1", "id")
    assert got.parameters == {"triton_final_response": True}
    np.testing.assert_array_equal(got.outputs[0].data, out)


def test_numpy_values_in_parameters_cross_as_plain_values() -> None:
    assert unpack(pack([np.int64(5), np.arange(3)])) == [5, [0, 1, 2]]


def test_what_cannot_cross_says_so() -> None:
    with pytest.raises(NotImplementedError, match="object cannot cross to another process"):
        pack([object()])


def test_a_message_is_its_kind_then_its_fields_in_order() -> None:
    assert unpack(pack(msg.Cancel(7))) == [msg.CANCEL, 7]
    assert unpack(pack(msg.More(7, 4))) == [msg.MORE, 7, 4]
    assert unpack(pack(msg.Error(3, "internal", "boom"))) == [msg.ERROR, 3, "internal", "boom"]


def test_a_message_that_does_not_match_its_kind_is_refused_and_the_link_reads_on() -> None:
    reader = FrameReader(TO_WORKER)
    reader.feed(frame([msg.RESULT, 5, "not a response"]) + frame(msg.Error(6, "internal", "x")))
    with pytest.raises(Invalid, match=r"Expected `array`, got `str` - at `\$\[2\]`") as refused:
        reader.next()
    assert refused.value.call == 5  # the call that fails
    assert reader.next() == msg.Error(6, "internal", "x")
    assert reader.next() is NOTHING


def test_a_kind_the_receiver_may_not_receive_is_refused() -> None:
    reader = FrameReader(TO_WORKER)
    reader.feed(frame(msg.Infer(9, ipc.request_out(InferRequest("m")))))  # an engine never sends INFER
    with pytest.raises(Invalid) as refused:
        reader.next()
    assert refused.value.call == 9
