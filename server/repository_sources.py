"""The model repositories a server reads and where a model is in them: each --model-repository (a local
folder, or a bucket copied into one: server/cloud_repository.py), the model folders they hold by key
(namespace, name), the folders of one name for a load, and the model an ensemble step naming a name calls.
server/repository.py loads from them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.cloud_repository import CloudError, CloudMirror, is_cloud
from tensorgate.server.repository_files import Key

log = logging.getLogger("tensorgate.repository")


class Source:
    """One --model-repository: a local folder, or a bucket (server/cloud_repository.py) copied into one."""

    def __init__(self, location: str | Path, namespace: str) -> None:
        self.location = str(location)
        self.namespace = namespace  # "" without --model-namespacing: every repository shares one
        self.mirror = CloudMirror(self.location) if is_cloud(self.location) else None
        self.path = self.mirror.local if self.mirror is not None else Path(location)


def model_folders(sources: list[Source], logged: set[str]) -> tuple[dict[Key, Path], set[Path], set[str]]:
    """The model folders of every repository, by key, the repositories that cannot be listed (logged),
    and the names left out: without namespacing, a name in two repositories is in none (logged unless in
    `logged`, the names found so before)."""
    found: dict[Key, list[Path]] = {}
    unlisted: set[Path] = set()
    for source in sources:
        try:
            entries = sorted(source.path.iterdir())
        except OSError as e:
            log.error("cannot list the model repository %s: %s", source.location, e)
            unlisted.add(source.path)
            continue
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith("."):
                found.setdefault((source.namespace, entry.name), []).append(entry)
    duplicates = {key[1] for key, paths in found.items() if len(paths) > 1}
    for name in sorted(duplicates - logged):
        log.error("failed to poll model '%s': not unique across all model repositories", name)
    return {key: paths[0] for key, paths in found.items() if len(paths) == 1}, unlisted, duplicates


async def find_folders(sources: list[Source], name: str) -> dict[Key, Path]:
    """The folders of model `name` in the repositories (a bucket's copied afresh first); raises the
    load's error when there is none, or (without namespacing) more than one: INTERNAL, as Triton's core
    answers a failed poll."""
    found: dict[Key, Path] = {}
    problems = []
    for source in sources:
        if source.mirror is not None:
            try:
                await asyncio.to_thread(source.mirror.sync, name)
            except CloudError as e:
                log.error("%s", e)
                problems.append(str(e))
                continue
        directory = source.path / name
        if directory.is_dir():
            if (source.namespace, name) in found:
                log.error("failed to poll model '%s': not unique across all model repositories", name)
                raise InferError(
                    ErrorKind.INTERNAL,
                    f"failed to load '{name}', failed to poll from model repository: not unique across "
                    "all model repositories",
                )
            found[(source.namespace, name)] = directory
    if not found:
        why = "; ".join(problems) or "no such model"
        raise InferError(
            ErrorKind.INTERNAL, f"failed to load '{name}', failed to poll from model repository: {why}"
        )
    return found


def step_key(key: Key, name: str, on_disk: dict[Key, Path]) -> Key | None:
    """The model an ensemble step naming `name` calls: the one of the ensemble's own repository,
    else the only one of that name."""
    if (key[0], name) in on_disk:
        return (key[0], name)
    found = [k for k in on_disk if k[1] == name]
    return found[0] if len(found) == 1 else None
