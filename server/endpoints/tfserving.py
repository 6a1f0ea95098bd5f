"""TensorFlow Serving REST API v1 endpoints, on the HTTP port and the models KServe v2 serves (what TF
Serving's view of the repository is: server/tfserving.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tensorgate.codec import tfserving
from tensorgate.codec.errors import InferError, invalid
from tensorgate.codec.tensor import InferResponse
from tensorgate.codec.tfserving import TensorInfo
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response
from tensorgate.server.tfserving import TFServing, View

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion

VERBS = ("predict", "classify", "regress")
VERSIONED = "/v1/models/{model}[/versions/{version}]"
LABELED = "/v1/models/{model}/labels/{label}"
# Every method gets the catch-all, so nothing under /v1/ is answered 405 or with another protocol's body.
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def error_response(error: InferError) -> HttpResponse:
    status, body = tfserving.error_body(error)
    return body_response(body, status=status)


def version_named(tf: TFServing, request: HttpRequest) -> str:
    """The version the URL names, by number or by label; "" when it names none (the latest ready)."""
    params = request.params
    name, label, version = params["model"], params.get("label"), params.get("version")
    if ":" in name:
        raise _malformed(request)
    if label:
        return tf.labeled(name, label)
    if not version:
        return ""
    if not (version.isascii() and version.isdigit()):
        raise _malformed(request)
    return version


class TFServingInference:
    """predict, classify and regress: the front end's, through the engine client."""

    def __init__(self, tf: TFServing) -> None:
        self.tf = tf

    def install(self, router: Router) -> None:
        for verb in VERBS:
            for base in (VERSIONED, LABELED):
                router.add("POST", f"{base}:{verb}", getattr(self, verb), error_response)

    def _resolve(self, request: HttpRequest) -> tuple[ModelVersion, View]:
        return self.tf.resolve(request.params["model"], version_named(self.tf, request))

    async def predict(self, request: HttpRequest) -> HttpResponse:
        model_version, view = self._resolve(request)
        doc = tfserving.loads(request.body, "the request body")
        outputs = view.outputs_for(tfserving.signature_name(doc))
        infer_request, columnar = tfserving.decode_predict(
            doc, view.inputs, model_version.name, model_version.version_str, outputs
        )
        response = None if infer_request is None else await self.tf.engine.infer(model_version, infer_request)
        return body_response(tfserving.encode_predict(response, view.outputs, columnar))

    async def classify(self, request: HttpRequest) -> HttpResponse:
        return await self._examples(request, tfserving.classify_outputs, tfserving.encode_classify)

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
        response = None if infer_request is None else await self.tf.engine.infer(model_version, infer_request)
        return body_response(encode(response, names, view.outputs))


class TFServingEndpoints:
    """A model's status and metadata, and TF Serving's answer to any other path under /v1/. Installed
    after TFServingInference: its catch-all takes what no verb took."""

    def __init__(self, tf: TFServing) -> None:
        self.tf = tf

    def install(self, router: Router) -> None:
        for base in (VERSIONED, LABELED):
            router.add("GET", base + "/metadata", self.metadata, error_response)
            router.add("GET", base, self.status, error_response)
        for method in METHODS:
            router.add(method, "/v1[/{*rest}]", self.malformed, error_response)

    async def status(self, request: HttpRequest) -> HttpResponse:
        statuses = self.tf.statuses(request.params["model"], version_named(self.tf, request))
        return body_response(tfserving.model_status([tfserving.version_status(*s) for s in statuses]))

    async def metadata(self, request: HttpRequest) -> HttpResponse:
        model_version, view = self.tf.resolve(request.params["model"], version_named(self.tf, request))
        body = tfserving.model_metadata(
            model_version.name, model_version.version_str, self.tf.signature_defs(view)
        )
        return body_response(body)

    async def malformed(self, request: HttpRequest) -> HttpResponse:
        if request.method == "GET" and request.path.rstrip("/") == "/v1/models":
            raise invalid("Missing model name in request.")
        raise _malformed(request)


def _malformed(request: HttpRequest) -> InferError:
    return invalid(f"Malformed request: {request.method} {request.path}")
