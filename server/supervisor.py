"""The engine's worker processes (`--workers N`): each started with its link and arenas, watched, replaced
when it dies, and stopped at shutdown. What a worker asks over its link is not this module's business: the
engine attaches each new worker's link and serves it (`Links`: server/engine.py, server/worker_link.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from typing import Protocol

from tensorgate.server.arena import Arena
from tensorgate.server.http.listener import rebind

log = logging.getLogger("tensorgate.engine")

RESTART_DELAY = 0.5  # seconds before a worker that died is replaced (a crash loop stays slow)


class Links(Protocol):
    """What serves the workers' links (server/engine.py Engine)."""

    async def attach(self, index: int, sock: socket.socket, mine: Arena, yours: Arena) -> object:
        """Serves the link of worker `index`, just started, on `sock`, with the engine's arena (`mine`)
        and the worker's; returns it, for `detach` once the worker is gone."""
        ...

    def detach(self, link: object) -> None:
        """The worker is gone: its link is closed, its calls end."""
        ...


class Supervisor:
    def __init__(self, args: argparse.Namespace, links: Links) -> None:
        self.args = args
        self.links = links
        self.stopping = False
        self.stop = asyncio.Event()  # set at shutdown: the workers are told to drain

    def shut_down(self) -> None:
        """Every worker drains as the engine does, each within the graceful timeout."""
        self.stopping = True
        self.stop.set()

    async def keep(self, index: int, ours: dict[str, list[socket.socket]]) -> None:
        """Runs worker `index` until shutdown, replacing it whenever it dies. It listens on sockets of its
        own on the same ports (SO_REUSEPORT: the kernel spreads the connections over the processes; one
        socket accepted by all would let the first to wake take them all). The engine keeps them while
        the worker runs: connections the kernel gave a worker that died wait for the next one."""
        sockets = {name: rebind(listening) for name, listening in ours.items()}
        listening = ";".join(
            f"{name}=" + ",".join(str(s.fileno()) for s in ss) for name, ss in sockets.items()
        )
        fds = [s.fileno() for ss in sockets.values() for s in ss]
        while not self.stopping:
            ours, theirs = socket.socketpair()
            # the tensors each side sends the other (server/arena.py): fresh with each worker
            worker_arena = Arena(self.args.worker_arena_bytes)
            engine_arena = Arena(self.args.worker_arena_bytes)
            spec = f"{theirs.fileno()},{worker_arena.fd},{engine_arena.fd};{listening}"
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tensorgate.server",
                *self.args.argv,
                "--worker-of",
                spec,
                pass_fds=[theirs.fileno(), worker_arena.fd, engine_arena.fd, *fds],
            )
            theirs.close()
            link = await self.links.attach(index, ours, engine_arena, worker_arena)
            stopper = asyncio.get_running_loop().create_task(self._stop(process, sockets))
            code = await process.wait()
            stopper.cancel()
            self.links.detach(link)
            if self.stopping:
                if code:
                    log.warning("worker %d exited with %d at shutdown", index, code)
                return
            log.error("worker %d (pid %d) exited with %d: starting another", index, process.pid, code)
            await asyncio.sleep(RESTART_DELAY)

    async def _stop(
        self, process: asyncio.subprocess.Process, sockets: dict[str, list[socket.socket]]
    ) -> None:
        """At shutdown: SIGTERM (the worker stops listening and drains its connections), SIGKILL past the
        graceful timeout. The engine's copies of its sockets close at once: new connections are refused."""
        await self.stop.wait()
        process.send_signal(signal.SIGTERM)
        for listening in sockets.values():
            for sock in listening:
                sock.close()
        try:
            await asyncio.wait_for(process.wait(), self.args.graceful_timeout + 5)
        except TimeoutError:
            log.warning("worker pid %d did not stop in time: killed", process.pid)
            process.kill()
