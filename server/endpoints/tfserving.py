"""TensorFlow Serving REST API v1 endpoints, on the HTTP port and the models KServe v2 serves.

Two things a Triton config does not say are read from its `parameters`:
- `version_labels`: "stable=1,canary=2" names versions for `/v1/models/{m}/labels/{label}`.
- `signature:<name>`: "out1,out2" declares a signature answering those outputs (all inputs). The model
  itself is `serving_default` (every output); TF's method names (tensorflow/serving/predict, ...) and ""
  name it too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from tensorgate.codec import tfserving
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.tensor import InferResponse
from tensorgate.codec.tfserving import TensorInfo
from tensorgate.server.model import UNLOADED, ModelState
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response, front_end

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion, TensorSpec
    from tensorgate.server.repository import Repository

VERBS = ("predict", "classify", "regress")
# Every method gets the catch-all, so nothing under /v1/ is answered 405 or with another protocol's body.
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
LABELS_PARAMETER = "version_labels"
SIGNATURE_PREFIX = "signature:"
METHOD_NAMES = ("tensorflow/serving/predict", "tensorflow/serving/classify", "tensorflow/serving/regress")
_STATES = {ModelState.READY: "AVAILABLE", ModelState.LOADING: "LOADING", ModelState.UNLOADING: "UNLOADING"}


def error_response(error: InferError) -> HttpResponse:
    status, body = tfserving.error_body(error)
    return body_response(body, status=status)


def _info(spec: TensorSpec) -> TensorInfo:
    own = spec.model_dims if spec.model_dims is not None else spec.dims
    shape = ((-1,) if spec.batched else ()) + own
    return TensorInfo(spec.name, spec.dtype.v2, shape, spec.shape, spec.optional)


def _config_error(model: str, message: str) -> InferError:
    return InferError(ErrorKind.INTERNAL, f"model '{model}': config parameter {message}")


def _parameter(config: dict | None, key: str) -> str:
    value = ((config or {}).get("parameters") or {}).get(key) or {}
    return value.get("string_value", "") if isinstance(value, dict) else ""


def version_labels(config: dict | None, model: str) -> dict[str, int]:
    """The `version_labels` parameter, "label=version,...", as a dict."""
    raw, labels = _parameter(config, LABELS_PARAMETER), {}
    for entry in raw.split(","):
        if not entry.strip():
            continue
        label, sep, number = (part.strip() for part in entry.partition("="))
        if not (sep and label and number.isascii() and number.isdigit()):
            raise _config_error(model, f"'{LABELS_PARAMETER}' must read 'label=version,...', not {raw!r}")
        labels[label] = int(number)
    return labels


def signatures(config: dict, outputs: list[str], model: str) -> dict[str, list[str] | None]:
    """Signature name -> the outputs it answers (None: all). `serving_default` is always there."""
    found: dict[str, list[str] | None] = {tfserving.DEFAULT_SIGNATURE: None}
    for key in config.get("parameters") or {}:
        if not key.startswith(SIGNATURE_PREFIX):
            continue
        raw = _parameter(config, key)
        names = [name.strip() for name in raw.split(",") if name.strip()]
        unknown = [name for name in names if name not in outputs]
        if not key[len(SIGNATURE_PREFIX) :]:
            raise _config_error(model, f"'{key}' names no signature")
        if not names or unknown:
            raise _config_error(
                model, f"'{key}' must list some of the outputs {', '.join(outputs)}, not {raw!r}"
            )
        found[key[len(SIGNATURE_PREFIX) :]] = names
    return found


class _View:
    """A model version as TF Serving shows it; built once per version."""

    def __init__(self, version: ModelVersion) -> None:
        self.inputs = [_info(spec) for spec in version.inputs.values()]
        self.outputs = {name: _info(spec) for name, spec in version.outputs.items()}
        self.signatures = signatures(version.config, list(self.outputs), version.name)
        self.model = version.name

    def outputs_for(self, signature: str) -> list[str] | None:
        if signature in self.signatures:
            return self.signatures[signature]
        if not signature or signature in METHOD_NAMES:
            return None
        raise invalid(
            f"Serving signature name: \"{signature}\" not found in signature def of model '{self.model}' "
            f"(it has: {', '.join(self.signatures)})"
        )


class TFServingEndpoints:
    def __init__(self, repository: Repository) -> None:
        self.repository = repository
        self._views: weakref.WeakKeyDictionary[ModelVersion, _View] = weakref.WeakKeyDictionary()

    def install(self, router: Router) -> None:
        versioned = "/v1/models/{model}[/versions/{version}]"
        labeled = "/v1/models/{model}/labels/{label}"
        for verb in VERBS:
            for base in (versioned, labeled):
                router.add("POST", f"{base}:{verb}", getattr(self, verb), error_response)
        for base in (versioned, labeled):
            router.add("GET", base + "/metadata", self.metadata, error_response)
            router.add("GET", base, self.status, error_response)
        for method in METHODS:
            router.add(method, "/v1[/{*rest}]", self.malformed, error_response)

    # ------------------------------------------------------------------------------------------ helpers

    def _view(self, version: ModelVersion) -> _View:
        view = self._views.get(version)
        if view is None:
            view = self._views[version] = _View(version)
        return view

    def _version(self, request: HttpRequest) -> str:
        """The version the URL names, by number or by label; "" when it names none (the latest ready)."""
        params = request.params
        name, label, version = params["model"], params.get("label"), params.get("version")
        if ":" in name:
            raise _malformed(request)
        if label:
            labels = version_labels(self.repository.model(name).config, name)
            if label not in labels:
                raise invalid(f"Unrecognized servable version label: {label}")
            return str(labels[label])
        if not version:
            return ""
        if not (version.isascii() and version.isdigit()):
            raise _malformed(request)
        return version

    def _resolve(self, request: HttpRequest) -> tuple[ModelVersion, _View]:
        model_version = self.repository.resolve(request.params["model"], self._version(request))
        return model_version, self._view(model_version)

    # ------------------------------------------------------------------------------------------ endpoints

    @front_end
    async def predict(self, request: HttpRequest) -> HttpResponse:
        model_version, view = self._resolve(request)
        doc = tfserving.loads(request.body, "the request body")
        outputs = view.outputs_for(tfserving.signature_name(doc))
        infer_request, columnar = tfserving.decode_predict(
            doc, view.inputs, model_version.name, model_version.version_str, outputs
        )
        response = None if infer_request is None else await model_version.infer(infer_request)
        return body_response(tfserving.encode_predict(response, view.outputs, columnar))

    @front_end
    async def classify(self, request: HttpRequest) -> HttpResponse:
        return await self._examples(request, tfserving.classify_outputs, tfserving.encode_classify)

    @front_end
    async def regress(self, request: HttpRequest) -> HttpResponse:
        return await self._examples(request, tfserving.regress_output, tfserving.encode_regress)

    async def _examples(
        self,
        request: HttpRequest,
        pick: Callable[[list[str], str], list[str]],
        encode: Callable[[InferResponse | None, list[str], dict[str, TensorInfo]], bytes],
    ) -> HttpResponse:
        model_version, view = self._resolve(request)
        doc = tfserving.loads(request.body, "the request body")
        selected = view.outputs_for(tfserving.signature_name(doc))
        names = pick(list(view.outputs) if selected is None else selected, model_version.name)
        infer_request = tfserving.decode_examples(
            doc, view.inputs, model_version.name, model_version.version_str, names
        )
        response = None if infer_request is None else await model_version.infer(infer_request)
        return body_response(encode(response, names, view.outputs))

    async def status(self, request: HttpRequest) -> HttpResponse:
        name = request.params["model"]
        version = self._version(request)
        model = self.repository.model(name)
        if version:
            found = model.versions.get(int(version))
            if found is None:
                raise InferError(ErrorKind.NOT_FOUND, f"Could not find version {version} of model {name}")
            versions = [found]
        else:
            versions = model.newest_first
            if not versions:
                reason = f": {model.reason}" if model.reason else ""
                raise InferError(ErrorKind.NOT_FOUND, f"Could not find any versions of model {name}{reason}")
        statuses = [tfserving.version_status(v.version, *_state(v)) for v in versions]
        return body_response(tfserving.model_status(statuses))

    async def metadata(self, request: HttpRequest) -> HttpResponse:
        model_version, view = self._resolve(request)
        everything = list(view.outputs.values())
        signature_defs = {
            name: (view.inputs, everything if outputs is None else [view.outputs[o] for o in outputs])
            for name, outputs in view.signatures.items()
        }
        body = tfserving.model_metadata(model_version.name, model_version.version_str, signature_defs)
        return body_response(body)

    async def malformed(self, request: HttpRequest) -> HttpResponse:
        if request.method == "GET" and request.path.rstrip("/") == "/v1/models":
            raise invalid("Missing model name in request.")
        raise _malformed(request)


def _malformed(request: HttpRequest) -> InferError:
    return invalid(f"Malformed request: {request.method} {request.path}")


def _state(version: ModelVersion) -> tuple[str, str]:
    """TF Serving's ModelVersionStatus state and error message for a version."""
    if version.state in _STATES:
        return _STATES[version.state], ""
    if not version.reason:
        return "START", ""  # not loaded yet
    if version.reason == UNLOADED:  # a clean end
        return "END", ""
    return "END", version.reason
