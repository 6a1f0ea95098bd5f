"""TensorFlow Serving's REST API v1: predict (row and columnar), classify, regress, status, metadata.

Sans-IO: the server passes the parsed body and the model's tensors as plain data (TensorInfo) and gets an
InferRequest back; it passes the InferResponse and gets the answer's bytes. JSON details (non-finite
tokens, b64) live in codec.tfserving_json.

TF Serving sees a model's own shapes: where a Triton config gives an input or output a `reshape`, its
shape (what the model computes on) is what TF clients send and receive; the config's `dims` are accepted
in requests too.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgate.codec import errors
from tensorgate.codec.datatypes import BY_V2, DataType, bf16_to_float32
from tensorgate.codec.errors import ErrorKind, InferError, http_status, invalid
from tensorgate.codec.tensor import InferRequest, InferResponse, RequestedOutput, Tensor
from tensorgate.codec.tfserving_json import dumps, is_b64, json_rows, json_value, loads, to_array

__all__ = ["loads"]  # re-exported: the server parses bodies through this module

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
BYTES_SUFFIX = "_bytes"  # BYTES outputs named so are answered as {"b64": ...}
EMPTY_PREDICTIONS = b'{"predictions":[]}'

# Error kinds -> TF Serving's HTTP statuses (its http_server.cc): the shared ones, but 429 for exhaustion.
HTTP_STATUS = errors.HTTP_STATUS | {ErrorKind.RESOURCE_EXHAUSTED: 429}


def error_body(error: InferError) -> tuple[int, bytes]:
    """TF Serving's error answer: its status and `{"error": "<message>"}`."""
    return http_status(error, HTTP_STATUS), dumps({"error": error.message})


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output of a model as TF Serving shows it."""

    name: str
    datatype: str  # KServe v2 name (codec.datatypes)
    shape: tuple[int, ...]  # the model's own shape, -1 for the batch dimension and variable ones
    v2_shape: tuple[int, ...]  # the config's dims (batch -1 first): what the model version checks
    optional: bool = False


def signature_name(doc: Any) -> str:
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid("'signature_name' key must be a string value")
    return name


# ------------------------------------------------------------------------------------------ predict


def decode_predict(
    doc: dict, inputs: list[TensorInfo], model: str, version: str, outputs: list[str] | None = None
) -> tuple[InferRequest | None, bool]:
    """(the request, columnar?) from a predict body; the request is None for `{"instances": []}`, which
    is answered without running the model. `outputs` selects the outputs (None: all)."""
    if "instances" in doc and "inputs" in doc:
        raise invalid(
            "the request has both 'instances' (row format) and 'inputs' (columnar format); send one"
        )
    what = f"model '{model}'"
    if "instances" in doc:
        tensors, columnar = _from_instances(doc["instances"], inputs, what), False
    elif "inputs" in doc:
        tensors, columnar = _from_inputs(doc["inputs"], inputs, what), True
    else:
        raise invalid("the request has neither 'instances' (row format) nor 'inputs' (columnar format)")
    if tensors is None:
        return None, False
    wanted = None if outputs is None else [RequestedOutput(name) for name in outputs]
    return InferRequest(model, version, inputs=tensors, outputs=wanted), columnar


def _from_instances(instances: Any, inputs: list[TensorInfo], what: str) -> list[Tensor] | None:
    if type(instances) is not list:
        raise invalid("'instances' must be a list")
    if not instances:
        return None
    first = instances[0]
    if type(first) is not dict or is_b64(first):  # a list of values for the one input
        info = _only_input(inputs, what, "'instances' is a plain list", "a list of objects")
        w = f"{what}, input '{info.name}'"
        return [_input_tensor(info, to_array(instances, BY_V2[info.datatype], w), w)]
    names = first.keys()
    infos = _named(names, inputs, what, "instance 0")
    for i, instance in enumerate(instances):
        if type(instance) is not dict or is_b64(instance):
            raise invalid(
                f"'instances' item {i} is not an object while item 0 is: instances are all objects "
                "(one key per input) or all values"
            )
        if instance.keys() != names:
            raise invalid(
                f"'instances' item {i} has the keys {sorted(instance)}, item 0 has {sorted(names)}: "
                "every instance names the same inputs"
            )
    tensors = []
    for info in infos:
        w = f"{what}, input '{info.name}'"
        array = to_array([instance[info.name] for instance in instances], BY_V2[info.datatype], w)
        tensors.append(_input_tensor(info, array, w))
    return tensors


def _from_inputs(value: Any, inputs: list[TensorInfo], what: str) -> list[Tensor]:
    if type(value) is not dict or is_b64(value):  # the value of the one input
        info = _only_input(inputs, what, "'inputs' is a plain value or list", "an object")
        w = f"{what}, input '{info.name}'"
        return [_input_tensor(info, to_array(value, BY_V2[info.datatype], w), w)]
    tensors = []
    for info in _named(value.keys(), inputs, what, "'inputs'"):
        w = f"{what}, input '{info.name}'"
        tensors.append(_input_tensor(info, to_array(value[info.name], BY_V2[info.datatype], w), w))
    return tensors


def decode_tensors(
    given: dict[str, tuple[DataType, np.ndarray]],
    inputs: list[TensorInfo],
    model: str,
    version: str,
    outputs: list[str] | None = None,
) -> InferRequest:
    """A gRPC PredictRequest's tensors (alias -> (the dtype it says, its array)) -> the request, checked
    as the REST API checks its inputs, and each dtype against the model's."""
    what = f"model '{model}'"
    tensors = []
    for index, info in enumerate(_named(given.keys(), inputs, what, "the request's inputs")):
        dtype, array = given[info.name]
        if dtype.v2 != info.datatype:
            expected = BY_V2[info.datatype].tf
            raise invalid(
                f"{what}, input '{info.name}': Expects arg[{index}] to be {expected} "
                f"but {dtype.tf} is provided"
            )
        tensors.append(_input_tensor(info, array, f"{what}, input '{info.name}'"))
    wanted = None if outputs is None else [RequestedOutput(name) for name in outputs]
    return InferRequest(model, version, inputs=tensors, outputs=wanted)


def _only_input(inputs: list[TensorInfo], what: str, given: str, instead: str) -> TensorInfo:
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs)
        raise invalid(f"{given}, but {what} has {len(inputs)} inputs ({names}): send {instead} keyed by name")
    return inputs[0]


def _named(names: Any, inputs: list[TensorInfo], what: str, where: str) -> list[TensorInfo]:
    by_name = {info.name: info for info in inputs}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise invalid(
            f"{where} names unknown input(s) {', '.join(map(repr, unknown))} "
            f"({what} has: {', '.join(by_name)})"
        )
    missing = [info.name for info in inputs if info.name not in names and not info.optional]
    if missing:
        raise invalid(f"{where} lacks the input(s) {', '.join(map(repr, missing))} of {what}")
    return [by_name[name] for name in names]


def _matches(shape: tuple[int, ...], pattern: tuple[int, ...]) -> bool:
    if len(shape) != len(pattern):
        return False
    for size, want in zip(shape, pattern, strict=True):  # noqa: SIM110 -- a plain loop is faster than all()
        if want != size and want != -1:
            return False
    return True


def _reshaped(array: np.ndarray, source: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """`array` matches the pattern `source`; the same tensor in the pattern `target`. The variable sizes
    carry over in order (a config's dims and reshape have as many -1s, and equal runs between them)."""
    if target.count(-1) <= 1 and 0 not in target:
        return array.reshape(target)  # numpy works out the one variable size
    variable = iter([size for size, want in zip(array.shape, source, strict=True) if want == -1])
    return array.reshape(tuple(next(variable) if want == -1 else want for want in target))


def _input_tensor(info: TensorInfo, array: np.ndarray, what: str) -> Tensor:
    if _matches(array.shape, info.shape):
        if info.shape != info.v2_shape:
            array = _reshaped(array, info.shape, info.v2_shape)
    elif not _matches(array.shape, info.v2_shape):
        raise invalid(f"{what}: has shape {list(array.shape)}, the model expects {list(info.shape)}")
    return Tensor(info.name, info.datatype, array.shape, array)


def output_array(tensor: Tensor, info: TensorInfo | None, bf16_as_float32: bool = True) -> np.ndarray:
    """An output as TF Serving shows it: in the model's own shape, BF16 as float32 for JSON (gRPC keeps
    its bits: DT_BFLOAT16)."""
    array = tensor.data if isinstance(tensor.data, np.ndarray) else np.asarray(tensor.data)
    if info is not None and info.shape != info.v2_shape and _matches(array.shape, info.v2_shape):
        array = _reshaped(array, info.v2_shape, info.shape)
    if tensor.datatype == "BF16" and bf16_as_float32:
        array = bf16_to_float32(array)
    return array


def _as_b64(tensor: Tensor) -> bool:
    return tensor.datatype == "BYTES" and tensor.name.endswith(BYTES_SUFFIX)


def encode_predict(response: InferResponse | None, outputs: dict[str, TensorInfo], columnar: bool) -> bytes:
    """`{"predictions": [...]}` (row format) or `{"outputs": ...}` (columnar): bare values when there is
    one output, keyed by output name when there are several."""
    if response is None:
        return EMPTY_PREDICTIONS
    tensors = response.outputs
    arrays = [output_array(t, outputs.get(t.name)) for t in tensors]
    if columnar:
        if len(tensors) == 1:
            return dumps({"outputs": json_value(arrays[0], _as_b64(tensors[0]))})
        return dumps(
            {"outputs": {t.name: json_value(a, _as_b64(t)) for t, a in zip(tensors, arrays, strict=True)}}
        )
    batch = None
    for tensor, array in zip(tensors, arrays, strict=True):
        if array.ndim == 0:
            raise invalid(
                f"output '{tensor.name}' of model '{response.model_name}' is a scalar, it has no rows: "
                "ask in the columnar format ('inputs')"
            )
        if batch is not None and array.shape[0] != batch:
            raise invalid(
                f"the outputs of model '{response.model_name}' disagree on dimension 0 "
                f"('{tensor.name}' has {array.shape[0]}, not {batch}): ask in the columnar format ('inputs')"
            )
        batch = array.shape[0]
    if len(tensors) == 1:
        return dumps({"predictions": json_value(arrays[0], _as_b64(tensors[0]))})
    names = [t.name for t in tensors]
    columns = [json_rows(a, _as_b64(t)) for t, a in zip(tensors, arrays, strict=True)]
    return dumps({"predictions": [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]})


# ------------------------------------------------------------------------------------------ classify, regress


def decode_examples(
    doc: dict, inputs: list[TensorInfo], model: str, version: str, outputs: list[str]
) -> InferRequest | None:
    """A classify or regress body -> one row of the model's inputs per example (None for no examples).

    Features are matched to inputs by name; features no input has are ignored, as tf.Example parsing does.
    """
    context = doc.get("context", {})
    if type(context) is not dict:
        raise invalid("'context' must be an object of features")
    if "examples" not in doc:
        raise invalid("the request has no 'examples' list")
    examples = doc["examples"]
    if type(examples) is not list:
        raise invalid("'examples' must be a list of objects")
    if not examples:
        return None
    for i, example in enumerate(examples):
        if type(example) is not dict:
            raise invalid(f"example {i} must be an object of features")
        if context and (both := context.keys() & example.keys()):
            raise invalid(
                f"example {i} and the context both have the feature(s) {', '.join(map(repr, sorted(both)))}"
            )
    what = f"model '{model}'"
    tensors = []
    for info in inputs:
        w = f"{what}, feature '{info.name}'"
        if info.name in context:
            values = [context[info.name]] * len(examples)
        else:
            lacking = [i for i, example in enumerate(examples) if info.name not in example]
            if len(lacking) == len(examples) and info.optional:
                continue
            if lacking:
                raise invalid(f"example {lacking[0]} has no feature '{info.name}', an input of {what}")
            values = [example[info.name] for example in examples]
        if any(type(value) is list for value in values):  # a feature is a list; a bare value is a list of one
            values = [value if type(value) is list else [value] for value in values]
        tensors.append(_input_tensor(info, _feature_rows(values, info, w), w))
    return InferRequest(model, version, inputs=tensors, outputs=[RequestedOutput(name) for name in outputs])


def _feature_rows(values: list, info: TensorInfo, what: str) -> np.ndarray:
    """One row per example; a flat feature list fills a fixed row shape (tf.Example features are flat)."""
    array = to_array(values, BY_V2[info.datatype], what)
    if _matches(array.shape, info.shape) or _matches(array.shape, info.v2_shape) or not info.shape:
        return array
    row = info.shape[1:]
    if -1 not in row and array.ndim >= 1 and array[:1].size == int(np.prod(row)):
        return array.reshape((array.shape[0], *row))
    return array


def classify_outputs(available: list[str], model: str) -> list[str]:
    """[scores, classes]: `scores` (else the only output) and `classes` (when the model has one)."""
    scores = "scores" if "scores" in available else (available[0] if len(available) == 1 else None)
    if scores is None:
        raise invalid(
            f"model '{model}' has no 'scores' output (outputs: {', '.join(available)}): it cannot classify"
        )
    return [scores, "classes"] if "classes" in available and scores != "classes" else [scores]


def regress_output(available: list[str], model: str) -> list[str]:
    """[the output answered]: `outputs` (TF's regression signature key), else the only output."""
    if "outputs" in available:
        return ["outputs"]
    if len(available) != 1:
        raise invalid(
            f"model '{model}' has {len(available)} outputs ({', '.join(available)}) and none named "
            "'outputs': name one with a signature to regress"
        )
    return available


def _examples_array(response: InferResponse, name: str, outputs: dict[str, TensorInfo]) -> np.ndarray:
    tensor = next(t for t in response.outputs if t.name == name)
    array = output_array(tensor, outputs.get(name))
    if array.ndim == 1:
        return array[:, None]
    if array.ndim != 2:
        raise invalid(
            f"output '{name}' of model '{response.model_name}' has shape {list(array.shape)}: "
            "classify and regress need [examples] or [examples, n]"
        )
    return array


def encode_classify(
    response: InferResponse | None, names: list[str], outputs: dict[str, TensorInfo]
) -> bytes:
    """`{"result": ..., "results": ...}` (the same list: TF Serving's doc says one, its code the other):
    per example a list of [label, score] pairs; labels from `classes`, "" without one."""
    results = [[list(pair) for pair in row] for row in classifications(response, names, outputs)]
    return dumps({"result": results, "results": results})


def classifications(
    response: InferResponse | None, names: list[str], outputs: dict[str, TensorInfo]
) -> list[list[tuple[str, Any]]]:
    """Per example, its (label, score) pairs: scores from `names[0]`, labels from `names[1]` (the
    `classes` output) or "" without one."""
    results: list = []
    if response is not None:
        scores = _examples_array(response, names[0], outputs)
        if scores.dtype.kind not in "biuf":
            raise invalid(f"output '{names[0]}' of model '{response.model_name}' holds no numbers: no scores")
        score_rows = json_rows(scores.reshape(-1)) if scores.dtype.kind == "f" else list(scores.reshape(-1))
        width = scores.shape[1]
        score_rows = [score_rows[i : i + width] for i in range(0, len(score_rows), width)]
        if len(names) > 1:
            classes = _examples_array(response, names[1], outputs)
            if classes.shape != scores.shape:
                raise invalid(
                    f"model '{response.model_name}': 'classes' has shape {list(classes.shape)}, "
                    f"'{names[0]}' has {list(scores.shape)}"
                )
            labels = [[_label(e) for e in row] for row in classes]
        else:
            labels = [[""] * width] * scores.shape[0]
        results = [
            list(zip(label_row, score_row, strict=True))
            for label_row, score_row in zip(labels, score_rows, strict=True)
        ]
    return results


def _label(element: Any) -> str:
    return element.decode("utf-8", "replace") if isinstance(element, bytes) else str(element)


def encode_regress(response: InferResponse | None, names: list[str], outputs: dict[str, TensorInfo]) -> bytes:
    """`{"result": [...], "results": [...]}`: one number per example."""
    values = regressions(response, names, outputs)
    answer = json_value(values) if values.size else []
    return dumps({"result": answer, "results": answer})


def regressions(
    response: InferResponse | None, names: list[str], outputs: dict[str, TensorInfo]
) -> np.ndarray:
    """One number per example, from the output `names[0]`."""
    if response is None:
        return np.zeros(0, dtype=np.float32)
    array = _examples_array(response, names[0], outputs)
    if array.shape[1] != 1 or array.dtype.kind not in "biuf":
        raise invalid(
            f"output '{names[0]}' of model '{response.model_name}' has shape {list(array.shape)} of "
            f"{array.dtype}: regress needs one number per example"
        )
    return array.reshape(-1)


# ------------------------------------------------------------------------------------------ status, metadata


def version_status(version: int, state: str, error_message: str = "") -> dict:
    """One ModelVersionStatus: `state` is one of START, LOADING, AVAILABLE, UNLOADING, END."""
    code = "UNKNOWN" if error_message else "OK"
    return {
        "version": str(version),
        "state": state,
        "status": {"error_code": code, "error_message": error_message},
    }


def model_status(statuses: list[dict]) -> bytes:
    return dumps({"model_version_status": statuses})


def _tensor_info(info: TensorInfo) -> dict:
    return {
        "dtype": BY_V2[info.datatype].tf,
        "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in info.shape], "unknown_rank": False},
        "name": info.name,
    }


def model_metadata(
    model: str, version: str, signatures: dict[str, tuple[list[TensorInfo], list[TensorInfo]]]
) -> bytes:
    """GetModelMetadataResponse as TF Serving writes it: the model spec and a SignatureDefMap."""
    defs = {
        name: {
            "inputs": {i.name: _tensor_info(i) for i in inputs},
            "outputs": {o.name: _tensor_info(o) for o in outputs},
            "method_name": PREDICT_METHOD,
            "defaults": {},
        }
        for name, (inputs, outputs) in signatures.items()
    }
    spec = {"name": model, "signature_name": "", "version": version}
    return dumps({"model_spec": spec, "metadata": {"signature_def": {"signature_def": defs}}})
