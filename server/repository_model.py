"""The model of one name: the versions its version_policy selects, loaded from one directory, and what a
request naming it reaches (`resolve`, per request), with its readiness, metadata, config and index entries.
A name that two or more repositories hold (--model-namespacing) reaches an `Ambiguous` one instead.
server/repository.py keeps these by name and loads, reloads and unloads them."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.server import config_fields
from tensorgate.server.backends import backend_from_files, complete_config
from tensorgate.server.config_error import ConfigError
from tensorgate.server.model import ModelVersion
from tensorgate.server.model_config import check_complete, load_model_config
from tensorgate.server.repository_files import Signature, select_versions, tree_signature

if TYPE_CHECKING:
    from tensorgate.server.backends.base import Host
    from tensorgate.server.response_cache import ResponseCache

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
                self.config = load_model_config(self.directory, self.config_name, self.auto_complete)
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
            config_fields.log_warnings(self.config, self.directory)
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


class Ambiguous(Model):
    """What a request reaches that names a model of two or more repositories (--model-namespacing):
    Triton's error (core model_repository_manager.cc, FindModelIdentifier). A front-end worker builds
    its own from the engine's model table (server/engine.py), and answers the same."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name, Path())
        self.reason = reason

    @classmethod
    def of(cls, name: str, count: int) -> Ambiguous:
        return cls(
            name,
            f"There are {count} identifiers of model '{name}' in global map, model namespace must be "
            "provided to resolve ambiguity.",
        )

    def resolve(self, version: str) -> ModelVersion:
        raise invalid(self.reason)

    def config_of(self, version: str = "") -> dict:
        raise invalid(self.reason)
