"""The model repository: a directory of `<model>/config.pbtxt|config.json` and `<model>/<version>/` folders.

Loading happens off the event loop; a model whose config or code fails is kept UNAVAILABLE with its
reason while the others serve. Models are loaded, reloaded and unloaded at run time as Triton's model
control modes say: `none` loads everything at start, `explicit` obeys the repository API, `poll` follows
the directory. A reload swaps in the new version set once it is ready, then retires the old one after
its requests in flight are answered.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.server.app_monitor import app_monitor
from tensorgate.server.backends import backend_from_files, complete_config
from tensorgate.server.model import UNLOADED, ModelVersion
from tensorgate.server.model_config import ConfigError, check_complete, load_model_config
from tensorgate.server.repository_files import (
    Signature,
    check_model_name,
    composing_all,
    composing_models,
    parse_config,
    parsed_steps,
    select_versions,
    tree_signature,
    write_override,
)

if TYPE_CHECKING:
    from tensorgate.server.app_monitor import AppMonitor
    from tensorgate.server.backends.base import Host
    from tensorgate.server.response_cache import ResponseCache

log = logging.getLogger("tensorgate.repository")
T = TypeVar("T")

CONTROL_MODES = ("none", "explicit", "poll")
UNKNOWN = "Request for unknown model: "  # how Triton's texts for a model it cannot serve begin


class Model:
    """A model name with the versions its version_policy selects, loaded from one directory."""

    def __init__(
        self,
        name: str,
        directory: Path,
        config: dict | None = None,
        owned_dir: Path | None = None,
        config_name: str = "",
        auto_complete: bool = True,
    ) -> None:
        self.name = name
        self.config_name = config_name  # --model-config-name
        self.auto_complete = auto_complete  # off: --disable-auto-complete-config
        self.directory = directory
        self.config: dict | None = config  # given: a config override; else read from the directory
        self.owned_dir = owned_dir  # a file override's folder, removed when the model is retired
        self.versions: dict[int, ModelVersion] = {}
        self.newest_first: list[ModelVersion] = []  # a request without a version takes the first ready
        self.reason = ""  # why the model, or some of its versions, failed to load
        self.loading = False
        self.unloaded = False  # unloaded through the API: it no longer counts for server readiness
        self.signature: Signature | None = None  # the directory as it was when loading started

    @property
    def ready(self) -> bool:
        return any(v.ready for v in self.versions.values())

    @property
    def fully_ready(self) -> bool:
        """Every version its policy selects is ready (what strict server readiness asks of a model)."""
        return bool(self.versions) and all(v.ready for v in self.versions.values())

    def load(self, host: Host | None = None, cache: ResponseCache | None = None) -> None:
        """Blocking: reads the config (unless given) and loads every selected version for `host` (what
        its backends may use of the server: server/backends/base.py), with the server's response
        `cache` for versions whose config enables it."""
        self.loading = True
        try:
            self.signature = tree_signature(self.directory)
            if self.config is None:
                self.config = load_model_config(self.directory, self.config_name)
            numbers = select_versions(self.directory, self.config["version_policy"])
        except (ConfigError, OSError) as e:
            self.reason = f"failed to load '{self.name}': {e}"
            self.loading = False
            return
        if not numbers:
            self.reason = f"failed to load '{self.name}': no version folder matches its version_policy"
            self.loading = False
            return
        try:  # from the newest version's model, as Triton completes a config
            newest = self.directory / str(max(numbers))
            if self.auto_complete:
                config = complete_config(newest, backend_from_files(newest, self.config), host)
            elif not (self.config.get("backend") or self.config.get("platform")):
                raise ConfigError(
                    "must specify 'backend' or 'platform' (--disable-auto-complete-config: configs are "
                    "not completed)"
                )
            else:
                config = self.config
            self.config = check_complete(config)
        except Exception as e:  # a model's auto_complete_config may raise anything
            self.reason = f"failed to load '{self.name}': {type(e).__name__}: {e}"
            self.loading = False
            return
        self.versions = {n: ModelVersion(self.directory, self.config, n) for n in numbers}
        self.newest_first = [self.versions[n] for n in sorted(numbers, reverse=True)]
        for version in self.versions.values():
            version.load(host, cache)
        failed = [v.reason for v in self.versions.values() if not v.ready]
        self.reason = "; ".join(failed)
        self.loading = False

    async def retire(self) -> None:
        """Unloads every ready version (requests in flight are answered first) and the override folder."""
        await asyncio.gather(*(v.unload() for v in self.versions.values() if v.ready))
        if self.owned_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.owned_dir, True)

    def metadata(self, version: str = "") -> dict:
        """v2 model metadata: of `version`, else of the newest ready version, listing every ready one."""
        chosen = self.resolve(version)
        listed = [version] if version else [v.version_str for v in reversed(self.newest_first) if v.ready]
        return chosen.metadata(listed)

    def config_of(self, version: str = "") -> dict:
        """The model configuration: of `version`, else the model's."""
        if version:
            return self.resolve(version).config
        if self.config is None:
            raise InferError(ErrorKind.UNAVAILABLE, f"{UNKNOWN}'{self.name}' is not ready: {self.reason}")
        return self.config

    def is_ready(self, version: str = "") -> bool:
        """Whether `version` (else the model) is ready; a version that does not exist raises NOT_FOUND."""
        try:
            self.resolve(version)  # only a ready version is resolved
        except InferError as e:
            if e.kind is not ErrorKind.UNAVAILABLE:
                raise
            return False
        return True

    def resolve(self, version: str) -> ModelVersion:
        """The version a request names, or the highest ready one for ""."""
        if not version:
            for candidate in self.newest_first:
                if candidate.ready:
                    return candidate
            why = self.reason or ("loading" if self.loading else "no ready version")
            why = f"{UNKNOWN}'{self.name}' has no available versions: {why}"
            raise InferError(ErrorKind.UNAVAILABLE, why)
        try:
            found = self.versions[int(version)]
        except (ValueError, KeyError):
            missing = f"{UNKNOWN}'{self.name}' version {version} is not found"
            raise InferError(ErrorKind.NOT_FOUND, missing) from None
        if not found.ready:
            raise InferError(ErrorKind.UNAVAILABLE, found.not_ready())
        return found

    def index(self, ready_only: bool) -> list[dict]:
        """Triton's repository index entries: one per version, or one for the model when it has none."""
        if self.versions:
            return [
                {"name": self.name, "version": str(n), "state": v.state.value, "reason": v.reason}
                for n, v in sorted(self.versions.items())
                if v.ready or not ready_only
            ]
        if ready_only:
            return []
        state = "LOADING" if self.loading else "UNAVAILABLE"
        return [{"name": self.name, "version": "", "state": state, "reason": self.reason}]


def find_model(models: dict[str, Model], name: str) -> Model:
    try:
        return models[name]
    except KeyError:
        raise InferError(ErrorKind.NOT_FOUND, f"{UNKNOWN}'{name}' is not found") from None


class Repository:
    """The models of one server. It is also the `Host` (server/backends/base.py) it hands each backend
    it loads: `resolve` for the models a model calls (BLS, ensembles), the event loop they serve on, and
    the app_monitor models record their own metrics in."""

    def __init__(
        self,
        path: Path,
        control_mode: str = "none",
        strict_readiness: bool = True,
        app_monitor: AppMonitor = app_monitor,
        response_cache: ResponseCache | None = None,
        python_execution_mode: str = "auto",
        config_name: str = "",
        load_threads: int = 4,
        auto_complete: bool = True,
    ) -> None:
        if control_mode not in CONTROL_MODES:
            raise ValueError(f"unknown model control mode {control_mode!r}")
        self.app_monitor = app_monitor
        self.response_cache = response_cache  # --cache-config: shared by the models that enable it
        self.python_execution_mode = python_execution_mode  # --python-execution-mode
        self.config_name = config_name  # --model-config-name: configs/<name>.pbtxt where a model has one
        self.load_threads = load_threads  # --model-load-thread-count: models loading at once, at most
        self.auto_complete = auto_complete  # off: --disable-auto-complete-config (or --strict-model-config)
        self._load_slots: asyncio.Semaphore | None = None  # made on the server's loop
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, from start()
        self.path = path
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness
        self.models: dict[str, Model] = {}
        self._online = True
        self.online_watchers: list[Callable[[bool], None]] = []  # told of each change (the transport's)
        self.generation = 0  # counts the changes of what is loaded
        self.change_watchers: list[Callable[[], None]] = []  # told after each (the engine's workers)
        self._locks: dict[str, asyncio.Lock] = {}  # one per model name: its loads and unloads take turns
        self._failed: dict[str, Signature | None] = {}  # poll mode: a failed reload is not retried as is
        self._overrides: Path | None = None  # the server's folder for file overrides, made on first use
        self._lifecycle: set[asyncio.Task] = set()  # loads and unloads under way for API callers

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

    # ---------------------------------------------------------------------------------------- startup

    async def start(self, load_models: list[str] | tuple[str, ...] = ()) -> None:
        """Loads what the control mode loads at startup: everything, or (explicit) `load_models`."""
        self.loop = asyncio.get_running_loop()
        if self.control_mode != "explicit":
            if load_models:
                log.warning("--load-model is only used with --model-control-mode explicit; ignored")
            await self.load_all()
        elif "*" in load_models:
            await self.load_all()
        else:
            await self.load_all(list(dict.fromkeys(load_models)))

    async def load_all(self, names: list[str] | None = None) -> None:
        """Loads every model folder (or those named), each in a worker thread, concurrently."""
        on_disk = self._listed()
        for name in names or ():
            if name not in on_disk:
                log.error("failed to load '%s': no model folder '%s' in the model repository", name, name)
        wanted = on_disk if names is None else {n: on_disk[n] for n in names if n in on_disk}
        await self._load_in_order(wanted, on_disk)

    async def _load_in_order(self, wanted: dict[str, Path], on_disk: dict[str, Path]) -> None:
        """Loads `wanted` concurrently, ensembles after the models their steps call (which load with
        them when they are on disk and not loaded yet)."""
        steps = await asyncio.to_thread(composing_all, wanted, on_disk, self.config_name)
        for name in [n for calls in steps.values() for n in calls]:
            if name not in wanted and name in on_disk and not self._serving(name):
                wanted[name] = on_disk[name]
                steps.setdefault(name, [])
        remaining = dict(wanted)
        while remaining:
            ready = {n: d for n, d in remaining.items() if not any(c in remaining for c in steps.get(n, ()))}
            ready = ready or remaining  # a cycle: each load then fails naming what it lacks
            await asyncio.gather(*(self._load_locked(n, d) for n, d in ready.items()))
            remaining = {n: d for n, d in remaining.items() if n not in ready}

    def _serving(self, name: str) -> bool:
        model = self.models.get(name)
        return model is not None and model.ready

    async def unload_all(self) -> None:
        if self._lifecycle:
            await asyncio.gather(*self._lifecycle, return_exceptions=True)
        for model in list(self.models.values()):
            await model.retire()
        if self._overrides is not None:
            await asyncio.to_thread(shutil.rmtree, self._overrides, True)

    # ------------------------------------------------------------------------------- lookups, health

    def model(self, name: str) -> Model:
        return find_model(self.models, name)

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        return self.model(name).resolve(version)

    @property
    def ready(self) -> bool:
        """Strict (Triton's default): every model loaded and not unloaded has all its versions ready."""
        if not self.online:
            return False
        if not self.strict_readiness:
            return True
        return all(m.fully_ready for m in self.models.values() if not m.unloaded)

    def index(self, ready_only: bool = False) -> list[dict]:
        """Every model in the repository, loaded or not, as Triton's index lists them: one entry per
        version with its state and reason; a model never loaded has version and state ""."""
        names = sorted(set(self._listed()) | set(self.models))
        out: list[dict] = []
        for name in names:
            model = self.models.get(name)
            if model is not None:
                out.extend(model.index(ready_only))
            elif not ready_only:
                out.append({"name": name, "version": "", "state": "", "reason": ""})
        return out

    # ------------------------------------------------------------------------------ repository API

    async def load_model(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Loads, or reloads, a model (explicit mode). `config` is a model config as a JSON string that
        replaces the one on disk; `files` ("1/model.py" -> bytes, from the parameter "file:1/model.py")
        form the model's folder instead of the repository's and need `config`. A reload keeps the loaded model
        serving until the new one is ready, and keeps it when the new one fails."""
        self._check_control("load")
        check_model_name(name)
        parsed = parse_config(name, config) if config is not None else None
        directory, owned = self.path / name, None
        if files:
            if parsed is None:
                raise invalid("Load parameter 'config' must be specified for model file override")
            if self._overrides is None:  # made here, on the loop: two uploads at once share one
                self._overrides = Path(tempfile.mkdtemp(prefix="tensorgate-overrides-"))
            directory = owned = await asyncio.to_thread(write_override, self._overrides, name, files)
        elif not directory.is_dir():
            raise invalid(f"failed to load '{name}', failed to poll from model repository: no such model")
        calls = (
            parsed_steps(parsed)
            if parsed is not None
            else await asyncio.to_thread(composing_models, directory, self.config_name)
        )
        if calls:  # an ensemble: the models its steps call load first, as Triton loads them
            on_disk = self._listed()
            wanted = {n: on_disk[n] for n in calls if n in on_disk and not self._serving(n)}
            if wanted:
                await self._owned(self._load_in_order(wanted, on_disk))
        reason = await self._owned(self._load_locked(name, directory, parsed, owned))
        if reason:
            raise invalid(reason)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unloads a model (explicit mode); requests in flight are answered first. With
        `unload_dependents`, an ensemble's composing models (those its steps call, and theirs) are
        unloaded after it, as Triton does."""
        self._check_control("unload")
        check_model_name(name)
        model = self.models.get(name)
        calls = parsed_steps(model.config) if unload_dependents and model and model.config else []
        await self._owned(self._unload_locked(name))
        for composing in calls:
            if composing != name and composing in self.models:
                await self.unload_model(composing, unload_dependents=True)

    async def _unload_locked(self, name: str) -> None:
        async with self._lock(name):
            model = self.models.get(name)
            if model is None:
                if (self.path / name).is_dir():
                    return  # on disk and not loaded: nothing to do
                raise invalid(f"failed to unload '{name}': unknown model")
            model.unloaded = True
            model.reason = UNLOADED
            await model.retire()
            if not (self.path / name).is_dir():  # an uploaded model: nothing of it is left to index
                self.models.pop(name, None)
            self._changed()
            log.info("model '%s' unloaded", name)

    # ------------------------------------------------------------------------------------ poll mode

    async def poll_forever(self, period: float, stop: asyncio.Event) -> None:
        """Applies the repository's changes every `period` seconds until `stop` is set (a poll under way
        finishes first)."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), period)
                return
            except TimeoutError:
                pass
            try:
                await self.poll_once()
            except Exception:
                log.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        """Loads added models, reloads changed ones (config or version folders), unloads removed ones."""
        scanned = await asyncio.to_thread(self._scan)
        changed = [
            name
            for name, signature in scanned.items()
            if self._failed.get(name) != signature
            and (name not in self.models or self.models[name].signature != signature)
        ]
        removed = [name for name in self.models if name not in scanned]
        await asyncio.gather(
            self._load_in_order({n: self.path / n for n in changed}, {n: self.path / n for n in scanned}),
            *(self._remove(n) for n in removed),
        )

    async def _remove(self, name: str) -> None:
        async with self._lock(name):
            model = self.models.pop(name, None)
            if model is not None:
                await model.retire()
                self._changed()
                log.info("model '%s' removed from the repository: unloaded", name)

    def _scan(self) -> dict[str, Signature]:
        return {name: tree_signature(path) for name, path in self._disk_models().items()}

    # ------------------------------------------------------------------------------------ internals

    def _check_control(self, action: str) -> None:
        if self.control_mode == "poll":
            raise InferError(
                ErrorKind.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled"
            )
        if self.control_mode == "none":
            raise InferError(
                ErrorKind.UNAVAILABLE,
                f"explicit model load / unload is not allowed in model control mode 'none' (cannot {action}; "
                "start the server with --model-control-mode explicit)",
            )

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _disk_models(self) -> dict[str, Path]:
        """The model folders; raises OSError when the repository cannot be listed (a poll then changes
        nothing rather than unloading every model)."""
        entries = sorted(self.path.iterdir())
        return {p.name: p for p in entries if p.is_dir() and not p.name.startswith(".")}

    def _listed(self) -> dict[str, Path]:
        """The model folders, or none (logged) when the repository cannot be listed."""
        try:
            return self._disk_models()
        except OSError as e:
            log.error("cannot list the model repository %s: %s", self.path, e)
            return {}

    async def _load_locked(
        self, name: str, directory: Path, config: dict | None = None, owned: Path | None = None
    ) -> str:
        async with self._lock(name):
            try:
                return await self._load(name, directory, config, owned)
            finally:
                self._changed()

    def _changed(self) -> None:
        self.generation += 1
        for watcher in self.change_watchers:
            watcher()

    def _owned(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """Runs a load or unload as a task of the repository's own: a caller that goes away (a gRPC call
        cancelled at its deadline) cannot stop it half-way, and shutdown waits for it."""
        task = asyncio.ensure_future(work)
        self._lifecycle.add(task)
        task.add_done_callback(_forget(self._lifecycle))
        return asyncio.shield(task)

    async def _load(self, name: str, directory: Path, config: dict | None, owned: Path | None) -> str:
        """Loads `name` afresh and puts it in service; "" on success, else why it failed. A model that
        serves keeps serving until the new one is ready, and stays when the new one fails. The caller
        holds the model's lock."""
        new = Model(name, directory, config, owned, self.config_name, self.auto_complete)
        old = self.models.get(name)
        keep_old = old is not None and old.ready
        if not keep_old:
            new.loading = True  # seen as LOADING by the index and by requests meanwhile
            self.models[name] = new
            self._changed()
            if old is not None:
                await old.retire()
        if self._load_slots is None:
            self._load_slots = asyncio.Semaphore(self.load_threads)
        async with self._load_slots:
            await asyncio.to_thread(new.load, self, self.response_cache)
        complete = new.fully_ready
        if keep_old and not complete:
            self._failed[name] = new.signature
            await new.retire()
            log.error("reloading model '%s' failed, the loaded one serves on: %s", name, new.reason)
            return new.reason
        self._failed.pop(name, None)
        if keep_old and old is not None:
            self.models[name] = new  # the swap: a request now resolves to the new versions
            await old.retire()
            for number, version in new.versions.items():  # counters go on across a reload
                if number in old.versions:
                    version.stats.absorb(old.versions[number].stats)
        if new.ready:
            ready = sorted(n for n, v in new.versions.items() if v.ready)
            log.info("model '%s' ready, versions %s", name, ready)
        if new.reason:
            log.warning("model '%s': %s", name, new.reason)
        return "" if complete else new.reason


def _forget(tasks: set[asyncio.Task]) -> Callable[[asyncio.Task], None]:
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller may be gone, and the error was logged or answered

    return done
