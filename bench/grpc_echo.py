"""The gRPC ceiling: a bare grpclib server that answers ModelInfer / ModelStreamInfer without doing any work.

It serves the same two methods our server does, on uvloop as our server runs, and answers every request
with fixed bytes: the ModelInferResponse our server gives for the bench's `simple` request (same size,
built once with the generated messages), wrapped in a ModelStreamInferResponse for the stream. Requests
are received whole but not parsed. Whatever our server reaches below this is our own cost.

    python -m bench.grpc_echo [--host 127.0.0.1] [--port 0]

logs `gRPC listening on HOST:PORT` to stderr once bound; SIGTERM stops it.
"""

import argparse
import asyncio
import signal
import sys

from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

import tensorgate.proto.inference as pb
from bench.bare_app import new_event_loop
from bench.grpc_load import INFER_PATH, INPUT0, INPUT1, STREAM_PATH, Raw


def fixed_response() -> bytes:
    outputs = [
        pb.ModelInferResponseInferOutputTensor(name, "INT32", [1, 16]) for name in ("OUTPUT0", "OUTPUT1")
    ]
    message = pb.ModelInferResponse(
        model_name="simple",
        model_version="1",
        outputs=outputs,
        raw_output_contents=[(INPUT0 + INPUT1).tobytes(), (INPUT0 - INPUT1).tobytes()],
    )
    return bytes(message)


class EchoService:
    def __init__(self) -> None:
        self.reply = Raw(fixed_response())
        self.stream_reply = Raw(
            bytes(pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse.parse(self.reply.data)))
        )

    async def infer(self, stream: Stream) -> None:
        await stream.recv_message()
        await stream.send_message(self.reply)

    async def stream_infer(self, stream: Stream) -> None:
        async for _ in stream:
            await stream.send_message(self.stream_reply)

    def __mapping__(self) -> dict[str, Handler]:
        return {
            INFER_PATH: Handler(self.infer, Cardinality.UNARY_UNARY, Raw, Raw),
            STREAM_PATH: Handler(self.stream_infer, Cardinality.STREAM_STREAM, Raw, Raw),
        }


async def serve(host: str, port: int) -> None:
    server = Server([EchoService()])
    await server.start(host, port, reuse_address=True)
    for sock in server._server.sockets:  # grpclib keeps its asyncio server there
        bound_host, bound_port = sock.getsockname()[:2]
        print(f"gRPC listening on {bound_host}:{bound_port}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_echo", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
