"""`grpc.health.v1.Health` (grpc/grpc doc/health-checking.md), what Kubernetes' gRPC probes call.

The service names it answers for: "" and each gRPC service the server offers are the server's readiness
(as /v2/health/ready); a loaded model's name is that model's readiness. Check on any other name is
NOT_FOUND; Watch sends SERVICE_UNKNOWN and keeps watching (the model may be loaded later).

Watch sends the status at once and again whenever it changes, looked at every WATCH_SECONDS (the
repository's states change in many places; a look costs a dict lookup). At shutdown each watch sends
NOT_SERVING and ends UNAVAILABLE, so open watches do not hold the server up.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

import tensorgate.proto.grpc.health.v1 as pb
from tensorgate.server.repository import Repository

WATCH_SECONDS = 0.1
SERVING = pb.HealthCheckResponseServingStatus.SERVING
NOT_SERVING = pb.HealthCheckResponseServingStatus.NOT_SERVING
SERVICE_UNKNOWN = pb.HealthCheckResponseServingStatus.SERVICE_UNKNOWN


class HealthService(pb.HealthBase):
    def __init__(self, repository: Repository) -> None:
        self.repository = repository
        self.services: set[str] = set()  # the gRPC services served (set once every servicer is made)
        self.closing = asyncio.Event()

    def begin_shutdown(self) -> None:
        self.closing.set()

    def status(self, service: str) -> pb.HealthCheckResponseServingStatus | None:
        """The serving status of `service`, None for a name this server does not know."""
        if service == "" or service in self.services:
            ready = self.repository.ready
        else:
            model = self.repository.models.get(service)
            if model is None:
                return None
            ready = model.ready
        return SERVING if ready and not self.closing.is_set() else NOT_SERVING

    async def check(self, message: pb.HealthCheckRequest) -> pb.HealthCheckResponse:
        status = self.status(message.service)
        if status is None:
            raise GRPCError(Status.NOT_FOUND, f"unknown service '{message.service}'")
        return pb.HealthCheckResponse(status=status)

    async def watch(self, message: pb.HealthCheckRequest) -> AsyncIterator[pb.HealthCheckResponse]:
        sent = None
        while True:
            status = self.status(message.service)
            if status is None:
                status = SERVICE_UNKNOWN
            if status != sent:
                yield pb.HealthCheckResponse(status=status)
                sent = status
            if self.closing.is_set():
                raise GRPCError(Status.UNAVAILABLE, "the server is shutting down")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), WATCH_SECONDS)
