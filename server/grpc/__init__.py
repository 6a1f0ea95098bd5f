"""gRPC services (handlers, not transport: server/http/grpc_call.py serves them on our HTTP/2 layer).

`services()` lists every servicer the server offers; each protocol module adds its own here.
"""

import re

from tensorgate.server.engine_client import EngineClient
from tensorgate.server.grpc.grps import GrpsService
from tensorgate.server.grpc.health import HealthService
from tensorgate.server.grpc.inference import InferenceService
from tensorgate.server.grpc.reflection import (
    DESCRIPTORS,
    Descriptors,
    Reflection,
    ReflectionV1,
    ReflectionV1Alpha,
)
from tensorgate.server.grpc.tfserving import PredictionService
from tensorgate.server.http.grpc_call import GrpcServices
from tensorgate.server.log_settings import LogControl
from tensorgate.server.repository import Repository
from tensorgate.server.restricted import Restrictions
from tensorgate.server.shared_memory import SharedMemory
from tensorgate.server.tracing.tracer import Tracer


def services(
    engine: EngineClient,
    repository: Repository,
    grps_default_model: str | None,
    max_message_bytes: int,
    shared_memory: SharedMemory,
    logs: LogControl,
    tracer: Tracer,
    restrictions: Restrictions | None = None,
    forward: re.Pattern | None = None,
) -> GrpcServices:
    """The services served on --grpc-port and, over HTTP/2, on --http-port."""
    health = HealthService(repository)
    reflection = Reflection(Descriptors(DESCRIPTORS.read_bytes()))
    served = GrpcServices(
        [
            InferenceService(engine, repository, shared_memory, logs, tracer, forward),
            GrpsService(engine, repository, grps_default_model),
            PredictionService(engine, repository),
            health,
            ReflectionV1(reflection),
            ReflectionV1Alpha(reflection),
        ],
        max_message_bytes,
        restrictions,
    )
    health.services = set(served.names)
    reflection.services = served.names
    return served
