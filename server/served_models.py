"""The models a server has in service, kept by key (namespace, name): what a request naming a model reaches,
what a model of one repository reaches with --model-namespacing (ScopedHost), server readiness, and the
watchers told of each change. Per request: `models`, `model` and `resolve`. server/repository.py (a
ServedModels) loads, reloads and unloads them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tensorgate.server.model import ModelVersion
from tensorgate.server.repository_files import Key
from tensorgate.server.repository_model import Ambiguous, Model, find_model


class ServedModels:
    """The models in service. They are kept by key, (namespace, name): the namespace is the repository's
    location with --model-namespacing, else "" for all, and a name in two repositories is then in none
    (Triton's "not unique across all model repositories"). `models` holds what a request naming a name
    reaches: the model of that name, or (two of that name, with namespacing) an Ambiguous one."""

    def __init__(self, strict_readiness: bool = True) -> None:
        self.strict_readiness = strict_readiness
        self.namespaced: dict[Key, Model] = {}  # every model, by key
        self.models: dict[str, Model] = {}  # what a request naming each name reaches (see _set)
        self._online = True
        self.online_watchers: list[Callable[[bool], None]] = []  # told of each change (the transport's)
        self.generation = 0  # counts the changes of what is loaded
        self.change_watchers: list[Callable[[], None]] = []  # told after each (the engine's workers)
        # what else counts statistics of these models (the workers that run some themselves), asked first
        self.stats_sources: list[Callable[[], Awaitable[None]]] = []

    @property
    def online(self) -> bool:
        """grps Offline clears it: every protocol's readiness probe then says not ready (so load balancers
        drain the server) while requests are still served; Online sets it again."""
        return self._online

    @online.setter
    def online(self, online: bool) -> None:
        self._online = online
        for watcher in self.online_watchers:
            watcher(online)

    def model(self, name: str) -> Model:
        return find_model(self.models, name)

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        return self.model(name).resolve(version)

    async def gather_stats(self) -> None:
        """Before statistics are read: the counts kept elsewhere are added to the versions' own."""
        for source in self.stats_sources:
            await source()

    @property
    def ready(self) -> bool:
        """Strict (Triton's default): every model loaded and not unloaded has all its versions ready."""
        if not self.online:
            return False
        if not self.strict_readiness:
            return True
        return all(m.fully_ready for m in self.namespaced.values() if not m.unloaded)

    def _serving(self, key: Key) -> bool:
        model = self.namespaced.get(key)
        return model is not None and model.ready

    def _set(self, key: Key, model: Model | None) -> None:
        """Puts `model` in service under `key` (None: takes it out), and republishes `models`."""
        if model is None:
            self.namespaced.pop(key, None)
        else:
            self.namespaced[key] = model
        by_name: dict[str, list[Model]] = {}
        for (_, name), each in self.namespaced.items():
            by_name.setdefault(name, []).append(each)
        self.models = {
            name: found[0] if len(found) == 1 else Ambiguous.of(name, len(found))
            for name, found in by_name.items()
        }

    def _changed(self) -> None:
        self.generation += 1
        for watcher in self.change_watchers:
            watcher()


class ScopedHost:
    """With --model-namespacing, the Host of the models of one repository: the models their ensemble steps
    (and BLS calls) name are those of their own repository first, else the one model of that name, as
    Triton resolves them. Everything else is the repository's."""

    def __init__(self, repository: ServedModels, namespace: str) -> None:
        self.repository = repository
        self.namespace = namespace

    def __getattr__(self, name: str) -> Any:
        return getattr(self.repository, name)

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        own = self.repository.namespaced.get((self.namespace, name))
        return (own or self.repository.model(name)).resolve(version)
