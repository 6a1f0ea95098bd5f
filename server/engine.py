"""The engine: the one process of `tensorgate serve`, holding the model repository, the models, their dynamic
batchers and statistics, client shared-memory regions and the monitor, and serving every port. With
`--workers N` it is the first of N front ends: it starts N - 1 worker processes (server/frontend.py) that
accept connections on the same ports beside it, each on its own core, and send it their inference.

The engine binds every port and hands the listening sockets to its workers, which accept on them. Its
supervisor (server/supervisor.py) starts each worker with a Unix socket of its own (server/link.py) and two
arenas of shared memory, the worker's and its own, for the large tensors each sends the other
(server/arena.py), and replaces a worker that dies; the engine attaches each worker's link (`attach`) and
serves what comes over it with server/worker_link.py. It tells every worker its model table at start and
after every change; a repository call answers only once every worker has the change.

A worker that dies is replaced (its requests in flight fail with their connections; the others go on).
Each worker dies with the engine (PR_SET_PDEATHSIG): a dead engine takes the whole server down, so the
orchestrator sees it and restarts it. SIGTERM drains the workers first, then unloads the models.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import socket

import msgspec

from tensorgate.batcher.rate_limiter import RateLimiter
from tensorgate.codec import messages as msg
from tensorgate.server import assembly, metrics_settings
from tensorgate.server.arena import Arena
from tensorgate.server.http.listener import Offline, raise_fd_limit
from tensorgate.server.log_settings import LogControl, LogSettings
from tensorgate.server.model import ModelVersion
from tensorgate.server.monitor import Monitor
from tensorgate.server.repository import Repository
from tensorgate.server.repository_model import Ambiguous
from tensorgate.server.response_cache import ResponseCache
from tensorgate.server.shared_memory import SharedMemory
from tensorgate.server.supervisor import Supervisor
from tensorgate.server.tracing.tracer import Tracer
from tensorgate.server.worker_link import WorkerLink

_FROM_WORKER = msgspec.msgpack.Decoder(msg.TO_ENGINE)
log = logging.getLogger("tensorgate.engine")

SYNC_TIMEOUT = 10.0  # seconds a repository change waits for every worker to have it
STATS_TIMEOUT = 1.0  # seconds the statistics wait for the workers' own counts (--worker-models inline)


def model_table(repository: Repository, inline: bool = False) -> list:
    """What a worker needs of each model to resolve requests (worker_models.EngineTable.apply). With
    `inline` (--worker-models inline), each version a worker may run itself carries its load's serial (a
    reload's is new), the others 0."""
    return [
        [
            name,
            str(model.directory),
            model.config,
            model.reason,
            model.loading,
            [
                [n, v.state.value, v.reason, v.config, v.streams, v.stream_only, _serial(v, inline)]
                for n, v in model.versions.items()
            ],
            [v.version for v in model.newest_first],
            isinstance(model, Ambiguous),  # (--model-namespacing) a name two repositories serve
        ]
        for name, model in repository.models.items()
    ]


def _serial(version: ModelVersion, inline: bool) -> int:
    return version.serial if inline and version.inline else 0


class Engine:
    def __init__(self, args: argparse.Namespace, logs: LogControl, tracer: Tracer) -> None:
        self.args = args
        self.logs = logs
        self.tracer = tracer
        cache = ResponseCache(args.cache_size) if args.cache_size else None
        self.repository = Repository(
            args.model_repository,
            args.model_control_mode,
            args.strict_readiness,
            response_cache=cache,
            python_execution_mode=args.python_execution_mode,
            config_name=args.model_config_name,
            load_threads=args.model_load_thread_count,
            auto_complete=not (args.disable_auto_complete_config or args.strict_model_config),
            namespacing=args.model_namespacing,
            exit_on_error=args.exit_on_error,
            rate_limiter=(
                RateLimiter(args.rate_limit_resource) if args.rate_limit == "execution_count" else None
            ),
        )
        self.shared_memory = SharedMemory(args.allow_client_shm)
        self.monitor = Monitor(self.repository, args.monitor_log, self.repository.app_monitor)
        self.links: set[WorkerLink] = set()
        self.supervisor = Supervisor(args, self)
        self.sequence = 0  # of the model tables sent
        self.synced = 0  # the repository generation every worker has
        self.stats_asked = 0  # of the workers' statistics asked for (gather_stats)
        self.parts: assembly.Parts | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        repository = self.repository
        await repository.start(self.args.load_model)
        assembly.settle_memory()
        try:
            metrics_settings.configure(self.args)  # the metrics port's settings (server/metrics.py)
            self.parts = assembly.build(
                self.args, repository, self.shared_memory, self.monitor, self.logs, self.tracer
            )
        except ValueError as e:
            log.error("%s", e)
            await repository.unload_all()
            raise SystemExit(2) from None
        raise_fd_limit()
        try:
            sockets = assembly.bind_ports(self.args)
        except assembly.BindError as e:
            log.error("%s", e)
            await repository.unload_all()
            raise SystemExit(1) from None
        self.monitor.start()
        if self.args.worker_models == "inline" and self.args.workers > 1:
            repository.stats_sources.append(self.gather_stats)
        repository.change_watchers.append(lambda: loop.create_task(self.sync()))
        offline = Offline()  # every port's connections leave at their next idle moment while offline
        repository.online_watchers.append(lambda online: offline.set(not online))
        repository.online_watchers.append(self._online)
        self.logs.watchers.append(self._logs)
        self.tracer.watchers.append(self._tracing)
        poller = None
        if self.args.model_control_mode == "poll":
            poller = loop.create_task(repository.poll_forever(self.args.repository_poll_secs, stop))

        async def shutdown_trigger() -> None:
            await stop.wait()
            if poller is not None:
                await poller  # returns once a poll under way is done
            self.parts.grpc_services.begin_shutdown()  # open streams end; every port then drains

        # This process serves the ports too (front end 0) unless --engine-front-end false; each worker is
        # one more front end.
        self.serving = [loop.create_future() for _ in range(self.args.workers)]
        workers = [loop.create_task(self.supervisor.keep(i, sockets)) for i in range(1, self.args.workers)]
        up = loop.create_task(self._log_when_serving(sockets))
        if self.args.engine_front_end:
            served = loop.create_task(
                assembly.serve_ports(
                    self.args,
                    self.parts,
                    sockets,
                    shutdown_trigger,
                    offline,
                    lambda: self.serving[0].set_result(None),
                )
            )
        else:
            self.serving[0].set_result(None)
            served = loop.create_task(shutdown_trigger())
        await stop.wait()
        up.cancel()
        self.supervisor.shut_down()  # the workers drain as this process does
        await served
        await asyncio.gather(*workers)
        self.monitor.stop()
        await repository.unload_all()
        self.tracer.close()  # traces not yet written go to their files
        log.info("shut down")

    # ---- workers (started, watched and replaced by server/supervisor.py)

    async def attach(self, index: int, sock: socket.socket, mine: Arena, yours: Arena) -> WorkerLink:
        link = WorkerLink(self, index, mine, yours, self.args.worker_max_calls)
        await asyncio.get_running_loop().create_unix_connection(lambda: link.link, sock=sock)
        self.links.add(link)
        link.link.send(msg.Event("tracing", self.tracer.on))  # known before it serves (the table's ack)
        link.send_table(self.table(), self.sequence)
        return link

    def detach(self, link: object) -> None:
        assert isinstance(link, WorkerLink)  # attach made it
        self.links.discard(link)
        link.close()

    async def _log_when_serving(self, sockets: dict[str, list[socket.socket]]) -> None:
        await asyncio.gather(*self.serving)
        assembly.log_ports(sockets)  # every worker accepts: the server is up

    async def sync(self) -> None:
        """Sends every worker the model table, and waits until each has it."""
        self.sequence += 1
        generation = self.repository.generation
        table = self.table()
        acks = [link.send_table(table, self.sequence) for link in list(self.links)]
        if acks:
            done, late = await asyncio.wait(acks, timeout=SYNC_TIMEOUT)
            if late:
                log.warning("%d workers did not confirm the new model table", len(late))
        self.synced = max(self.synced, generation)

    def table(self) -> list:
        return model_table(self.repository, self.args.worker_models == "inline")

    async def gather_stats(self) -> None:
        """Every worker's statistics of the models it runs itself, added to the engine's: asked for, and
        waited for up to STATS_TIMEOUT (a worker that does not answer sends them within a second anyway)."""
        self.stats_asked += 1
        asked = [link.ask_stats(self.stats_asked) for link in list(self.links)]
        if asked:
            await asyncio.wait(asked, timeout=STATS_TIMEOUT)

    async def synced_answer(self) -> None:
        """Before a forwarded call answers: every worker has the model table as it is now, so what the
        client asks next, of any worker, sees what this answer saw (a model loading, loaded, gone)."""
        if self.synced != self.repository.generation:
            await self.sync()

    def _online(self, online: bool) -> None:
        for link in self.links:
            link.link.send(msg.Event("online", online))

    def _tracing(self, on: bool) -> None:
        """Tracing turned on or off: the workers time their requests' front end while it is on."""
        for link in self.links:
            link.link.send(msg.Event("tracing", on))

    def _logs(self, settings: LogSettings) -> None:
        """The log settings a client changed: every worker's log follows."""
        changes = {k: v for k, v in dataclasses.asdict(settings).items() if k != "log_file"}
        for link in self.links:
            link.link.send(msg.Event("logs", changes))
