"""A front-end worker's models (`--workers`, server/frontend.py): the engine's model table as the worker last
heard it (`EngineTable`: what its inference requests resolve), and the versions it runs itself
(`LocalModels`, with --worker-models inline), kept in step with that table, their statistics sent to the
engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from tensorgate.codec import messages as msg
from tensorgate.server.link import Link
from tensorgate.server.model import ModelState, ModelVersion
from tensorgate.server.repository_model import Ambiguous, Model, find_model

log = logging.getLogger("tensorgate.worker")


class EngineTable:
    """The engine's model table as this worker last heard it: what its inference routes resolve (its
    front end's ModelTable, server/engine_client.py)."""

    def __init__(self, local: LocalModels) -> None:
        self.local = local  # this worker's own instances, kept in step with the table
        self.models: dict[str, Model] = {}

    def model(self, name: str) -> Model:
        return find_model(self.models, name)

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        return self.model(name).resolve(version)

    def apply(self, table: list) -> None:
        models = {}
        local = self.local
        for name, directory, config, reason, loading, versions, newest_first, ambiguous in table:
            if ambiguous:
                models[name] = Ambiguous(name, reason)
                continue
            model = Model(name, Path(directory), config)
            model.reason, model.loading = reason, loading
            model.versions = {}
            for entry in versions:
                version = model.versions[entry[0]] = engine_version(Path(directory), entry)
                local.instance(version, entry[6])
            model.newest_first = [model.versions[n] for n in newest_first]
            models[name] = model
        local.keep_only()
        self.models = models


def engine_version(directory: Path, entry: list) -> ModelVersion:
    """A version of the engine's, as its table entry tells it: its config (the codecs read it), its state
    and how it answers; no backend (it runs in the engine)."""
    number, state, reason, config, streams, stream_only, _ = entry
    version = ModelVersion(directory, config, number)
    version.state, version.reason = ModelState(state), reason
    version.streams, version.stream_only = streams, stream_only
    return version


class LocalModels:
    """The model versions this worker runs itself (--worker-models inline: those the engine's table marks
    with their load's serial), loaded from the same files as the engine's: each load of the engine's once,
    unloaded when its table no longer has it. What they count goes to the engine (STATS) each second, when
    the engine asks (before it answers statistics or metrics), and before one is unloaded."""

    def __init__(self, link: Link, gone: asyncio.Event) -> None:
        self.link = link  # to the engine: the counts go there
        self.gone = gone  # set once the link is lost: the ticks stop
        self.loop = asyncio.get_running_loop()
        self.versions: dict[tuple[str, int], ModelVersion] = {}
        self.instances: dict[ModelVersion, ModelVersion] = {}  # the engine's version -> this worker's
        self.kept: dict[ModelVersion, ModelVersion] = {}  # `instances` of the table being applied
        self.failed: set[int] = set()  # serials that did not load here: not tried again

    def instance(self, engine_version: ModelVersion, serial: int) -> None:
        """This worker's instance of a version of the engine's table (`serial`: the engine's load of it,
        0 where only the engine runs it), loaded now if it is new. One that does not load here is left
        to the engine, as without the flag."""
        if not serial or serial in self.failed:
            return
        name, number = engine_version.name, engine_version.version
        version = self.versions.get((name, number))
        if version is None or version.serial != serial:
            version = ModelVersion(engine_version.version_dir.parent, engine_version.config, number)
            version.serial = serial
            version.load()
            if not version.inline:
                why = version.reason or "it does not run inline here"
                where = "worker %d: '%s' version %d runs in the engine: %s"
                log.warning(where, os.getpid(), name, number, why)
                self.failed.add(serial)
                self._unload(version)
                return
            log.info("worker %d runs '%s' version %d itself", os.getpid(), name, number)
        self.kept[engine_version] = version

    def keep_only(self) -> None:
        """The table is applied: the versions it no longer names (or names in a new load) are unloaded,
        their last counts sent first."""
        kept = {(v.name, v.version): v for v in self.kept.values()}
        gone = [v for key, v in self.versions.items() if kept.get(key) is not v]
        if gone:
            self.send(0, gone)
        for version in gone:
            self._unload(version)
        self.versions, self.instances, self.kept = kept, self.kept, {}

    def _unload(self, version: ModelVersion) -> None:
        self.loop.create_task(version.unload())

    def send(self, asked: int = 0, versions: list[ModelVersion] | None = None) -> None:
        """What the versions counted since they last sent (asked: the engine's number for it, which is
        answered even with nothing to say)."""
        counts = []
        for version in self.versions.values() if versions is None else versions:
            taken = version.stats.take(version.name, version.version)
            if taken is not None:
                counts.append(taken)
        if (counts or asked) and self.link.transport is not None:
            self.link.send(msg.Stats(asked, counts))

    def tick(self) -> None:
        """Each second, while the link lasts."""
        if self.versions:
            self.send()
        if not self.gone.is_set():
            self.loop.call_later(1.0, self.tick)

    async def close(self) -> None:
        """At shutdown: the last counts go to the engine, and every model's finalize runs."""
        self.send()
        versions, self.versions, self.instances = list(self.versions.values()), {}, {}
        for version in versions:
            await version.unload()
