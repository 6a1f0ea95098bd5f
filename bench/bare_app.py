"""The transport ceilings: a server doing no work, answering every request with the same bytes.

Every request gets the same ~250-byte JSON body (the size of the `simple` infer response) after its own
body has been read in full, as a real app must. Whatever our server reaches below these is our own cost.

    python -m bench.bare_app --server uvicorn|tensorgate|hypercorn [--host 127.0.0.1] [--port 0]

- uvicorn: uvicorn with its httptools protocol and uvloop, a plain ASGI app (the fastest mainstream
  Python HTTP/1.1 server doing nothing; needs the `bench` extra). HTTP/1.1 only.
- tensorgate: our own transport (server/http/) with a one-route router (our floor); HTTP/1.1 and h2c.
- hypercorn: hypercorn with our settings (server/http/asgi.py), the reference transport; both.

Logs `HTTP listening on HOST:PORT` to stderr once bound, like `tensorgate serve`; SIGTERM stops it.
"""

import argparse
import asyncio
import signal
import sys
from typing import Any

import orjson

from tensorgate.server.http.listener import HttpSettings, Listener, address_of, bind, raise_fd_limit
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

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
SERVERS = ("uvicorn", "tensorgate", "hypercorn")


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
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


def fixed_router() -> Router:
    async def answer(request: HttpRequest) -> HttpResponse:
        return body_response(BODY)

    router = Router(fallback_errors=lambda error: body_response(b"{}", status=404))
    for method in ("GET", "POST"):
        router.add(method, "/{*path}", answer, router.fallback_errors)
    return router


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def serve(server: str, sockets: list, log_level: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if server == "tensorgate":
        listener = Listener(fixed_router(), HttpSettings(), sockets)
        await listener.start()
        await stop.wait()
        await listener.shutdown()
    elif server == "hypercorn":
        from tensorgate.server.http.asgi import serve_hypercorn

        await serve_hypercorn(asgi_app, sockets, stop.wait, graceful_timeout=5)  # type: ignore[arg-type]
    else:
        import uvicorn

        config = uvicorn.Config(
            asgi_app, http="httptools", loop="none", lifespan="off", access_log=False, log_level=log_level
        )
        runner = uvicorn.Server(config)
        runner.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        task = asyncio.create_task(runner.serve(sockets=sockets))
        await stop.wait()
        runner.should_exit = True
        await task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_app", description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=SERVERS, default="tensorgate")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    raise_fd_limit()
    sockets = bind(args.host, args.port)
    print(f"HTTP listening on {address_of(sockets[0])}", file=sys.stderr, flush=True)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(args.server, sockets, args.log_level))


if __name__ == "__main__":
    main()
