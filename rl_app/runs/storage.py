"""Where run folders live: a local path or a storage URI, through ``pyarrow.fs`` as Ray does.

Training always writes into a local run folder; with a remote storage URI the
folder is mirrored there after every checkpoint and at the end, so a run can be
resumed from an empty disk. S3-compatible endpoints come from the usual AWS
variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) or the URI's query
(``s3://bucket/prefix?endpoint_override=host:port&scheme=http``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from rl_app.errors import UserError, first_line

REMOTE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "abfs", "abfss")
ALLOWED = "a local path, file://, " + ", ".join(f"{s}://" for s in REMOTE_SCHEMES)


class StorageError(UserError):
    """Storage that cannot be used: unknown scheme, unreachable, refused credentials."""


@dataclass(frozen=True)
class Storage:
    """A folder on some filesystem: ``fs`` is a ``pyarrow.fs.FileSystem``, ``root`` a path on it."""

    uri: str
    fs: Any
    root: str

    @property
    def is_local(self) -> bool:
        return type(self.fs).__name__ == "LocalFileSystem"

    def path(self, *parts: str) -> str:
        return str(PurePosixPath(self.root, *parts))

    def describe(self, *parts: str) -> str:
        base = self.uri.split("?", 1)[0].rstrip("/")
        return "/".join([base, *parts]) if parts else base


def is_uri(text: str) -> bool:
    return "://" in text


def _explain(exc: BaseException) -> str:
    text = first_line(exc)
    lowered = text.lower()
    if "curlcode: 7" in lowered or "could not connect" in lowered or "couldn't connect" in lowered:
        return "endpoint unreachable (" + text.split("Details:")[-1].strip() + ")"
    if any(
        word in lowered
        for word in (
            "accessdenied",
            "access_denied",
            "access denied",
            "invalidaccesskeyid",
            "signature",
            "forbidden",
        )
    ):
        return "credentials refused (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
    return text


def open_storage(uri: str) -> Storage:
    """Resolve ``uri`` to a filesystem; fails fast with a one-line error when it cannot be used."""
    import pyarrow.fs as pafs

    scheme = urlsplit(uri).scheme if is_uri(uri) else ""
    if scheme in ("", "file"):
        local = Path(uri[len("file://") :] if scheme else uri).expanduser().resolve()
        return Storage(uri=str(local), fs=pafs.LocalFileSystem(), root=str(local))
    if scheme not in REMOTE_SCHEMES:
        raise StorageError(f"storage '{uri}': unknown scheme '{scheme}://' (allowed: {ALLOWED})")
    try:
        if scheme == "s3":
            fs, root = _s3(uri)
        else:
            fs, root = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError, TypeError) as exc:
        raise StorageError(f"storage '{uri}': {_explain(exc)}") from None
    storage = Storage(uri=uri, fs=fs, root=root.rstrip("/"))
    check_reachable(storage)
    return storage


def _s3(uri: str) -> tuple[Any, str]:
    """An S3 filesystem that fails in seconds, not minutes, when the endpoint is down."""
    import pyarrow.fs as pafs

    parts = urlsplit(uri)
    options: dict[str, Any] = {}
    for item in filter(None, parts.query.split("&")):
        key, _, value = item.partition("=")
        options[key] = value
    endpoint = options.pop("endpoint_override", None) or os.environ.get("AWS_ENDPOINT_URL")
    scheme = options.pop("scheme", None)
    if endpoint and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    unknown = sorted(set(options) - {"region"})
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} (allowed: endpoint_override, scheme, region)"
        )
    fs = pafs.S3FileSystem(
        endpoint_override=endpoint or None,
        scheme=scheme or None,
        region=options.get("region") or os.environ.get("AWS_DEFAULT_REGION") or None,
        connect_timeout=5,
        request_timeout=30,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),
        allow_bucket_creation=False,
    )
    return fs, (parts.netloc + parts.path)


def check_reachable(storage: Storage) -> None:
    """One request to the storage, so that bad endpoints and credentials fail before training."""
    bucket = storage.root.split("/", 1)[0]
    try:
        info = storage.fs.get_file_info(bucket)
    except OSError as exc:
        raise StorageError(f"storage '{storage.describe()}': {_explain(exc)}") from None
    import pyarrow.fs as pafs

    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"storage '{storage.describe()}': bucket '{bucket}' does not exist")


def exists(storage: Storage, *parts: str) -> bool:
    import pyarrow.fs as pafs

    try:
        return bool(storage.fs.get_file_info(storage.path(*parts)).type != pafs.FileType.NotFound)
    except OSError as exc:
        raise StorageError(f"storage '{storage.describe(*parts)}': {_explain(exc)}") from None


def list_dirs(storage: Storage, *parts: str) -> list[str]:
    """Names of the folders directly under ``parts``."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(storage.path(*parts), allow_not_found=True)
    try:
        infos = storage.fs.get_file_info(selector)
    except OSError as exc:
        raise StorageError(f"storage '{storage.describe(*parts)}': {_explain(exc)}") from None
    return sorted(info.base_name for info in infos if info.type == pafs.FileType.Directory)


def upload(local: Path, storage: Storage, *parts: str) -> None:
    """Copy a local file or folder to ``parts`` under the storage root."""
    import pyarrow.fs as pafs

    try:
        if local.is_dir():
            storage.fs.create_dir(storage.path(*parts), recursive=True)
            pafs.copy_files(str(local), storage.path(*parts), destination_filesystem=storage.fs)
        else:
            if storage.is_local:  # a local filesystem writes no file into a folder that is not there
                storage.fs.create_dir(storage.path(*parts[:-1]), recursive=True)
            pafs.copy_files(
                str(local),
                storage.path(*parts),
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=storage.fs,
            )
    except OSError as exc:
        raise StorageError(f"storage '{storage.describe(*parts)}': {_explain(exc)}") from None


def download(storage: Storage, local: Path, *parts: str) -> None:
    """Copy ``parts`` (a file or folder) from the storage to ``local``."""
    import pyarrow.fs as pafs

    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        pafs.copy_files(
            storage.path(*parts),
            str(local),
            source_filesystem=storage.fs,
            destination_filesystem=pafs.LocalFileSystem(),
        )
    except OSError as exc:
        raise StorageError(f"storage '{storage.describe(*parts)}': {_explain(exc)}") from None


def delete_dir(storage: Storage, *parts: str) -> None:
    try:
        storage.fs.delete_dir(storage.path(*parts))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StorageError(f"storage '{storage.describe(*parts)}': {_explain(exc)}") from None
