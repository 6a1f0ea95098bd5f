"""Model repositories in object storage: `--model-repository s3://bucket/path` (or Triton's
`s3://host:port/bucket/path` for an S3-compatible endpoint), `gs://bucket/path` and
`as://account/container/path`, read through fsspec (s3fs, gcsfs, adlfs: the `cloud` extra).

Each is mirrored into a local folder (under a temp dir, or Triton's TRITON_*_MOUNT_DIRECTORY), and the
models load from there as from a local repository. A sync lists the bucket, downloads what changed (by
size and ETag or modification time) and deletes what is gone; poll mode compares the mirror as it
compares a local folder. Credentials are Triton's variables: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, AWS_PROFILE (read by botocore, as AWS_ENDPOINT_URL);
GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

SCHEMES = ("s3://", "gs://", "as://")
# Triton's form with an endpoint (core src/filesystem/implementations/s3.h); no scheme means http.
S3_ENDPOINT = re.compile(
    r"s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)((?:/[0-9a-zA-Z.\-_]+)*)/?"
)
AS_URL = re.compile(r"as://([^/]+)/([^/?]+)(?:/([^?]*))?")
MOUNT_VARIABLES = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
                   "as": "TRITON_AZURE_MOUNT_DIRECTORY"}  # fmt: skip
CONFIG_FILES = ("config.pbtxt", "config.json")
CREDENTIAL_VARIABLES = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS",
    "as": "AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY",
}


class CloudError(Exception):
    """A repository in object storage cannot be read (no extra installed, credentials, bucket)."""


def is_cloud(location: str) -> bool:
    return location.startswith(SCHEMES)


def unusable(location: str) -> str:
    """Why `location` cannot be served here ("" when it can): a malformed path, or the `cloud` extra's
    packages missing."""
    if location.startswith("as://") and AS_URL.fullmatch(location) is None:
        return f"invalid Azure Storage path {location}: expected as://account/container/path"
    package = {"s3": "s3fs", "gs": "gcsfs", "as": "adlfs"}[location[:2]]
    try:
        __import__("fsspec")
        __import__(package)
    except ImportError as e:
        return (
            f"model repository {location} needs the cloud extra (pip install 'tensorgate[cloud]'): "
            f"cannot import {e.name or package}"
        )
    return ""


def open_filesystem(location: str) -> tuple[Any, str]:
    """The fsspec filesystem of `location` and the repository's root path in it."""
    scheme = location[:2]
    if scheme == "s3":
        import s3fs

        endpoint = S3_ENDPOINT.fullmatch(location)
        if endpoint is not None:
            protocol, host, port, bucket, path = endpoint.groups()
            url = f"{protocol or 'http://'}{host}:{port}"
            fs = s3fs.S3FileSystem(endpoint_url=url, skip_instance_cache=True)
            return fs, (bucket + path).rstrip("/")
        return s3fs.S3FileSystem(skip_instance_cache=True), location[len("s3://") :].strip("/")
    if scheme == "gs":
        import gcsfs

        token = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or None
        fs = gcsfs.GCSFileSystem(token=token, skip_instance_cache=True)
        return fs, location[len("gs://") :].strip("/")
    import adlfs

    matched = AS_URL.fullmatch(location)
    if matched is None:
        raise CloudError(f"invalid Azure Storage path {location}: expected as://account/container/path")
    account, container, path = matched.groups()
    fs = adlfs.AzureBlobFileSystem(
        account_name=os.environ.get("AZURE_STORAGE_ACCOUNT") or account,
        account_key=os.environ.get("AZURE_STORAGE_KEY") or None,
        skip_instance_cache=True,
    )
    return fs, f"{container}/{path or ''}".rstrip("/")


def _is_config(relative: str) -> bool:
    parts = PurePosixPath(relative).parts
    return len(parts) >= 2 and (parts[1] in CONFIG_FILES or parts[1] == "configs")


def _token(info: dict) -> tuple:
    """What tells a changed object: its size and ETag (else its modification time)."""
    tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
    when = info.get("LastModified") or info.get("updated") or info.get("last_modified") or info.get("mtime")
    return (info.get("size"), str(tag or ""), str(when or ""))


class CloudMirror:
    """One repository in object storage and its local copy (`local`), made current by `sync`."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.fs: Any = None  # opened on the first sync, in its thread (finding credentials may take time)
        self.root = ""
        mount = os.environ.get(MOUNT_VARIABLES[location[:2]]) or None
        self.local = Path(tempfile.mkdtemp(prefix="tensorgate-cloud-", dir=mount))
        self._seen: dict[str, tuple] = {}  # each copied file's token, as it was when copied

    def sync(self, name: str = "", everything: bool = True) -> None:
        """Blocking: makes the copy of the repository (or of its model folder `name`) what the storage
        holds. Without `everything`, only the configs are copied (what the index and the ensembles' steps
        need), the model files are copied when the model loads. Raises CloudError."""
        remote, folders = self._list(name)
        local_files = self._local_files(name)
        for relative in local_files - remote.keys():
            (self.local / relative).unlink(missing_ok=True)
            self._seen.pop(relative, None)
        for relative, token in sorted(remote.items()):
            target = self.local / relative
            if not everything and not _is_config(relative):
                continue
            if self._seen.get(relative) == token and target.is_file():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            try:
                self.fs.get_file(f"{self.root}/{relative}", str(partial))
            except Exception as e:  # the client's own errors: botocore's, google's, azure's
                partial.unlink(missing_ok=True)
                raise CloudError(f"failed to copy {self.location}/{relative}: {_describe(e)}") from None
            os.replace(partial, target)
            self._seen[relative] = token
        models = {PurePosixPath(r).parts[0] for r in [*remote, *folders]}
        for folder in [*models, *(folders if everything else ())]:
            (self.local / folder).mkdir(parents=True, exist_ok=True)  # listed before its files are copied
        self._prune(name, models, folders)

    def close(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)

    def _list(self, name: str) -> tuple[dict[str, tuple], set[str]]:
        """The objects under the repository (or its folder `name`) by path relative to the root, and the
        folders that S3 consoles mark with an empty "folder/" object."""
        try:
            if self.fs is None:
                self.fs, self.root = open_filesystem(self.location)
            prefix = f"{self.root}/{name}" if name else self.root
            self.fs.invalidate_cache()
            if not name and not self.fs.exists(self.root):
                raise FileNotFoundError(f"no such bucket or folder: {self.location}")
            found = self.fs.find(prefix, detail=True)
        except Exception as e:  # the client's own errors: botocore's, google's, azure's
            why = _describe(e)
            if isinstance(e, PermissionError):
                why += f" (check the credentials: {CREDENTIAL_VARIABLES[self.location[:2]]})"
            raise CloudError(f"failed to poll model repository '{self.location}': {why}") from None
        files: dict[str, tuple] = {}
        folders: set[str] = set()
        start = len(self.root) + 1 if self.root else 0
        for path, info in found.items():
            relative = path.strip("/")[start:]
            if not relative or "/" not in relative and info.get("type") != "directory":
                continue  # the root itself, or a file beside the model folders: no model
            if any(part in ("", ".", "..") for part in relative.split("/")):
                continue  # a key that would leave the copy's folder ("a/../../x"): never written
            if info.get("type") == "directory" or path.endswith("/"):
                folders.add(relative)
            else:
                files[relative] = _token(info)
        return files, folders

    def _local_files(self, name: str) -> set[str]:
        base = self.local / name if name else self.local
        if not base.is_dir():
            return set()
        return {
            str(PurePosixPath(*p.relative_to(self.local).parts))
            for p in base.rglob("*")
            if p.is_file() and not p.name.endswith(".partial")
        }

    def _prune(self, name: str, models: set[str], kept: set[str]) -> None:
        """Removes the folders left empty (but those the storage marks), and the model folders gone."""
        folders = [self.local / name] if name else [p for p in self.local.iterdir() if p.is_dir()]
        for folder in folders:
            if folder.name not in models:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            for root, _, _ in os.walk(folder, topdown=False):
                relative = str(PurePosixPath(*Path(root).relative_to(self.local).parts))
                if root != str(folder) and relative not in kept and not os.listdir(root):
                    os.rmdir(root)


def _describe(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if type(error).__name__ not in text else text
