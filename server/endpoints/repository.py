"""Triton's model repository extension over HTTP: index, load and unload.

    POST /v2/repository/index             {"ready": bool}?  -> [{"name", "version", "state", "reason"}]
    POST /v2/repository/models/{m}/load   {"parameters": {"config": "<JSON>", "file:<v>/<name>": "<b64>"}}?
    POST /v2/repository/models/{m}/unload {"parameters": {"unload_dependents": bool}}?

Bodies are optional. Load and unload answer 200 with an empty body, as Triton does.

A load's parameters are refused as Triton's HTTP front end refuses them: each must be a string (the
config JSON or a file's base64), named `config` or `file:...`, else INTERNAL. An override Triton's core
cannot use (a config that does not parse into a model config, files without a config) fails, as Triton's
fails, its polling of the model: INTERNAL, 'failed to load ..., failed to poll from model repository'.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

import orjson

from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.server.endpoints.v2 import error_response, json_response
from tensorgate.server.repository_files import parse_config
from tensorgate.server.router import HttpRequest, HttpResponse, Router

if TYPE_CHECKING:
    from tensorgate.server.repository import Repository

FILE_PREFIX = "file:"


def _body(request: HttpRequest) -> dict:
    """The request's JSON object; {} for an empty body."""
    if not len(request.body):
        return {}
    try:
        doc = orjson.loads(request.body)
    except orjson.JSONDecodeError as e:
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    return doc


def _parameters(doc: dict) -> dict:
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid("'parameters' must be a JSON object")
    return parameters


def check_overrides(name: str, config: str | None, files: dict) -> None:
    """An override Triton's core refuses while it polls the model (InitializeModelInfo): its answer,
    then why (Triton only logs why)."""
    try:
        if config is not None:
            parse_config(name, config)
        elif files:
            raise invalid("Load parameter 'config' must be specified for model file override")
    except InferError as e:
        raise InferError(
            ErrorKind.INTERNAL, f"failed to load '{name}', failed to poll from model repository: {e.message}"
        ) from None


def _files(parameters: dict) -> dict[str, bytes]:
    """The file overrides: "file:1/model.py" -> its base64-decoded contents, keyed "1/model.py". Every
    parameter is read as Triton's HTTP front end reads it: a string, `config` or `file:...`."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise InferError(ErrorKind.INTERNAL, "attempt to access JSON non-string as string")
        if key == "config":
            continue
        if not key.startswith(FILE_PREFIX):
            raise InferError(ErrorKind.INTERNAL, "unexpected error on creating Triton parameter")
        try:
            files[key[len(FILE_PREFIX) :]] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as e:
            raise invalid(f"File parameter '{key}' is not valid base64: {e}") from None
    return files


def _empty_ok() -> HttpResponse:
    return HttpResponse(200, [(b"content-length", b"0")], [b""])


class RepositoryEndpoints:
    def __init__(self, repository: Repository) -> None:
        self.repository = repository

    def install(self, router: Router) -> None:
        for template, handler in (
            ("/v2/repository/index", self.index),
            ("/v2/repository/models/{model}/load", self.load),
            ("/v2/repository/models/{model}/unload", self.unload),
        ):
            router.add("POST", template, handler, error_response)

    async def index(self, request: HttpRequest) -> HttpResponse:
        ready = _body(request).get("ready", False)
        if not isinstance(ready, bool):
            raise invalid("'ready' must be true or false")
        # Triton's JSON leaves out what is empty: a model never loaded is only its name.
        entries = [
            {key: value for key, value in entry.items() if value or key == "name"}
            for entry in self.repository.index(ready)
        ]
        return json_response(entries)

    async def load(self, request: HttpRequest) -> HttpResponse:
        parameters = _parameters(_body(request))
        name, config, files = request.params["model"], parameters.get("config"), _files(parameters)
        check_overrides(name, config, files)
        await self.repository.load_model(name, config, files or None)
        return _empty_ok()

    async def unload(self, request: HttpRequest) -> HttpResponse:
        unload_dependents = _parameters(_body(request)).get("unload_dependents", False)
        if not isinstance(unload_dependents, bool):
            raise invalid("'unload_dependents' must be true or false")
        await self.repository.unload_model(request.params["model"], unload_dependents)
        return _empty_ok()
