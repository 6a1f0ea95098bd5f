"""A small table-driven router: (method, path pattern) -> handler, and per-protocol error bodies."""

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from codec.errors import ErrorKind, InferError

Chunks = list[bytes | memoryview] | AsyncIterator[bytes]
MATCHES_KEPT = 1024


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    query: bytes
    headers: dict[bytes, bytes]  # lowercased names
    body: bytes | memoryview = b""
    params: dict[str, str] = field(default_factory=dict)  # path parameters; "" when left out
    receive: Any = None  # the ASGI receive channel: what unless_client_leaves() watches


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: Chunks  # a list is sent with its Content-Length; an async iterator is streamed


def body_response(body: bytes, content_type: bytes = b"application/json", status: int = 200) -> HttpResponse:
    """A whole body with its Content-Type and Content-Length."""
    return HttpResponse(
        status, [(b"content-type", content_type), (b"content-length", str(len(body)).encode())], [body]
    )


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
ErrorResponder = Callable[[InferError], HttpResponse]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    pattern: re.Pattern
    handler: Handler
    errors: ErrorResponder  # the protocol's own error shape


def compile_path(template: str) -> re.Pattern:
    """'/v2/models/{model}[/versions/{version}]/infer' -> a regex; [...] is optional, {x} one segment,
    {*x} the rest of the path (slashes included, maybe empty)."""
    regex = re.escape(template).replace(r"\[", "(?:").replace(r"\]", ")?")
    regex = re.sub(r"\\\{\\\*(\w+)\\\}", r"(?P<\1>.*)", regex)
    regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", regex)
    return re.compile(f"^{regex}$")


class Router:
    def __init__(self, fallback_errors: ErrorResponder) -> None:
        self.routes: dict[str, list[Route]] = {}  # by method: a request tries only its method's routes
        self.fallback_errors = fallback_errors
        # (method, path) -> its match: a server sees the same few paths again and again. Handlers
        # only read the parameters, so a match is shared. Cleared when full, so any path may come.
        self._matched: dict[tuple[str, str], tuple[Route, dict[str, str]]] = {}

    def add(self, method: str, template: str, handler: Handler, errors: ErrorResponder) -> None:
        self.routes.setdefault(method, []).append(Route(method, compile_path(template), handler, errors))
        self._matched.clear()

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        matched = self._matched.get((method, path))
        if matched is not None:
            return matched
        for route in self.routes.get(method, ()):
            found = route.pattern.match(path)
            if found is not None:
                if len(self._matched) >= MATCHES_KEPT:
                    self._matched.clear()
                matched = self._matched[method, path] = (route, found.groupdict(""))
                return matched
        allowed = [
            route
            for other, routes in self.routes.items()
            if other != method
            for route in routes
            if route.pattern.match(path)
        ]
        if allowed:
            raise MethodNotAllowed(allowed[0].errors, sorted({r.method for r in allowed}))
        raise InferError(ErrorKind.NOT_FOUND, f"no endpoint {method} {path}")


class MethodNotAllowed(InferError):
    fixed_http_status = 405

    def __init__(self, errors: ErrorResponder, allowed: list[str]) -> None:
        super().__init__(ErrorKind.INVALID_ARGUMENT, f"method not allowed here; use {', '.join(allowed)}")
        self.errors = errors
        self.allowed = allowed
