"""gRPC front doors (grpclib, on the same event loop as HTTP): KServe v2 and grps services.

`services()` lists every servicer the gRPC port serves; each protocol module adds its own here.
"""

import asyncio
from typing import Any

from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from server.grpc.grps import GrpsService
from server.grpc.inference import InferenceService
from server.repository import Repository


def services(repository: Repository, grps_default_model: str | None) -> list:
    """The grpclib servicers served on --grpc-port."""
    return [InferenceService(repository), GrpsService(repository, grps_default_model)]


class MessageSizeCodec(ProtoCodec):
    """grpclib's protobuf codec with --grpc-max-message-bytes enforced on every message received or sent,
    by every service on the port (grpclib itself has no limit). grpclib hands a message to the codec once
    it has it whole: a larger one is refused with RESOURCE_EXHAUSTED, the connection lives on."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"received message of {len(data)} bytes is larger than the server's limit of "
                f"{self.max_bytes} bytes (--grpc-max-message-bytes)",
            )
        return message_type.FromString(data)

    def encode(self, message: Any, message_type: Any) -> bytes:
        data = super().encode(message, message_type)
        if len(data) > self.max_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"response message of {len(data)} bytes is larger than the server's limit of "
                f"{self.max_bytes} bytes (--grpc-max-message-bytes)",
            )
        return data


async def drain(server: Server, services: list, timeout: float) -> None:
    """Stops a grpclib server gracefully: no new connections; calls in flight (on any connection) finish,
    up to `timeout` seconds; open ModelStreamInfer streams answer what they have read and end. grpclib's
    own close() would cancel them all, so this reaches into its listener and handlers."""
    loop = asyncio.get_running_loop()
    server._server.close()  # the asyncio server grpclib listens with
    for service in services:
        if hasattr(service, "begin_shutdown"):
            service.begin_shutdown()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        calls = [t for h in server._handlers for t in h._tasks.values() if not t.done()]
        if not calls:
            break
        await asyncio.wait(calls, timeout=deadline - loop.time())
    server.close()
    await server.wait_closed()
