"""The transport ceiling: hypercorn, with our server's settings, serving an app that does no work.

Every request gets the same ~250-byte JSON body (the size of the `simple` infer response) after its own
body has been read in full, as a real app must. Whatever our server reaches below this is our own cost.

    python -m bench.bare_app [--host 127.0.0.1] [--port 0]

logs `HTTP listening on HOST:PORT` to stderr once bound, like `python -m server serve`; SIGTERM stops it.
"""

import argparse
import asyncio
import socket
import sys
from typing import Any

import orjson
from hypercorn.asyncio import serve

from server.http.asgi import hypercorn_config

BODY = orjson.dumps(
    {
        "model_name": "simple",
        "model_version": "1",
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(1, 17))},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(-1, 15))},
        ],
    }
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)  # connections queue from now on, before hypercorn's accept loop starts
    return sock


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_app", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    sock = listening_socket(args.host, args.port)
    port = sock.getsockname()[1]
    config = hypercorn_config(log_level=args.log_level)
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn adopts the bound socket, so port 0 works
    print(f"HTTP listening on {args.host}:{port}", file=sys.stderr, flush=True)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(app, config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
