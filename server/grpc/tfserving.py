"""TensorFlow Serving's gRPC API on the gRPC port: `tensorflow.serving.PredictionService` (Predict, Classify,
Regress, MultiInference, GetModelMetadata) and `tensorflow.serving.ModelService` (GetModelStatus,
HandleReloadConfigRequest), on the models and signatures the REST API serves (server/tfserving.py), with
its checks and its errors as gRPC statuses.

Predict is read and written by hand (codec/tfserving_grpc.py), as KServe's ModelInfer is; the other
methods go through the generated messages of proto/tensorflow_serving.

HandleReloadConfigRequest maps TF Serving's model config list onto the repository's control, in
`--model-control-mode explicit`: the models it lists are loaded (or reloaded), the others unloaded. A
model must be one of the repository's; its `base_path` is not read (the repository is where models live).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import betterproto2
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler

import tensorgate.proto.tensorflow as tf
import tensorgate.proto.tensorflow.serving as pb
from tensorgate.codec import tfserving, tfserving_grpc
from tensorgate.codec.datatypes import BY_V2
from tensorgate.codec.errors import InferError, invalid
from tensorgate.codec.tfserving import TensorInfo
from tensorgate.proto.google.protobuf import Any
from tensorgate.proto.tensorflow.error import Code
from tensorgate.server.grpc.inference import RawMessage, grpc_error
from tensorgate.server.tfserving import TFServing, View

if TYPE_CHECKING:
    from tensorgate.server.http.grpc_call import GrpcCall
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository import Repository

PREDICTION = "/tensorflow.serving.PredictionService/"
MODELS = "/tensorflow.serving.ModelService/"
SIGNATURE_DEF_MAP = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
CLASSIFY, REGRESS = "tensorflow/serving/classify", "tensorflow/serving/regress"
_STATE = {
    name: pb.ModelVersionStatusState[name] for name in ("START", "LOADING", "AVAILABLE", "UNLOADING", "END")
}


def _version(spec: tfserving_grpc.ModelSpec, service: TFServing) -> str:
    """The version a ModelSpec names ("" for the latest ready one)."""
    if not spec.name:
        raise invalid("Missing ModelSpec")
    if spec.version_label:
        return service.labeled(spec.name, spec.version_label)
    return "" if spec.version is None else str(spec.version)


def _resolved(service: TFServing, spec: tfserving_grpc.ModelSpec) -> tuple[ModelVersion, View]:
    return service.resolve(spec.name, _version(spec, service))


def _spec_of(message: pb.ModelSpec | None) -> tfserving_grpc.ModelSpec:
    """A generated ModelSpec (or None) -> the codec's."""
    if message is None:
        return tfserving_grpc.ModelSpec()
    label = message.version_label or ""
    return tfserving_grpc.ModelSpec(message.name, message.version, label, message.signature_name)


def _answer_spec(model_version: ModelVersion, signature: str) -> pb.ModelSpec:
    name = signature or tfserving.DEFAULT_SIGNATURE
    return pb.ModelSpec(name=model_version.name, version=model_version.version, signature_name=name)


def _shape(info: TensorInfo) -> tf.TensorShapeProto:
    return tf.TensorShapeProto(dim=[tf.TensorShapeProtoDim(size=size) for size in info.shape])


def _tensor_info(info: TensorInfo) -> tf.TensorInfo:
    return tf.TensorInfo(
        name=info.name, dtype=tf.DataType(BY_V2[info.datatype].tf_number), tensor_shape=_shape(info)
    )


def _examples_doc(given: pb.Input | None) -> dict:
    """A tensorflow.serving.Input -> the REST API's {"examples": [...], "context": {...}}."""
    if given is not None and given.example_list is not None:
        return {"examples": [_features(example) for example in given.example_list.examples]}
    if given is not None and given.example_list_with_context is not None:
        chosen = given.example_list_with_context
        doc: dict = {"examples": [_features(example) for example in chosen.examples]}
        if chosen.context is not None:
            doc["context"] = _features(chosen.context)
        return doc
    raise invalid("Input is empty")


def _features(example: tf.Example) -> dict[str, list]:
    found = {}
    for name, feature in (example.features.feature if example.features else {}).items():
        for kind in ("bytes_list", "float_list", "int64_list"):
            values = getattr(feature, kind)
            if values is not None:
                found[name] = list(values.value)
                break
        else:
            found[name] = []
    return found


class PredictFrontEnd:
    """tensorflow.serving.PredictionService's Predict: the front end's, through the engine client."""

    def __init__(self, tf: TFServing) -> None:
        self.tf = tf

    def __mapping__(self) -> dict[str, Handler]:
        return {
            PREDICTION + "Predict": Handler(self._predict, Cardinality.UNARY_UNARY, RawMessage, RawMessage)
        }

    async def _predict(self, call: GrpcCall) -> None:
        message = await call.recv_message()
        try:
            request = tfserving_grpc.decode_predict(message.data)
            model_version, view = _resolved(self.tf, request.spec)
            signature = request.spec.signature_name
            outputs = view.outputs_for(signature)
            if request.output_filter:
                outputs = _filtered(
                    request.output_filter, outputs if outputs is not None else list(view.outputs)
                )
            infer_request = tfserving.decode_tensors(
                request.inputs, view.inputs, model_version.name, model_version.version_str, outputs
            )
            response = await self.tf.engine.infer(model_version, infer_request)
            answered = [
                (
                    t.name,
                    t.datatype,
                    tfserving.output_array(t, view.outputs.get(t.name), bf16_as_float32=False),
                )
                for t in response.outputs
            ]
            spec = tfserving_grpc.encode_model_spec(
                model_version.name, model_version.version, signature or tfserving.DEFAULT_SIGNATURE
            )
            answer = tfserving_grpc.encode_predict(answered, spec)
        except Exception as e:
            raise grpc_error(e, "Predict") from None
        await call.send_message(RawMessage(answer))


class PredictionService:
    """The rest of tensorflow.serving.PredictionService, and ModelService (one servicer: they share the
    TF Serving view)."""

    def __init__(self, tf: TFServing, repository: Repository) -> None:
        self.repository = repository  # ModelService's reload
        self.tf = tf

    def __mapping__(self) -> dict[str, Handler]:
        unary = {
            PREDICTION + "Classify": self._unary(pb.ClassificationRequest, self.classify),
            PREDICTION + "Regress": self._unary(pb.RegressionRequest, self.regress),
            PREDICTION + "MultiInference": self._unary(pb.MultiInferenceRequest, self.multi_inference),
            PREDICTION + "GetModelMetadata": self._unary(pb.GetModelMetadataRequest, self.get_model_metadata),
            MODELS + "GetModelStatus": self._unary(pb.GetModelStatusRequest, self.get_model_status),
            MODELS + "HandleReloadConfigRequest": self._unary(pb.ReloadConfigRequest, self.reload_config),
        }
        return {
            path: Handler(method, Cardinality.UNARY_UNARY, RawMessage, RawMessage)
            for path, method in unary.items()
        }

    @staticmethod
    def _unary(
        kind: type[betterproto2.Message], method: Callable[..., Awaitable[betterproto2.Message]]
    ) -> Callable:
        """A raw handler around `method(message) -> message`: errors become gRPC statuses."""
        name = method.__name__

        async def handle(call: GrpcCall) -> None:
            message = await call.recv_message()
            try:
                try:
                    request = kind().parse(bytes(message.data))
                except Exception:
                    raise invalid(f"the {kind.__name__} is not a valid protobuf message") from None
                answer = bytes(await method(request))
            except GRPCError:
                raise
            except Exception as e:
                raise grpc_error(e, name) from None
            await call.send_message(RawMessage(answer))

        return handle

    # ------------------------------------------------------------------------------------------ examples

    async def _examples(
        self, spec: tfserving_grpc.ModelSpec, given: pb.Input | None, method: str
    ) -> tuple[ModelVersion, pb.ClassificationResult | pb.RegressionResult]:
        """Runs a classify or regress on the examples: the model version that ran, and its result."""
        model_version, view = _resolved(self.tf, spec)
        selected = view.outputs_for(spec.signature_name)
        available = list(view.outputs) if selected is None else selected
        pick = tfserving.classify_outputs if method == CLASSIFY else tfserving.regress_output
        names = pick(available, model_version.name)
        infer_request = tfserving.decode_examples(
            _examples_doc(given), view.inputs, model_version.name, model_version.version_str, names
        )
        response = None if infer_request is None else await self.tf.engine.infer(model_version, infer_request)
        if method == CLASSIFY:
            result: pb.ClassificationResult | pb.RegressionResult = pb.ClassificationResult(
                classifications=[
                    pb.Classifications(
                        classes=[pb.Class(label=label, score=float(score)) for label, score in row]
                    )
                    for row in tfserving.classifications(response, names, view.outputs)
                ]
            )
        else:
            values = tfserving.regressions(response, names, view.outputs)
            result = pb.RegressionResult(regressions=[pb.Regression(value=float(v)) for v in values])
        return model_version, result

    async def classify(self, request: pb.ClassificationRequest) -> pb.ClassificationResponse:
        spec = _spec_of(request.model_spec)
        model_version, result = await self._examples(spec, request.input, CLASSIFY)
        answer_spec = _answer_spec(model_version, spec.signature_name)
        return pb.ClassificationResponse(model_spec=answer_spec, result=result)  # type: ignore[arg-type]

    async def regress(self, request: pb.RegressionRequest) -> pb.RegressionResponse:
        spec = _spec_of(request.model_spec)
        model_version, result = await self._examples(spec, request.input, REGRESS)
        answer_spec = _answer_spec(model_version, spec.signature_name)
        return pb.RegressionResponse(model_spec=answer_spec, result=result)  # type: ignore[arg-type]

    async def multi_inference(self, request: pb.MultiInferenceRequest) -> pb.MultiInferenceResponse:
        """Every task on the same input; as TF Serving requires, one model for all tasks, each signature
        once."""
        if not request.tasks:
            raise invalid("Inference tasks should be non-empty")
        names = {task.model_spec.name if task.model_spec else "" for task in request.tasks}
        if len(names) != 1:
            raise invalid("All tasks should have the same model name")
        signatures = [task.model_spec.signature_name if task.model_spec else "" for task in request.tasks]
        if len(set(signatures)) != len(signatures):
            raise invalid("Duplicate evaluation of signature")
        results = []
        for task in request.tasks:
            if task.method_name not in (CLASSIFY, REGRESS):
                raise invalid(f"Unsupported signature method_name: {task.method_name}")
            spec = _spec_of(task.model_spec)
            model_version, result = await self._examples(spec, request.input, task.method_name)
            answer = pb.InferenceResult(model_spec=_answer_spec(model_version, spec.signature_name))
            if isinstance(result, pb.ClassificationResult):
                answer.classification_result = result
            else:
                answer.regression_result = result
            results.append(answer)
        return pb.MultiInferenceResponse(results=results)

    # ------------------------------------------------------------------------------------------ metadata

    async def get_model_metadata(self, request: pb.GetModelMetadataRequest) -> pb.GetModelMetadataResponse:
        spec = _spec_of(request.model_spec)
        if not spec.name:
            raise invalid("Missing ModelSpec")
        if not request.metadata_field:
            raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                raise invalid(f"Metadata field {field} is not supported")
        model_version, view = _resolved(self.tf, spec)
        defs = {
            name: tf.SignatureDef(
                inputs={i.name: _tensor_info(i) for i in inputs},
                outputs={o.name: _tensor_info(o) for o in outputs},
                method_name=tfserving.PREDICT_METHOD,
            )
            for name, (inputs, outputs) in self.tf.signature_defs(view).items()
        }
        packed = Any(type_url=SIGNATURE_DEF_MAP, value=bytes(pb.SignatureDefMap(signature_def=defs)))
        return pb.GetModelMetadataResponse(
            model_spec=_answer_spec(model_version, ""), metadata={"signature_def": packed}
        )

    async def get_model_status(self, request: pb.GetModelStatusRequest) -> pb.GetModelStatusResponse:
        spec = _spec_of(request.model_spec)
        statuses = self.tf.statuses(spec.name, _version(spec, self.tf))
        return pb.GetModelStatusResponse(
            model_version_status=[
                pb.ModelVersionStatus(
                    version=version,
                    state=_STATE[state],
                    status=pb.StatusProto(
                        error_code=Code.UNKNOWN if message else Code.OK, error_message=message
                    ),
                )
                for version, state, message in statuses
            ]
        )

    async def reload_config(self, request: pb.ReloadConfigRequest) -> pb.ReloadConfigResponse:
        config = request.config
        if config is None or config.model_config_list is None:
            raise invalid("ModelServerConfig must have a model_config_list")
        wanted = [entry.name for entry in config.model_config_list.config]
        if len(set(wanted)) != len(wanted) or not all(wanted):
            raise invalid("the model config list names each model once, by a non-empty name")
        serving = {entry["name"] for entry in self.repository.index(ready_only=True)}
        for name in wanted:
            if name not in serving:  # a model already serving keeps serving, as TF Serving keeps it
                try:
                    await self.repository.load_model(name)
                except InferError as e:  # Triton's INTERNAL for a model not found is not TF Serving's
                    raise invalid(e.message) from None
        for name in sorted(serving - set(wanted)):
            await self.repository.unload_model(name)
        return pb.ReloadConfigResponse(status=pb.StatusProto(error_code=Code.OK))


def _filtered(output_filter: list[str], available: list[str]) -> list[str]:
    for alias in output_filter:
        if alias not in available:
            raise invalid(
                f"output tensor alias not found in signature: {alias} "
                f"Outputs expected to be in the set {{{','.join(available)}}}."
            )
    if len(set(output_filter)) != len(output_filter):
        raise invalid("duplicate output tensor alias in output_filter")
    return list(output_filter)
