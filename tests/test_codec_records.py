"""The records every request builds (codec/tensor.py: Tensor, RequestedOutput, InferRequest and
InferResponse) keep a dataclass's contract, compiled (extension types, codec/tensor.pxd) and in pure Python
alike: equality by their fields in order, a repr naming them, a fresh dict for each default, the trace and
sequence fields by name only, no attribute beyond their fields, and no hash (they are mutable)."""

import numpy as np
import pytest

from tensorgate.codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor


def test_records_are_equal_by_their_fields() -> None:
    data = np.arange(3, dtype=np.int32)
    assert Tensor("x", "INT32", (3,), data) == Tensor("x", "INT32", (3,), data, {})
    assert Tensor("x", "INT32", (3,), data) != Tensor("y", "INT32", (3,), data)
    assert RequestedOutput("o", True, {"k": 1}, 2) == RequestedOutput("o", True, {"k": 1}, 2)
    assert RequestedOutput("o") != RequestedOutput("o", class_count=1)
    assert InferRequest("m", sequence_id=7) == InferRequest("m", sequence_id=7)
    assert InferRequest("m", sequence_id=7) != InferRequest("m", sequence_id=8)
    assert InferResponse("m", "1", [], "id") == InferResponse("m", "1", [], "id", {})
    assert InferResponse("m", "1", []) != "InferResponse"


def test_a_repr_names_every_field_in_order() -> None:
    assert (
        repr(RequestedOutput("o")) == "RequestedOutput(name='o', binary=None, parameters={}, class_count=0)"
    )
    assert repr(InferResponse("m", "1", [])) == (
        "InferResponse(model_name='m', model_version='1', outputs=[], id=None, parameters={})"
    )
    text = repr(InferRequest("m"))
    assert text.startswith("InferRequest(model_name='m', model_version='', id=None, inputs=[], outputs=None")
    assert text.endswith("trace=None, sequence_id=0, sequence_flags=0)")


def test_each_default_is_a_dict_or_list_of_its_own() -> None:
    first, second = InferRequest("m"), InferRequest("m")
    first.parameters["k"] = 1
    first.inputs.append(Tensor("x", "INT32", (1,), None))
    assert second.parameters == {} and second.inputs == []
    assert Tensor("x", "INT32", (1,), None).parameters is not Tensor("x", "INT32", (1,), None).parameters


def test_trace_and_sequence_fields_are_given_by_name_only() -> None:
    with pytest.raises(TypeError):
        InferRequest("m", "", None, [], None, {}, False, False, None)  # type: ignore[misc]
    request = InferRequest("m", trace=None, sequence_id="corr", sequence_flags=3)
    assert (request.sequence_id, request.sequence_flags) == ("corr", 3)


def test_no_attribute_beyond_the_fields_and_no_hash() -> None:
    for record in (
        Tensor("x", "INT32", (1,), None),
        RequestedOutput("o"),
        InferRequest("m"),
        InferResponse("m", "1", []),
    ):
        with pytest.raises(AttributeError):
            record.misspelt = 1  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            hash(record)
