"""gRPC `grps.protos.v1.GrpsService` (NetEase-Media/grps), served with the other gRPC services.

As grps does, every RPC completes with gRPC status OK and reports success or failure in the message's
`status` {code (an HTTP status code), msg, status: SUCCESS | FAILURE}. PredictStreaming sends one
message per yield of the model's execute_stream; a failure ends the stream with a FAILURE message.
"""

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from grpclib.const import Handler

import tensorgate.proto.grps.protos.v1 as pb
from tensorgate.codec import grps as wire
from tensorgate.codec import grps_answers as answers
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.grps import GrpsInference, GrpsStatus

log = logging.getLogger("tensorgate.grps")


def _failure(error: Exception, rpc_name: str) -> pb.GrpsMessage:
    """The FAILURE message answering an error: an InferError's own, anything unexpected INTERNAL, logged
    (call it from an except clause)."""
    if isinstance(error, InferError):
        return answers.error_message(error)
    log.exception("unexpected error serving grps %s", rpc_name)
    return answers.error_message(InferError(ErrorKind.INTERNAL, f"internal error serving {rpc_name}"))


PREDICTS = frozenset(("/grps.protos.v1.GrpsService/Predict", "/grps.protos.v1.GrpsService/PredictStreaming"))


class GrpsPredictService(pb.GrpsServiceBase):
    """Predict and PredictStreaming: the front end's, through the engine client."""

    def __init__(self, grps: GrpsInference) -> None:
        self.grps = grps

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        return {path: handler for path, handler in mapping.items() if path in PREDICTS}

    async def predict(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        try:
            answer = await self.grps.predict(wire.payload_from_message(message))
            return answers.answer_message(answer)
        except Exception as e:
            return _failure(e, "Predict")

    async def predict_streaming(self, message: pb.GrpsMessage) -> AsyncIterator[pb.GrpsMessage]:
        try:
            stream = await self.grps.predict_stream(wire.payload_from_message(message))
            async with aclosing(stream):  # a client that goes away cancels us: the model's stream closes
                async for answer in stream:
                    yield answers.answer_message(answer)
        except Exception as e:
            yield _failure(e, "PredictStreaming")


class GrpsService(pb.GrpsServiceBase):
    """The other methods, over the repository."""

    def __init__(self, grps: GrpsStatus) -> None:
        self.grps = grps

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        return {path: handler for path, handler in mapping.items() if path not in PREDICTS}

    async def online(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        self.grps.set_online(True)
        return answers.status_message(answers.OK, "OK")

    async def offline(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        self.grps.set_online(False)
        return answers.status_message(answers.OK, "OK")

    async def check_liveness(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        return answers.status_message(answers.OK, "OK")

    async def check_readiness(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        return answers.status_message(*self.grps.readiness())

    async def server_metadata(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        return answers.status_message(answers.OK, "OK", str_data=self.grps.server_metadata())

    async def model_metadata(self, message: pb.GrpsMessage) -> pb.GrpsMessage:
        try:
            return answers.status_message(
                answers.OK, "OK", str_data=self.grps.model_metadata(message.str_data or "")
            )
        except Exception as e:
            return _failure(e, "ModelMetadata")
