"""KServe v2 REST endpoints: health, server and model metadata, model config, statistics, infer."""

import orjson

from codec import v2_http
from codec.errors import InferError, http_status
from server import __version__
from server.repository import Repository
from server.router import HttpRequest, HttpResponse, Router, body_response
from server.statistics import model_statistics

EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "statistics",
]


def json_response(doc: object, status: int = 200) -> HttpResponse:
    return body_response(orjson.dumps(doc), v2_http.JSON_CONTENT_TYPE, status)


def error_response(error: InferError) -> HttpResponse:
    return json_response({"error": error.message}, http_status(error))


class V2Endpoints:
    def __init__(self, repository: Repository) -> None:
        self.repository = repository

    def install(self, router: Router) -> None:
        model = "/v2/models/{model}[/versions/{version}]"
        for method, template, handler in (
            ("GET", "/v2", self.server_metadata),
            ("GET", "/v2/health/live", self.live),
            ("GET", "/v2/health/ready", self.ready),
            # before the model routes: /v2/models/stats is the statistics of all models, as in Triton
            ("GET", "/v2/models[/{model}[/versions/{version}]]/stats", self.model_stats),
            ("GET", model, self.model_metadata),
            ("GET", model + "/ready", self.model_ready),
            ("GET", model + "/config", self.model_config),
            ("POST", model + "/infer", self.infer),
        ):
            router.add(method, template, handler, error_response)

    async def server_metadata(self, request: HttpRequest) -> HttpResponse:
        return json_response({"name": "tensorgate", "version": __version__, "extensions": EXTENSIONS})

    async def live(self, request: HttpRequest) -> HttpResponse:
        return json_response({"live": True})

    async def ready(self, request: HttpRequest) -> HttpResponse:
        ready = self.repository.ready
        return json_response({"ready": ready}, 200 if ready else 400)

    async def model_ready(self, request: HttpRequest) -> HttpResponse:
        name = request.params["model"]
        ready = self.repository.model(name).is_ready(request.params["version"])
        return json_response({"name": name, "ready": ready}, 200 if ready else 400)

    async def model_metadata(self, request: HttpRequest) -> HttpResponse:
        model = self.repository.model(request.params["model"])
        return json_response(model.metadata(request.params["version"]))

    async def model_config(self, request: HttpRequest) -> HttpResponse:
        model = self.repository.model(request.params["model"])
        return json_response(model.config_of(request.params["version"]))

    async def model_stats(self, request: HttpRequest) -> HttpResponse:
        params = request.params
        return json_response(model_statistics(self.repository, params["model"], params["version"]))

    async def infer(self, request: HttpRequest) -> HttpResponse:
        name, version = request.params["model"], request.params["version"]
        model_version = self.repository.resolve(name, version)
        header_length = v2_http.parse_header_length(
            request.headers.get(v2_http.HEADER_LENGTH_BYTES), len(request.body)
        )
        infer_request = v2_http.decode_request(request.body, header_length, name, version)
        response = await model_version.infer(infer_request)
        encoded = v2_http.encode_response(response, infer_request)
        return HttpResponse(200, encoded.headers, encoded.chunks)
