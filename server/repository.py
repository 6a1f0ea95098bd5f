"""The model repository: a directory of `<model>/config.pbtxt|config.json` and `<model>/<version>/` folders.

Loading happens off the event loop; a model whose config or code fails is kept UNAVAILABLE with its
reason while the others serve.
"""

import asyncio
import logging
from pathlib import Path

from codec.errors import ErrorKind, InferError
from server.model import ModelVersion
from server.model_config import ConfigError, load_model_config

log = logging.getLogger("tensorgate.repository")


class Model:
    """A model name with the versions its version_policy selects."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.directory = directory
        self.config: dict | None = None
        self.versions: dict[int, ModelVersion] = {}
        self.newest_first: list[ModelVersion] = []  # a request without a version takes the first ready
        self.reason = ""  # why the model, or some of its versions, failed to load

    @property
    def ready(self) -> bool:
        return any(v.ready for v in self.versions.values())

    def load(self) -> None:
        """Blocking: reads the config and loads every selected version."""
        try:
            self.config = load_model_config(self.directory)
            numbers = select_versions(self.directory, self.config["version_policy"])
        except (ConfigError, OSError) as e:
            self.reason = f"failed to load '{self.name}': {e}"
            return
        if not numbers:
            self.reason = f"failed to load '{self.name}': no version folder matches its version_policy"
            return
        self.versions = {n: ModelVersion(self.directory, self.config, n) for n in numbers}
        self.newest_first = [self.versions[n] for n in sorted(numbers, reverse=True)]
        for version in self.versions.values():
            version.load()
        failed = [v.reason for v in self.versions.values() if not v.ready]
        self.reason = "; ".join(failed)

    def resolve(self, version: str) -> ModelVersion:
        """The version a request names, or the highest ready one for ""."""
        if not version:
            for candidate in self.newest_first:
                if candidate.ready:
                    return candidate
            raise InferError(
                ErrorKind.UNAVAILABLE,
                f"model '{self.name}' is not ready: {self.reason or 'no ready version'}",
            )
        try:
            found = self.versions[int(version)]
        except (ValueError, KeyError):
            raise InferError(ErrorKind.NOT_FOUND, f"model '{self.name}' has no version '{version}'") from None
        if not found.ready:
            raise InferError(
                ErrorKind.UNAVAILABLE, f"model '{self.name}' version {version} is not ready: {found.reason}"
            )
        return found


def version_folders(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def select_versions(directory: Path, policy: dict) -> list[int]:
    available = version_folders(directory)
    if "all" in policy:
        return available
    if "specific" in policy:
        wanted = {int(v) for v in policy["specific"].get("versions", [])}
        return [v for v in available if v in wanted]
    keep = int(policy.get("latest", {}).get("num_versions", 1))
    return available[-keep:] if keep > 0 else []


class Repository:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.models: dict[str, Model] = {}
        # grps Offline clears this: every protocol's readiness probe then says not ready (so load
        # balancers drain the server) while requests are still served; Online sets it again.
        self.online = True

    async def load_all(self) -> None:
        """Loads every model folder, each in a worker thread, concurrently."""
        directories = sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))
        self.models = {d.name: Model(d.name, d) for d in directories}
        await asyncio.gather(*(asyncio.to_thread(m.load) for m in self.models.values()))
        for model in self.models.values():
            if model.ready:
                ready = sorted(n for n, v in model.versions.items() if v.ready)
                log.info("model '%s' ready, versions %s", model.name, ready)
            if model.reason:
                log.warning("model '%s': %s", model.name, model.reason)

    async def unload_all(self) -> None:
        for model in self.models.values():
            for version in model.versions.values():
                if version.ready:
                    await version.unload()

    def model(self, name: str) -> Model:
        try:
            return self.models[name]
        except KeyError:
            raise InferError(ErrorKind.NOT_FOUND, f"unknown model '{name}'") from None

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        return self.model(name).resolve(version)

    @property
    def ready(self) -> bool:
        return self.online and all(m.ready for m in self.models.values())
