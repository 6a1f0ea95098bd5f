"""The lifecycle of the models of the model repositories: directories of `<model>/config.pbtxt|config.json`
and `<model>/<version>/` folders, local or in object storage (server/repository_sources.py). What is in
service, and what a request reaches, is server/served_models.py's; one model, server/repository_model.py.

Loading happens off the event loop; a model whose config or code fails is kept UNAVAILABLE with its
reason while the others serve. Models are loaded, reloaded and unloaded at run time as Triton's model
control modes say: `none` loads everything at start, `explicit` obeys the repository API, `poll` follows
the directory. A reload swaps in the new version set once it is ready, then retires the old one after
its requests in flight are answered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.server.app_monitor import app_monitor
from tensorgate.server.cloud_repository import CloudError
from tensorgate.server.model import UNLOADED
from tensorgate.server.repository_files import (
    Key,
    Signature,
    check_model_name,
    composing_all,
    composing_models,
    parse_config,
    parsed_steps,
    tree_signature,
    write_override,
)
from tensorgate.server.repository_model import Model
from tensorgate.server.repository_sources import Source, find_folders, model_folders, step_key
from tensorgate.server.served_models import ScopedHost, ServedModels

if TYPE_CHECKING:
    from tensorgate.batcher.rate_limiter import RateLimiter
    from tensorgate.server.app_monitor import AppMonitor
    from tensorgate.server.backends.base import Host
    from tensorgate.server.response_cache import ResponseCache

log = logging.getLogger("tensorgate.repository")
T = TypeVar("T")

CONTROL_MODES = ("none", "explicit", "poll")
DUPLICATE = "model appears in two or more repositories"  # Triton's MODEL_READY_REASON_DUPLICATE


class Repository(ServedModels):
    """The models of one server, from one or more model repositories, kept in service as ServedModels
    (server/served_models.py) says. It is also the `Host` (server/backends/base.py) it hands each backend
    it loads: `resolve` for the models a model calls (BLS, ensembles), the event loop they serve on, and
    the app_monitor models record their own metrics in."""

    def __init__(
        self,
        paths: Path | str | list[Path | str],
        control_mode: str = "none",
        strict_readiness: bool = True,
        app_monitor: AppMonitor = app_monitor,
        response_cache: ResponseCache | None = None,
        python_execution_mode: str = "auto",
        config_name: str = "",
        load_threads: int = 4,
        auto_complete: bool = True,
        namespacing: bool = False,
        exit_on_error: bool = False,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        if control_mode not in CONTROL_MODES:
            raise ValueError(f"unknown model control mode {control_mode!r}")
        super().__init__(strict_readiness)
        self.app_monitor = app_monitor
        self.response_cache = response_cache  # --cache-config: shared by the models that enable it
        self.python_execution_mode = python_execution_mode  # --python-execution-mode
        self.config_name = config_name  # --model-config-name: configs/<name>.pbtxt where a model has one
        self.load_threads = load_threads  # --model-load-thread-count: models loading at once, at most
        self.auto_complete = auto_complete  # off: --disable-auto-complete-config (or --strict-model-config)
        self.namespacing = namespacing  # --model-namespacing
        self.exit_on_error = exit_on_error  # --exit-on-error: start() raises StartupError on any failure
        self.rate_limiter = rate_limiter  # --rate-limit execution_count: models join it (server/model.py)
        self._load_slots: asyncio.Semaphore | None = None  # made on the server's loop
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, from start()
        locations = list(dict.fromkeys(map(str, paths))) if isinstance(paths, list) else [str(paths)]
        self.sources = [Source(p, str(p) if namespacing else "") for p in locations]
        self.control_mode = control_mode
        self._duplicates: set[str] = set()  # without namespacing: names in two or more repositories
        self._locks: dict[Key, asyncio.Lock] = {}  # one per model: its loads and unloads take turns
        self._failed: dict[Key, Signature | None] = {}  # poll mode: a failed reload is not retried as is
        self._overrides: Path | None = None  # the server's folder for file overrides, made on first use
        self._lifecycle: set[asyncio.Task] = set()  # loads and unloads under way for API callers
        self._starting = False  # within start(): errors are counted for --exit-on-error
        self._startup_errors: list[str] = []  # what --exit-on-error true exits on

    # ---------------------------------------------------------------------------------------- startup

    async def start(self, load_models: list[str] | tuple[str, ...] = ()) -> None:
        """Loads what the control mode loads at startup: everything, or (explicit) `load_models`. With
        --exit-on-error true, any failure (a model, a repository that cannot be read) unloads what
        loaded and raises StartupError."""
        self.loop = asyncio.get_running_loop()
        self._starting = True
        everything = self.control_mode != "explicit" or "*" in load_models
        for source in self.sources:
            if source.mirror is not None:  # explicit mode: the configs now, each model's files on load
                await self._sync(source, "", everything)
        if self.control_mode != "explicit":
            if load_models:
                log.warning("--load-model is only used with --model-control-mode explicit; ignored")
            await self.load_all()
        elif "*" in load_models:
            await self.load_all()
        else:
            await self.load_all(list(dict.fromkeys(load_models)))
        self._starting = False
        failed = [m.reason for m in self.namespaced.values() if not m.fully_ready]
        if self.exit_on_error and (self._startup_errors or failed):
            await self.unload_all()
            raise StartupError("failed to load all models")

    async def load_all(self, names: list[str] | None = None) -> None:
        """Loads every model folder (or those named), each in a worker thread, concurrently."""
        on_disk, unlisted = self._disk_models()
        if self._starting:  # each logged by _disk_models
            self._startup_errors.extend(str(p) for p in unlisted)
            self._startup_errors.extend(sorted(self._duplicates))
        for name in names or ():
            if not any(k[1] == name for k in on_disk):
                self._startup_error(
                    f"failed to load '{name}': no model folder '{name}' in the model repository"
                )
        wanted = on_disk if names is None else {k: d for k, d in on_disk.items() if k[1] in names}
        await self._load_in_order(dict(wanted), on_disk)

    async def _load_in_order(self, wanted: dict[Key, Path], on_disk: dict[Key, Path]) -> None:
        """Loads `wanted` concurrently, ensembles after the models their steps call (which load with
        them when they are on disk and not loaded yet)."""
        find = functools.partial(step_key, on_disk=on_disk)
        steps = await asyncio.to_thread(composing_all, wanted, on_disk, find, self.config_name)
        for key in [k for calls in steps.values() for k in calls]:
            if key not in wanted and key in on_disk and not self._serving(key):
                wanted[key] = on_disk[key]
                steps.setdefault(key, [])
        remaining = dict(wanted)
        while remaining:
            ready = {k: d for k, d in remaining.items() if not any(c in remaining for c in steps.get(k, ()))}
            ready = ready or remaining  # a cycle: each load then fails naming what it lacks
            await asyncio.gather(*(self._load_locked(k, d) for k, d in ready.items()))
            remaining = {k: d for k, d in remaining.items() if k not in ready}

    async def unload_all(self) -> None:
        if self._lifecycle:
            await asyncio.gather(*self._lifecycle, return_exceptions=True)
        for model in list(self.namespaced.values()):
            await model.retire()
        if self._overrides is not None:
            await asyncio.to_thread(shutil.rmtree, self._overrides, True)
        for source in self.sources:
            if source.mirror is not None:
                await asyncio.to_thread(source.mirror.close)

    # ------------------------------------------------------------------------------------------ index

    def index(self, ready_only: bool = False) -> list[dict]:
        """Every model in the repositories, loaded or not, as Triton's index lists them: one entry per
        version with its state and reason; a model never loaded has version and state "". A name in two
        repositories (without namespacing) is UNAVAILABLE, as Triton lists it."""
        keys = sorted(set(self._listed()) | set(self.namespaced), key=lambda k: (k[1], k[0]))
        out: list[dict] = []
        for name in sorted(self._duplicates):
            if not ready_only:
                out.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": DUPLICATE})
        for key in keys:
            model = self.namespaced.get(key)
            if model is not None:
                out.extend(model.index(ready_only))
            elif not ready_only:
                out.append({"name": key[1], "version": "", "state": "", "reason": ""})
        return sorted(out, key=lambda entry: entry["name"])

    # ------------------------------------------------------------------------------ repository API

    async def load_model(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Loads, or reloads, a model (explicit mode); with --model-namespacing, every model of that name.
        `config` is a model config as a JSON string that replaces the one on disk; `files` ("1/model.py"
        -> bytes, from the parameter "file:1/model.py") form the model's folder instead of the
        repository's and need `config`. A reload keeps the loaded model serving until the new one is
        ready, and keeps it when the new one fails."""
        self._check_control("load")
        check_model_name(name)
        parsed = parse_config(name, config) if config is not None else None
        if files:
            if parsed is None:
                raise invalid("Load parameter 'config' must be specified for model file override")
            if self._overrides is None:  # made here, on the loop: two uploads at once share one
                self._overrides = Path(tempfile.mkdtemp(prefix="tensorgate-overrides-"))
            owned = await asyncio.to_thread(write_override, self._overrides, name, files)
            found = {("", name): owned}
        else:
            owned = None
            found = await find_folders(self.sources, name)
        reasons = []
        for key, directory in found.items():
            calls = (
                parsed_steps(parsed)
                if parsed is not None
                else await asyncio.to_thread(composing_models, directory, self.config_name)
            )
            if calls:  # an ensemble: the models its steps call load first, as Triton loads them
                on_disk = self._listed()
                steps = [step_key(key, n, on_disk) for n in calls]
                wanted = {k: on_disk[k] for k in steps if k is not None and not self._serving(k)}
                if wanted:
                    await self._owned(self._load_in_order(wanted, on_disk))
            reasons.append(await self._owned(self._load_locked(key, directory, parsed, owned)))
        if any(reasons):
            raise invalid("; ".join(r for r in reasons if r))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unloads a model (explicit mode), every model of that name with --model-namespacing; requests
        in flight are answered first. With `unload_dependents`, an ensemble's composing models (those its
        steps call, and theirs) are unloaded after it, as Triton does."""
        self._check_control("unload")
        check_model_name(name)
        keys = [k for k in self.namespaced if k[1] == name] or [("", name)]
        for key in keys:
            model = self.namespaced.get(key)
            calls = parsed_steps(model.config) if unload_dependents and model and model.config else []
            await self._owned(self._unload_locked(key))
            for composing in calls:
                if composing != name and any(k[1] == composing for k in self.namespaced):
                    await self.unload_model(composing, unload_dependents=True)

    async def _unload_locked(self, key: Key) -> None:
        name = key[1]
        async with self._lock(key):
            model = self.namespaced.get(key)
            if model is None:
                if any((s.path / name).is_dir() for s in self.sources):
                    return  # on disk and not loaded: nothing to do
                raise invalid(f"failed to unload '{name}': unknown model")
            model.unloaded = True
            model.reason = UNLOADED
            await model.retire()
            if not any((s.path / name).is_dir() for s in self.sources):
                self._set(key, None)  # an uploaded model: nothing of it is left to index
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
        """Loads added models, reloads changed ones (config or version folders), unloads removed ones. The
        models of a repository that cannot be read stay as they are."""
        unread: set[Path] = set()
        for source in self.sources:
            if source.mirror is not None and not await self._sync(source):
                unread.add(source.path)
        folders, scanned, unlisted = await asyncio.to_thread(self._scan)
        unread |= unlisted
        for source in self.sources:
            if source.path in unread:
                log.error("polling the model repository failed: %s cannot be read", source.location)
        changed = [
            key
            for key, signature in scanned.items()
            if self._failed.get(key) != signature
            and (key not in self.namespaced or self.namespaced[key].signature != signature)
        ]
        removed = [
            key
            for key, model in self.namespaced.items()
            if key not in scanned and model.directory.parent not in unread and model.owned_dir is None
        ]
        await asyncio.gather(
            self._load_in_order({k: folders[k] for k in changed}, folders),
            *(self._remove(k) for k in removed),
        )

    async def _remove(self, key: Key) -> None:
        async with self._lock(key):
            model = self.namespaced.get(key)
            if model is not None:
                self._set(key, None)
                await model.retire()
                self._changed()
                log.info("model '%s' removed from the repository: unloaded", key[1])

    def _scan(self) -> tuple[dict[Key, Path], dict[Key, Signature], set[Path]]:
        folders, unlisted = self._disk_models()
        return folders, {key: tree_signature(path) for key, path in folders.items()}, unlisted

    # ------------------------------------------------------------------------------------ internals

    async def _sync(self, source: Source, name: str = "", everything: bool = True) -> bool:
        """Copies a bucket's changes into its local folder; False (logged) when it cannot be read."""
        assert source.mirror is not None
        try:
            await asyncio.to_thread(source.mirror.sync, name, everything)
        except CloudError as e:
            self._startup_error(str(e))
            return False
        return True

    def _startup_error(self, text: str) -> None:
        """Logs `text`, an error; during start() it also counts for --exit-on-error."""
        log.error("%s", text)
        if self._starting:
            self._startup_errors.append(text)

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

    def _lock(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def _disk_models(self) -> tuple[dict[Key, Path], set[Path]]:
        """The model folders of every repository, by key, and the repositories that cannot be listed
        (logged). Without namespacing, a name in two repositories is left out (logged once)."""
        folders, unlisted, self._duplicates = model_folders(self.sources, self._duplicates)
        return folders, unlisted

    def _listed(self) -> dict[Key, Path]:
        """The model folders (those of the repositories that can be listed)."""
        return self._disk_models()[0]

    async def _load_locked(
        self, key: Key, directory: Path, config: dict | None = None, owned: Path | None = None
    ) -> str:
        async with self._lock(key):
            try:
                return await self._load(key, directory, config, owned)
            finally:
                self._changed()

    def _owned(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """Runs a load or unload as a task of the repository's own: a caller that goes away (a gRPC call
        cancelled at its deadline) cannot stop it half-way, and shutdown waits for it."""
        task = asyncio.ensure_future(work)
        self._lifecycle.add(task)
        task.add_done_callback(_forget(self._lifecycle))
        return asyncio.shield(task)

    def _host(self, key: Key) -> Host:
        return cast("Host", ScopedHost(self, key[0])) if self.namespacing else self

    async def _load(self, key: Key, directory: Path, config: dict | None, owned: Path | None) -> str:
        """Loads `key` afresh and puts it in service; "" on success, else why it failed. A model that
        serves keeps serving until the new one is ready, and stays when the new one fails. The caller
        holds the model's lock."""
        name = key[1]
        new = Model(name, directory, config, owned, self.config_name, self.auto_complete)
        old = self.namespaced.get(key)
        keep_old = old is not None and old.ready
        if not keep_old:
            new.loading = True  # seen as LOADING by the index and by requests meanwhile
            self._set(key, new)
            self._changed()
            if old is not None:
                await old.retire()
        if self._load_slots is None:
            self._load_slots = asyncio.Semaphore(self.load_threads)
        async with self._load_slots:
            source = next((s for s in self.sources if s.path == directory.parent), None)
            copied = True
            if source is not None and source.mirror is not None and self.control_mode == "explicit":
                copied = await self._sync(source, name)  # the model's files, copied on load
            if copied:
                await asyncio.to_thread(new.load, self._host(key), self.response_cache)
            else:
                new.reason = f"failed to load '{name}': its model repository cannot be read"
                new.loading = False
        complete = new.fully_ready
        if keep_old and not complete:
            self._failed[key] = new.signature
            await new.retire()
            log.error("reloading model '%s' failed, the loaded one serves on: %s", name, new.reason)
            return new.reason
        self._failed.pop(key, None)
        if keep_old and old is not None:
            self._set(key, new)  # the swap: a request now resolves to the new versions
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


class StartupError(Exception):
    """--exit-on-error true: a model failed to load at startup (Triton's "failed to load all models")."""


def _forget(tasks: set[asyncio.Task]) -> Callable[[asyncio.Task], None]:
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller may be gone, and the error was logged or answered

    return done
