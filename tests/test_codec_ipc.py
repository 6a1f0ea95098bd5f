"""The messages between a front end and the engine (codec/ipc.py): every field of a request and an answer
arrives as it left, tensors included, and the engine's models may write what they receive."""

import numpy as np
import pytest

from codec import ipc
from codec.framing import pack, unpack
from codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor


def crossed(message: list) -> list:
    return unpack(pack(message))


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
    assert crossed([np.int64(5), np.arange(3)]) == [5, [0, 1, 2]]


def test_what_cannot_cross_says_so() -> None:
    with pytest.raises(NotImplementedError, match="object cannot cross to another process"):
        pack([object()])
