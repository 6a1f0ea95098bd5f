"""gRPC front doors (grpclib, on the same event loop as HTTP): KServe v2 and grps services.

`services()` lists every servicer the gRPC port serves; each protocol module adds its own here.
"""

from dataclasses import dataclass

from server.grpc.grps import GrpsService
from server.grpc.inference import InferenceService
from server.repository import Repository


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    max_message_bytes: int
    grps_default_model: str | None


def services(repository: Repository, settings: GrpcSettings) -> list:
    """The grpclib servicers served on --grpc-port."""
    return [InferenceService(repository), GrpsService(repository, settings.grps_default_model)]
