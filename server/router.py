"""A small table-driven router: (method, path pattern) -> handler, and per-protocol error bodies.

Both transports (ours in server/http/, and the ASGI adapter for hypercorn) call it the same way: `find`
when the request head is in (so a wrong path, method or size is answered before the body is read), then
`call` with the whole request. HEAD is served by the GET routes; the transport sends no body.

A body with `Content-Encoding: gzip` or `deflate` (as Triton's clients send a compressed request) is
inflated before its handler sees it, to at most --max-request-bytes; any other coding but identity is
refused with Triton's text. Answers are not compressed (Accept-Encoding is a preference; Triton's
clients read plain answers).
"""

import logging
import re
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server import restricted

log = logging.getLogger("tensorgate.http")

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


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: Chunks  # a list is sent with its Content-Length; an async iterator is streamed
    # Sent after the body (HTTP/2; HTTP/1.1 with a streamed, chunked answer). Read once the body is out,
    # so a streamed answer can fill it as it ends (gRPC's status).
    trailers: list[tuple[bytes, bytes]] | None = None


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
    group: str = ""  # Triton's API group (server/restricted.py), "" for none


def compile_path(template: str) -> re.Pattern:
    """'/v2/models/{model}[/versions/{version}]/infer' -> a regex; [...] is optional, {x} one segment,
    {*x} the rest of the path (slashes included, maybe empty)."""
    regex = re.escape(template).replace(r"\[", "(?:").replace(r"\]", ")?")
    regex = re.sub(r"\\\{\\\*(\w+)\\\}", r"(?P<\1>.*)", regex)
    regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", regex)
    return re.compile(f"^{regex}$")


class Router:
    """Routes by method and path. With `forward` (a front-end worker's, server/frontend.py), a request
    that no route of its method takes is forwarded whole to the engine, which answers it (404 and 405
    too) as the one server it is."""

    def __init__(
        self, fallback_errors: ErrorResponder, max_body_bytes: int = 1 << 30, forward: Handler | None = None
    ) -> None:
        self.max_body_bytes = max_body_bytes  # what a compressed body may inflate to
        self.routes: dict[str, list[Route]] = {}  # by method: a request tries only its method's routes
        self.fallback_errors = fallback_errors
        self.forwarded = None if forward is None else Route("", re.compile(""), forward, fallback_errors)
        # (method, path) -> its match: a server sees the same few paths again and again. Handlers
        # only read the parameters, so a match is shared. Cleared when full, so any path may come.
        self._matched: dict[tuple[str, str], tuple[Route, dict[str, str]]] = {}
        # group -> (the header, lowercased, and the value it must have; what the refusal says)
        self.restricted: dict[str, tuple[bytes, bytes, str]] = {}

    def add(
        self, method: str, template: str, handler: Handler, errors: ErrorResponder, group: str | None = None
    ) -> None:
        """A route; its API group is read from the template unless given (restricted.http_group)."""
        group = restricted.http_group(template) if group is None else group
        route = Route(method, compile_path(template), handler, errors, group)
        self.routes.setdefault(method, []).append(route)
        self._matched.clear()

    def restrict(self, restrictions: restricted.Restrictions) -> None:
        """--http-restricted-api: the groups that answer only a request with their header and value."""
        self.restricted = {
            group: (header.lower().encode("latin-1"), value.encode(), restricted.http_message(header))
            for group, (header, value) in restrictions.items()
        }

    def find(self, method: str, path: str) -> tuple[Route, dict[str, str]] | HttpResponse:
        """The route and its path parameters, or the answer when there is none (404, 405 with Allow)."""
        try:
            return self.match("GET" if method == "HEAD" else method, path)
        except MethodNotAllowed as e:
            response = e.errors(e)
            response.headers.append((b"allow", ", ".join(e.allowed).encode()))
            return response
        except InferError as e:
            return self.fallback_errors(e)

    async def call(self, route: Route, request: HttpRequest) -> HttpResponse:
        """The handler's answer, or its error in the route's protocol's shape (never a traceback)."""
        try:
            if self.restricted and route.group in self.restricted:
                header, value, refusal = self.restricted[route.group]
                if request.headers.get(header) != value:
                    raise Restricted(refusal)
            coding = request.headers.get(b"content-encoding")
            if coding is not None and coding != b"identity":
                request.body = inflate(coding, request.body, self.max_body_bytes)
            return await route.handler(request)
        except InferError as e:
            return route.errors(e)
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            return route.errors(
                InferError(ErrorKind.INTERNAL, f"internal error serving {request.method} {request.path}")
            )

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
        if self.forwarded is not None:
            return self.forwarded, {}
        allowed = [
            route
            for other, routes in self.routes.items()
            if other != method
            for route in routes
            if route.pattern.match(path)
        ]
        if allowed:
            methods = {r.method for r in allowed}
            if "GET" in methods:
                methods.add("HEAD")
            raise MethodNotAllowed(allowed[0].errors, sorted(methods))
        raise InferError(ErrorKind.NOT_FOUND, f"no endpoint {method} {path}")


INFLATE_WBITS = {b"gzip": 31, b"deflate": 15}  # zlib's window bits for each Content-Encoding


def inflate(coding: bytes, body: bytes | memoryview, limit: int) -> bytes:
    """A compressed request body inflated, BodyTooLarge past `limit` (a small body must not unpack into
    gigabytes)."""
    wbits = INFLATE_WBITS.get(coding.strip().lower())
    if wbits is None:
        raise InferError(ErrorKind.INVALID_ARGUMENT, "Unsupported compression type")
    unpacker = zlib.decompressobj(wbits)
    try:
        data = unpacker.decompress(body, limit + 1)
    except zlib.error as e:
        raise InferError(
            ErrorKind.INVALID_ARGUMENT, f"the body does not inflate as {coding.decode('latin-1')}: {e}"
        ) from None
    if len(data) > limit:
        raise BodyTooLarge(limit)
    if not unpacker.eof:
        raise InferError(
            ErrorKind.INVALID_ARGUMENT, f"the body is a truncated {coding.decode('latin-1')} stream"
        )
    return data


class BodyTooLarge(InferError):
    fixed_http_status = 413  # refused before it is read, as on every endpoint (TF Serving's 429 is for load)

    def __init__(self, limit: int) -> None:
        super().__init__(
            ErrorKind.RESOURCE_EXHAUSTED,
            f"request body exceeds the {limit}-byte limit (raise it with --max-request-bytes)",
        )


class Restricted(InferError):
    fixed_http_status = 403  # Triton's answer to a restricted API called without its header

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.UNAVAILABLE, message)


def framing_error(errors: ErrorResponder, message: str, status: int = 400) -> HttpResponse:
    """An answer to a request whose framing cannot be trusted (RFC 9112 6.1, 6.3); the connection then
    closes, as where the next request starts is unknown."""
    response = errors(InferError(ErrorKind.INVALID_ARGUMENT, message))
    response.status = status
    response.headers.append((b"connection", b"close"))
    return response


def stalled_body(errors: ErrorResponder, seconds: float) -> HttpResponse:
    """408 for a request body that stopped coming (a slow upload holding a connection)."""
    message = f"request body made no progress for {seconds:g} s (raise it with --http-body-timeout)"
    return framing_error(errors, message, status=408)


class MethodNotAllowed(InferError):
    fixed_http_status = 405

    def __init__(self, errors: ErrorResponder, allowed: list[str]) -> None:
        super().__init__(ErrorKind.INVALID_ARGUMENT, f"method not allowed here; use {', '.join(allowed)}")
        self.errors = errors
        self.allowed = allowed
