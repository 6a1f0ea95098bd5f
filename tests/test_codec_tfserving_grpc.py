"""codec/tfserving_grpc.py, the hand-written reader and writer of TF Serving's Predict messages, against the
messages generated from proto/tensorflow* (betterproto2): what one writes, the other reads the same."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgate.proto.tensorflow as tf
import tensorgate.proto.tensorflow.serving as pb
from tensorgate.codec import tfserving_grpc
from tensorgate.codec.datatypes import TABLE
from tensorgate.codec.errors import InferError


def shape(*sizes: int) -> tf.TensorShapeProto:
    return tf.TensorShapeProto(dim=[tf.TensorShapeProtoDim(size=size) for size in sizes])


def read(proto: tf.TensorProto) -> np.ndarray:
    data = bytes(proto)
    dtype, array = tfserving_grpc.decode_tensor(data, 0, len(data), "x")
    assert dtype.tf == proto.dtype.name
    return array


def test_the_datatype_table_numbers_tensorflows() -> None:
    for datatype in TABLE:
        assert tf.DataType[datatype.tf].value == datatype.tf_number, datatype


@pytest.mark.parametrize("datatype", [t for t in TABLE if t.v2 != "BYTES"], ids=lambda t: t.v2)
def test_tensor_content_round_trip(datatype) -> None:
    values = np.arange(6).reshape(2, 3).astype(datatype.numpy)
    written = tfserving_grpc.encode_tensor(values, datatype.v2)
    parsed = tf.TensorProto.parse(written)
    assert parsed.dtype == tf.DataType(datatype.tf_number)
    assert [d.size for d in parsed.tensor_shape.dim] == [2, 3]
    assert parsed.tensor_content == values.tobytes()
    assert read(parsed).tolist() == values.tolist()


def test_typed_fields_as_tensorflow_reads_them() -> None:
    assert read(
        tf.TensorProto(dtype=tf.DataType.DT_FLOAT, tensor_shape=shape(3), float_val=[1.5])
    ).tolist() == [
        1.5,
        1.5,
        1.5,
    ]
    assert read(
        tf.TensorProto(dtype=tf.DataType.DT_INT32, tensor_shape=shape(2), int_val=[-1, 7])
    ).tolist() == [
        -1,
        7,
    ]
    assert read(tf.TensorProto(dtype=tf.DataType.DT_INT64, tensor_shape=shape(2))).tolist() == [0, 0]
    assert read(
        tf.TensorProto(dtype=tf.DataType.DT_BOOL, tensor_shape=shape(2), bool_val=[True, False])
    ).tolist() == [
        True,
        False,
    ]
    half = np.array([1.0, -2.5], dtype=np.float16)
    proto = tf.TensorProto(
        dtype=tf.DataType.DT_HALF, tensor_shape=shape(2), half_val=half.view(np.uint16).tolist()
    )
    assert read(proto).tolist() == [1.0, -2.5]
    strings = tf.TensorProto(
        dtype=tf.DataType.DT_STRING, tensor_shape=shape(1, 2), string_val=[b"a", b"\xff"]
    )
    assert read(strings).tolist() == [[b"a", b"\xff"]]
    scalar = tf.TensorProto(dtype=tf.DataType.DT_DOUBLE, double_val=[2.25])
    assert read(scalar).shape == () and float(read(scalar)) == 2.25
    big = tf.TensorProto(dtype=tf.DataType.DT_UINT64, tensor_shape=shape(1), uint64_val=[2**64 - 1])
    assert read(big).tolist() == [2**64 - 1]


@pytest.mark.parametrize(
    ("proto", "fragment"),
    [
        (
            tf.TensorProto(dtype=tf.DataType.DT_FLOAT, tensor_shape=shape(2), tensor_content=b"\0" * 7),
            "7 bytes",
        ),
        (tf.TensorProto(dtype=tf.DataType.DT_FLOAT, tensor_shape=shape(1), float_val=[1.0, 2.0]), "2 values"),
        (tf.TensorProto(dtype=tf.DataType.DT_FLOAT, tensor_shape=shape(-2)), "size -2"),
        (
            tf.TensorProto(dtype=tf.DataType.DT_FLOAT, tensor_shape=tf.TensorShapeProto(unknown_rank=True)),
            "rank",
        ),
        (tf.TensorProto(dtype=tf.DataType.DT_COMPLEX64, tensor_shape=shape(1)), "DataType 8"),
        (tf.TensorProto(dtype=tf.DataType.DT_INVALID), "DataType 0"),
    ],
)
def test_malformed_tensors_are_parsing_errors(proto, fragment: str) -> None:
    with pytest.raises(InferError) as caught:
        read(proto)
    assert caught.value.message.startswith("tensor parsing error: x (") and fragment in caught.value.message


def test_a_predict_request_as_written_by_the_generated_message() -> None:
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    request = pb.PredictRequest(
        model_spec=pb.ModelSpec(name="m", version_label="canary", signature_name="sig"),
        inputs={
            "x": tf.TensorProto(
                dtype=tf.DataType.DT_FLOAT, tensor_shape=shape(1, 2), tensor_content=x.tobytes()
            )
        },
        output_filter=["y", "z"],
    )
    read_back = tfserving_grpc.decode_predict(bytes(request))
    assert read_back.spec == tfserving_grpc.ModelSpec("m", None, "canary", "sig")
    assert read_back.output_filter == ["y", "z"]
    dtype, array = read_back.inputs["x"]
    assert dtype.v2 == "FP32" and array.tolist() == x.tolist()
    versioned = tfserving_grpc.decode_predict(
        bytes(pb.PredictRequest(model_spec=pb.ModelSpec(name="m", version=0)))
    )
    assert versioned.spec.version == 0  # a version 0 given is not "no version"
    assert tfserving_grpc.decode_predict(b"").spec == tfserving_grpc.ModelSpec()


def test_a_predict_response_as_the_generated_message_reads_it() -> None:
    y = np.array([[0.5], [1.5]], dtype=np.float32)
    words = np.array([b"a", b"bc"], dtype=object)
    spec = tfserving_grpc.encode_model_spec("m", 3, "serving_default")
    answer = pb.PredictResponse.parse(
        tfserving_grpc.encode_predict([("y", "FP32", y), ("w", "BYTES", words)], spec)
    )
    assert (answer.model_spec.name, answer.model_spec.version, answer.model_spec.signature_name) == (
        "m",
        3,
        "serving_default",
    )
    assert np.frombuffer(answer.outputs["y"].tensor_content, np.float32).tolist() == [0.5, 1.5]
    assert [d.size for d in answer.outputs["y"].tensor_shape.dim] == [2, 1]
    assert (
        answer.outputs["w"].string_val == [b"a", b"bc"] and answer.outputs["w"].dtype == tf.DataType.DT_STRING
    )


def test_garbage_is_invalid_argument() -> None:
    for garbage in (b"\x12\x05\x0a\x01", b"\xff\xff\xff", b"\x0a\x10xxx"):
        with pytest.raises(InferError) as caught:
            tfserving_grpc.decode_predict(garbage)
        assert "not a valid protobuf message" in caught.value.message


def test_a_request_like_the_last_is_read_from_its_skeleton_with_its_own_values() -> None:
    def request(values: list[float], dtype: tf.DataType = tf.DataType.DT_FLOAT) -> bytes:
        x = np.array(values, dtype=np.float32)
        proto = tf.TensorProto(dtype=dtype, tensor_shape=shape(len(values)), tensor_content=x.tobytes())
        return bytes(
            pb.PredictRequest(model_spec=pb.ModelSpec(name="skeleton", version=4), inputs={"x": proto})
        )

    first = tfserving_grpc.decode_predict(request([1.0, 2.0]))
    again = tfserving_grpc.decode_predict(request([3.0, -4.0]))  # the same bytes but the values
    assert first.inputs["x"][1].tolist() == [1.0, 2.0] and again.inputs["x"][1].tolist() == [3.0, -4.0]
    assert again.spec == tfserving_grpc.ModelSpec("skeleton", 4, "", "")
    other = tfserving_grpc.decode_predict(request([5.0, 6.0], tf.DataType.DT_INT32))  # same length, not alike
    assert other.inputs["x"][0].v2 == "INT32"
