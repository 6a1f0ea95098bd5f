"""What a model repository holds on disk, read (and written) off the event loop: the version folders a
version policy selects, what poll mode compares (a tree's signature), model names and the files of a
file override (written into the server's own folder), a config given through the repository API, and
the models an ensemble's steps call (server/repository.py loads those first)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from tensorgate.codec.errors import InferError, invalid
from tensorgate.server.config_error import ConfigError
from tensorgate.server.model_config import load_model_config, normalize_config

Signature = frozenset[tuple[str, int, int]]
Key = tuple[str, str]  # a model: (namespace, name); the namespace is "" without --model-namespacing


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


def tree_signature(directory: Path) -> Signature:
    """What poll mode compares: each file's path, size and mtime, and each folder's path. Folder mtimes,
    hidden entries and __pycache__ are left out (the server writes none, but another process importing
    a model's modules may)."""
    entries: list[tuple[str, int, int]] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        relative = os.path.relpath(root, directory)
        entries.append((relative, -1, -1))
        for name in files:
            if name.startswith("."):
                continue
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:  # removed while we walk: the next poll sees the rest of the change
                continue
            entries.append((os.path.join(relative, name), stat.st_size, stat.st_mtime_ns))
    return frozenset(entries)


def check_model_name(name: str) -> None:
    if not name.strip() or "/" in name or "\\" in name or ".." in name or name.startswith("."):
        raise invalid(f"invalid model name '{name}': a model name is one folder name, not a path")


def override_path(key: str) -> PurePosixPath:
    """The relative path a file override names ("1/model.py" for the parameter "file:1/model.py"), checked
    to stay inside the model's folder."""
    path = PurePosixPath(key)
    if not path.parts or path.is_absolute() or any(p in ("", ".", "..") for p in path.parts):
        raise invalid(f"invalid file parameter 'file:{key}': the path must stay within the model directory")
    return path


def parsed_steps(config: dict) -> list[str]:
    """The models an ensemble's steps call, in step order (none for any other model)."""
    if config.get("platform") != "ensemble":
        return []
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    return list(dict.fromkeys(s["model_name"] for s in steps if isinstance(s, dict) and s.get("model_name")))


def composing_models(directory: Path, config_name: str = "") -> list[str]:
    """Blocking: the models the ensemble in `directory` calls; none when it is no ensemble, or when its
    config cannot be read (its load then says why)."""
    try:
        return parsed_steps(load_model_config(directory, config_name))
    except (ConfigError, OSError):
        return []


def composing_all(
    wanted: dict[Key, Path],
    on_disk: dict[Key, Path],
    find: Callable[[Key, str], Key | None],
    config_name: str = "",
) -> dict[Key, list[Key]]:
    """Blocking: what each wanted model's steps call, followed through the ensembles among them; `find`
    says which model (key) an ensemble's step names, None when none or several."""
    steps: dict[Key, list[Key]] = {}
    todo = list(wanted)
    while todo:
        key = todo.pop()
        if key in steps:
            continue
        directory = wanted.get(key) or on_disk.get(key)
        names = composing_models(directory, config_name) if directory is not None else []
        steps[key] = [k for k in (find(key, n) for n in names) if k is not None]
        todo.extend(k for k in steps[key] if k in on_disk)
    return steps


def write_override(root: Path, name: str, files: dict[str, bytes]) -> Path:
    """Blocking: writes the files of a file override into a new folder under `root` (the server's)."""
    directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    try:
        for key, data in files.items():
            target = directory.joinpath(*override_path(key).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    except (OSError, InferError) as e:
        shutil.rmtree(directory, ignore_errors=True)
        if isinstance(e, InferError):
            raise
        raise invalid(f"failed to load '{name}': cannot write the override files: {e}") from None
    return directory


def parse_config(name: str, text: str) -> dict:
    try:
        raw = json.loads(text)
    except (ValueError, TypeError) as e:
        raise invalid(f"failed to load '{name}': parameter 'config' is not valid JSON: {e}") from None
    try:
        return normalize_config(raw, name)
    except ConfigError as e:
        raise invalid(f"failed to load '{name}': {e}") from None
