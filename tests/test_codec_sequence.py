"""Triton's sequence extension in the codecs: sequence_id / sequence_start / sequence_end read from REST
JSON and ModelInferRequest parameters into InferRequest.sequence_id and .sequence_flags, with each
protocol's own refusals, and taken out of the parameters a model reads."""

import numpy as np
import orjson
import pytest

import tensorgate.proto.inference as pb
from tensorgate.codec import v2_grpc_request, v2_http
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.sequence import END, START

INPUT = {"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}


def rest(parameters: dict) -> object:
    body = orjson.dumps({"parameters": parameters, "inputs": [INPUT]})
    return v2_http.decode_request(body, None, "m")


def grpc(parameters: dict[str, pb.InferParameter]) -> object:
    tensor = pb.ModelInferRequestInferInputTensor(name="INPUT", datatype="INT32", shape=[1, 1])
    message = pb.ModelInferRequest(
        model_name="m", inputs=[tensor], parameters=parameters, raw_input_contents=[np.int32(1).tobytes()]
    )
    return v2_grpc_request.decode_request(bytes(message))


@pytest.mark.parametrize(
    ("parameters", "sequence_id", "flags"),
    [
        ({"sequence_id": 42, "sequence_start": True}, 42, START),
        ({"sequence_id": 2**64 - 1, "sequence_end": True}, 2**64 - 1, END),
        ({"sequence_id": "e333c95a-07fc", "sequence_start": True, "sequence_end": True}, "e333c95a-07fc", 3),
        ({"sequence_id": 7, "sequence_start": False}, 7, 0),
        ({"priority": 1}, 0, 0),
    ],
)
def test_rest_reads_the_sequence_parameters(parameters: dict, sequence_id: object, flags: int) -> None:
    request = rest({**parameters, "custom": "kept"})
    assert (request.sequence_id, request.sequence_flags) == (sequence_id, flags)
    assert request.parameters == {"custom": "kept", **({"priority": 1} if "priority" in parameters else {})}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id': expected a uint64 or a string, got 1.5"),
        ({"sequence_id": -1}, "Unable to parse 'sequence_id': -1 is not a uint64"),
        ({"sequence_id": True}, "Unable to parse 'sequence_id': expected a uint64 or a string, got True"),
        (
            {"sequence_id": 1, "sequence_start": 1},
            "Unable to parse 'sequence_start': expected a boolean, got 1",
        ),
        (
            {"sequence_id": 1, "sequence_end": "yes"},
            "Unable to parse 'sequence_end': expected a boolean, got 'yes'",
        ),
    ],
)
def test_rest_refuses_values_of_the_wrong_type(parameters: dict, message: str) -> None:
    with pytest.raises(InferError) as refused:
        rest(parameters)
    assert (refused.value.kind, refused.value.message) == (ErrorKind.INVALID_ARGUMENT, message)


def test_grpc_reads_the_sequence_parameters() -> None:
    request = grpc(
        {
            "sequence_id": pb.InferParameter(int64_param=-2),  # a uint64's bits, as Triton casts them
            "sequence_start": pb.InferParameter(bool_param=True),
            "sequence_end": pb.InferParameter(bool_param=True),
            "other": pb.InferParameter(string_param="kept"),
        }
    )
    assert (request.sequence_id, request.sequence_flags, request.parameters) == (
        2**64 - 2,
        3,
        {"other": "kept"},
    )
    named = grpc({"sequence_id": pb.InferParameter(string_param="abc")})
    assert (named.sequence_id, named.sequence_flags) == ("abc", 0)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"sequence_id": pb.InferParameter(bool_param=True)},
            "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
        ),
        (
            {
                "sequence_id": pb.InferParameter(int64_param=1),
                "sequence_start": pb.InferParameter(int64_param=1),
            },
            "invalid value type for 'sequence_start' parameter, expected bool_param.",
        ),
        (
            {"sequence_end": pb.InferParameter(string_param="true")},
            "invalid value type for 'sequence_end' parameter, expected bool_param.",
        ),
    ],
)
def test_grpc_refuses_values_of_the_wrong_type(parameters: dict, message: str) -> None:
    with pytest.raises(InferError) as refused:
        grpc(parameters)
    assert (refused.value.kind, refused.value.message) == (ErrorKind.INVALID_ARGUMENT, message)


def test_grpc_request_skeletons_never_drop_a_sequence() -> None:
    """The decoder keeps the start of requests it saw without parameters, to read their like faster: a
    request with sequence parameters must never be read through one."""
    parameters = {
        "sequence_id": pb.InferParameter(int64_param=5),
        "sequence_start": pb.InferParameter(bool_param=True),
    }
    for _ in range(3):
        request = grpc(parameters)
        assert (request.sequence_id, request.sequence_flags) == (5, START)
    for _ in range(3):
        assert grpc({}).sequence_id == 0
