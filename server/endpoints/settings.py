"""Triton's logging and trace extensions over REST: GET/POST /v2/logging, GET/POST
/v2[/models/{m}]/trace/setting. A POST changes the settings it names and answers all of them; an empty
body changes nothing. The gRPC twins are LogSettings and TraceSetting (server/grpc/inference.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorgate.codec.errors import invalid
from tensorgate.codec.v2_http import loads
from tensorgate.server.endpoints.v2 import error_response, json_response
from tensorgate.server.router import HttpRequest, HttpResponse, Router
from tensorgate.server.tracing.settings import changes_from_json
from tensorgate.server.tracing.tracer import check_model

if TYPE_CHECKING:
    from tensorgate.server.log_settings import LogControl
    from tensorgate.server.repository import Repository
    from tensorgate.server.tracing.tracer import Tracer


class SettingsEndpoints:
    def __init__(self, repository: Repository, logs: LogControl, tracer: Tracer) -> None:
        self.repository = repository
        self.logs = logs
        self.tracer = tracer

    def install(self, router: Router) -> None:
        for method in ("GET", "POST"):
            router.add(method, "/v2/logging", self.logging, error_response)
            router.add(method, "/v2[/models/{model}]/trace/setting", self.trace_setting, error_response)

    async def logging(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST":
            changes = _object(request.body, "log setting request")
            # null leaves a setting as it is, as Triton reads it
            self.logs.update({name: value for name, value in changes.items() if value is not None})
        return json_response(self.logs.settings.as_dict())

    async def trace_setting(self, request: HttpRequest) -> HttpResponse:
        model = request.params["model"]
        if model:
            check_model(self.repository, model)
        if request.method == "POST":
            changes = changes_from_json(_object(request.body, "trace setting request"))
            self.tracer.update(model, changes)
        return json_response(self.tracer.answer(model))


def _object(body: bytes | memoryview, what: str) -> dict:
    """A request's JSON object; an empty body is an empty one (Triton allows it)."""
    if not len(body):
        return {}
    doc = loads(body, f"the {what}")
    if not isinstance(doc, dict):
        raise invalid(f"the {what} must be a JSON object")
    return doc
