"""The seam between a front end (our transport, the routers, and the inference endpoints and codecs of every
protocol, server/assembly.py `install_front_end`) and the models: `EngineClient`, all that those endpoints
ask of them. One process is a front end plus `InProcess` (the repository and the client shared-memory
registry it holds) plus every other endpoint; a front-end worker is a front end plus the engine over its
link (server/frontend.py `LinkedEngine`), which also runs the models it may run itself (--worker-models
inline), and a `Forwarder` that every other route and gRPC method goes to.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tensorgate.codec.tensor import InferRequest, InferResponse
    from tensorgate.server.http.grpc_call import GrpcCall
    from tensorgate.server.model import ModelVersion
    from tensorgate.server.repository_model import Model
    from tensorgate.server.router import HttpRequest, HttpResponse
    from tensorgate.server.served_models import ServedModels
    from tensorgate.server.shared_memory import SharedMemory


class ModelTable(Protocol):
    """The models by name, as the front end sees them: the repository's in one process, a worker's copy of
    the engine's table in a worker. grps reads the names (its default model), TF Serving a model's
    config (its version labels)."""

    models: dict[str, Model]

    def model(self, name: str) -> Model:
        """The model of that name; raises InferError (NOT_FOUND) as a request for it is answered."""
        ...


class EngineClient(Protocol):
    table: ModelTable

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The version a request naming `version` ("": the newest ready one) reaches; raises InferError
        (NOT_FOUND, UNAVAILABLE) as a request for it is answered. The endpoints read its config to decode."""
        ...

    def infer(self, version: ModelVersion, request: InferRequest) -> Coroutine[Any, Any, InferResponse]:
        """The answer to one request to `version`, shared-memory regions included; raises InferError. A
        coroutine: an endpoint may run it in the read callback until it first waits (server/http/eager.py)."""
        ...

    def infer_stream(self, version: ModelVersion, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The answers of a model that streams them (`version.streams`)."""
        ...


class Forwarder(Protocol):
    """Where a front-end worker sends every route and gRPC method it does not serve itself (all but the
    front end's, server/assembly.py): the engine, which answers them as the one server it is."""

    async def http(self, port: str, request: HttpRequest) -> HttpResponse:
        """A route of the `port` named ("HTTP", "gRPC", "Metrics"), answered by the engine."""
        ...

    async def grpc(self, path: str, call: GrpcCall) -> None:
        """A gRPC method, its messages relayed both ways."""
        ...


class InProcess:
    """The models of this process: what one process, and the engine's own front end, serve through."""

    def __init__(self, repository: ServedModels, shared_memory: SharedMemory) -> None:
        self.table = repository
        self.resolve = repository.resolve  # bound once: the hot path calls it for every request
        self.shared_memory = shared_memory

    def infer(self, version: ModelVersion, request: InferRequest) -> Coroutine[Any, Any, InferResponse]:
        if request.shared_memory:  # it names a region: read and written through the registry
            return self.shared_memory.infer(version, request)
        return version.infer(request)

    def infer_stream(self, version: ModelVersion, request: InferRequest) -> AsyncIterator[InferResponse]:
        return version.infer_stream(request)
