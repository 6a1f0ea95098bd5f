"""gRPC services (handlers, not transport: server/http/grpc_call.py serves them on our HTTP/2 layer).

`front_end_services()` lists the servicers of a front end (inference: what a front-end worker answers by
itself), `services()` every servicer the server offers; each protocol module adds its own here.
"""

import re
from typing import Any

from tensorgate.server.engine_client import EngineClient
from tensorgate.server.grpc.grps import GrpsPredictService, GrpsService
from tensorgate.server.grpc.health import HealthService
from tensorgate.server.grpc.inference import InferenceFrontEnd, InferenceService
from tensorgate.server.grpc.reflection import (
    DESCRIPTORS,
    Descriptors,
    Reflection,
    ReflectionV1,
    ReflectionV1Alpha,
)
from tensorgate.server.grpc.tfserving import PredictFrontEnd, PredictionService
from tensorgate.server.grps import GrpsInference, GrpsStatus
from tensorgate.server.http.grpc_call import GrpcServices
from tensorgate.server.log_settings import LogControl
from tensorgate.server.repository import Repository
from tensorgate.server.restricted import Restrictions
from tensorgate.server.shared_memory import SharedMemory
from tensorgate.server.tfserving import TFServing
from tensorgate.server.tracing.frontend import Sampler
from tensorgate.server.tracing.tracer import Tracer


def front_end_services(
    engine: EngineClient,
    tracer: Sampler,
    grps: GrpsInference,
    tf: TFServing,
    forward: re.Pattern | None = None,
) -> list[Any]:
    """The methods a front end answers by itself: inference, through `engine` (server/assembly.py); grps
    and TF Serving's are shared with their REST endpoints."""
    return [InferenceFrontEnd(engine, tracer, forward), GrpsPredictService(grps), PredictFrontEnd(tf)]


def services(
    front_end: list[Any],
    engine: EngineClient,
    repository: Repository,
    grps_default_model: str | None,
    max_message_bytes: int,
    shared_memory: SharedMemory,
    logs: LogControl,
    tracer: Tracer,
    restrictions: Restrictions | None = None,
) -> GrpcServices:
    """The services served on --grpc-port and, over HTTP/2, on --http-port: the front end's and the rest."""
    health = HealthService(repository)
    reflection = Reflection(Descriptors(DESCRIPTORS.read_bytes()))
    served = GrpcServices(
        [
            *front_end,
            InferenceService(repository, shared_memory, logs, tracer),
            GrpsService(GrpsStatus(repository, grps_default_model)),
            PredictionService(TFServing(engine), repository),
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
