"""The sans-IO pieces of the trace and generate extensions: Triton's JSON trace entries and tensor text,
W3C traceparent checks, the generate request's shapes and answers, trace settings' fallbacks."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from tensorgate.codec.errors import InferError
from tensorgate.codec.generate import decode_generate, generate_json
from tensorgate.codec.tensor import InferResponse, Tensor
from tensorgate.codec.trace import TENSORS, TIMESTAMPS, Trace, tensor_text, triton_json, valid_traceparent
from tensorgate.server.tracing import config
from tensorgate.server.tracing.settings import CLEAR, TraceSetting, derive


def test_triton_json_writes_parents_then_children() -> None:
    trace = Trace.new((TIMESTAMPS,))
    trace.model_name, trace.model_version, trace.request_id = "pipe", 1, "r"
    trace.stamp("REQUEST_START", 10)
    child = trace.child()
    child.model_name, child.model_version = "step", 2
    child.compute(20, 1, 2, 3)
    never = trace.child()  # failed before reaching its model: nothing written
    assert never.parent_id == trace.id
    assert triton_json(trace) == [
        {"id": trace.id, "model_name": "pipe", "model_version": 1, "request_id": "r"},
        {"id": trace.id, "timestamps": [{"name": "REQUEST_START", "ns": 10}]},
        {"id": child.id, "model_name": "step", "model_version": 2, "parent_id": trace.id},
        {"id": child.id, "timestamps": [{"name": "COMPUTE_START", "ns": 20}]},
        {"id": child.id, "timestamps": [{"name": "COMPUTE_INPUT_END", "ns": 21}]},
        {"id": child.id, "timestamps": [{"name": "COMPUTE_OUTPUT_START", "ns": 23}]},
        {"id": child.id, "timestamps": [{"name": "COMPUTE_END", "ns": 26}]},
    ]


def test_a_tensors_only_trace_records_no_timestamps() -> None:
    trace = Trace.new((TENSORS,))
    trace.stamp("REQUEST_START", 1)
    assert trace.timestamps == [] and trace.records_tensors


@pytest.mark.parametrize(
    ("array", "datatype", "text"),
    [
        (np.array([[1, -2], [3, 4]], np.int32), "INT32", "1,-2,3,4"),
        (np.array([0.5, 1e-7], np.float32), "FP32", "0.5,1e-07"),
        (np.array([True, False]), "BOOL", "1,0"),
        (np.array([b"a", b'q"'], dtype=object), "BYTES", '"a","q""'),
        (np.array([1.0], np.float16), "FP16", ""),
    ],
)
def test_tensor_text_as_triton_writes_it(array: np.ndarray, datatype: str, text: str) -> None:
    assert tensor_text(array, datatype) == text


def test_traceparent_validity() -> None:
    assert valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert not valid_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
    assert not valid_traceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert not valid_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01")
    assert not valid_traceparent("garbage")


SPECS = {"text_input": ("BYTES", (-1, 1)), "ids": ("INT64", (-1, -1, 2))}


def test_generate_shapes_follow_tritons_two_passes() -> None:
    request = decode_generate(orjson.dumps({"text_input": "hi", "ids": [1, 2, 3, 4]}), "m", "", SPECS)
    shapes = {t.name: t.shape for t in request.inputs}
    assert shapes == {"text_input": (1, 1), "ids": (1, 2, 2)}  # innermost variable dim takes the rest
    with pytest.raises(InferError, match="can not convert input 'ids'"):
        decode_generate(orjson.dumps({"ids": [1, 2, 3]}), "m", "", SPECS)


def test_generate_answer_unwraps_single_elements() -> None:
    outputs = [
        Tensor("text_output", "BYTES", (1,), np.array([b"hi"], dtype=object)),
        Tensor("scores", "FP32", (3,), np.array([1.0, np.nan, 2.0], np.float32)),
        Tensor("count", "INT32", (1, 1), np.array([[7]], np.int32)),
    ]
    answer = generate_json(InferResponse("m", "1", outputs, "id-1"))
    assert answer == (
        b'{"id":"id-1","model_name":"m","model_version":"1","text_output":"hi",'
        b'"scores":[1.0,NaN,2.0],"count":7}'
    )


def test_trace_settings_follow_their_fallback_until_set() -> None:
    fallback = TraceSetting(level=(TIMESTAMPS,), rate=10, file="/t")
    model = derive(None, fallback, {"rate": 2})
    assert (model.rate, model.level, model.specified) == (2, (TIMESTAMPS,), frozenset({"rate"}))
    moved = derive(model, TraceSetting(rate=50, file="/t"), {})
    assert (moved.rate, moved.level) == (2, ())  # its own rate stays; its level follows the fallback
    assert derive(moved, fallback, {"rate": CLEAR}).rate == 10


def test_trace_config_flags() -> None:
    setting, otel = config.parse(
        ["level=TIMESTAMPS", "level=TENSORS", "rate=5", "triton,file=/x", "opentelemetry,resource=a=b=c"]
    )
    assert (setting.level, setting.rate, setting.file) == ((TIMESTAMPS, TENSORS), 5, "/x")
    assert otel.resource == {"service.name": "tensorgate", "a": "b=c"}
    for bad in ("rate=-1", "level=LOUD", "vendor,x=1", "opentelemetry,bsp_max_queue_size=0", "nothing"):
        with pytest.raises(ValueError, match="--trace-config"):
            config.parse([bad])
