"""A run's or sweep's folder on storage, and finding runs and checkpoints by path or URI.

Training writes into a local folder, ``runs/<experiment>/<stamp>``; with ``storage:`` set
the same folder exists at ``<storage>/<experiment>/<stamp>``. A run mirrors into it
after every checkpoint; a sweep lets Tune write trials and checkpoints there and
uploads its reports next to them. Either can be picked up again from the URI on an
empty disk.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rl_app.errors import UserError
from rl_app.runs.checkpoints import (
    MARKER,
    CheckpointInfo,
    check_ray_version,
    is_complete,
    read_info,
    resolve_checkpoint,
)
from rl_app.runs.layout import is_run_dir
from rl_app.runs.storage import (
    Storage,
    StorageError,
    delete_dir,
    download,
    exists,
    is_uri,
    list_dirs,
    open_storage,
    upload,
)

RUN_FILES = ("metadata.json", "experiment.yaml", "config.yaml", "status.json", "progress.csv")


@dataclass(frozen=True)
class StorageFolder:
    """``local`` (``.../<experiment>/<stamp>``) and its copy at ``<storage>/<experiment>/<stamp>``."""

    storage: Storage
    local: Path

    @property
    def parts(self) -> tuple[str, str]:
        return (self.local.parent.name, self.local.name)

    @property
    def path(self) -> str:
        """The folder on the storage's filesystem (what Tune's ``storage_path`` takes)."""
        return self.storage.path(*self.parts)

    @property
    def mirrors(self) -> bool:
        """False when the storage folder is the local folder itself: nothing to copy."""
        return not (self.storage.is_local and Path(self.path) == self.local.resolve())

    def describe(self, *parts: str) -> str:
        """The folder (or a file in it) as the user can use it: a local path or a URI."""
        return self.storage.describe(*self.parts, *parts)

    def display(self, fs_path: str) -> str:
        """A path on the storage's filesystem as the user can use it: a local path or a URI."""
        if not fs_path:
            return fs_path
        return self.storage.describe(fs_path[len(self.storage.root) :].strip("/"))

    def push(self, *names: str) -> None:
        """Upload these files or folders of the local folder."""
        if not self.mirrors:
            return
        for name in names:
            if (self.local / name).exists():
                upload(self.local / name, self.storage, *self.parts, name)

    def push_checkpoint(self, checkpoint: Path) -> None:
        """Upload a checkpoint file by file, its marker last."""
        if not self.mirrors:
            return
        remote = (*self.parts, "checkpoints", checkpoint.name)
        files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MARKER)
        for file in [*files, checkpoint / MARKER]:
            upload(file, self.storage, *remote, *file.relative_to(checkpoint).parts)

    def delete_checkpoint(self, name: str) -> None:
        """Delete the copy of a checkpoint pruned locally (when it is a separate copy)."""
        if self.mirrors:
            delete_dir(self.storage, *self.parts, "checkpoints", name)

    def pull(self, names: tuple[str, ...], *, required: str, what: str, checkpoints: bool = False) -> None:
        """Download ``names`` (those that exist; ``required`` must) and, with ``checkpoints``,
        every complete checkpoint the local folder lacks."""
        if not exists(self.storage, *self.parts, required):
            raise UserError(f"no {what} at '{self.describe()}' ({required} not found)")
        self.local.mkdir(parents=True, exist_ok=True)
        for name in names:
            if exists(self.storage, *self.parts, name):
                download(self.storage, self.local / name, *self.parts, name)
        if not checkpoints:
            return
        for name in list_dirs(self.storage, *self.parts, "checkpoints"):
            target = self.local / "checkpoints" / name
            if is_complete(target) or not exists(self.storage, *self.parts, "checkpoints", name, MARKER):
                continue
            download(self.storage, target, *self.parts, "checkpoints", name)

    def read_text(self, fs_path: str) -> str | None:
        """A text file on the storage's filesystem; None when it is missing or unreadable."""
        try:
            with self.storage.fs.open_input_stream(fs_path) as handle:
                return bytes(handle.read()).decode(errors="replace")
        except OSError:
            return None

    def write_text(self, fs_path: str, text: str) -> None:
        with self.storage.fs.open_output_stream(fs_path) as handle:
            handle.write(text.encode())


def folder_at_uri(location: str, runs_root: Path, what: str) -> StorageFolder:
    """The folder at ``<storage>/<experiment>/<stamp>``, paired with ``runs_root/<experiment>/<stamp>``."""
    base, sep, query = location.partition("?")
    parts = base.rstrip("/").rsplit("/", 2)
    if len(parts) != 3 or not (parts[1] and parts[2] and is_uri(parts[0])):
        raise UserError(f"{what} '{location}' must be STORAGE/<experiment>/<timestamp>")
    root_uri, name, stamp = parts
    return StorageFolder(open_storage(root_uri + sep + query), runs_root / name / stamp)


def open_run(location: str, runs_root: Path) -> tuple[Path, StorageFolder | None]:
    """A run folder from a local path or a storage URI (downloaded under ``runs_root``)."""
    if is_uri(location):
        remote = folder_at_uri(location, runs_root, "run")
        remote.pull(RUN_FILES, required="metadata.json", what="run", checkpoints=True)
        return remote.local, remote
    run_dir = Path(location)
    if not is_run_dir(run_dir):
        what = "does not exist" if not run_dir.exists() else "is not a run folder (no metadata.json)"
        raise UserError(f"run '{location}' {what}")
    storage_uri = json.loads((run_dir / "metadata.json").read_text()).get("storage")
    return run_dir, StorageFolder(open_storage(storage_uri), run_dir) if storage_uri else None


def open_checkpoint(
    location: str,
    runs_root: Path,
    allow_version_mismatch: bool = False,
    warn: Callable[[str], None] | None = None,
) -> tuple[Path, CheckpointInfo]:
    """The checkpoint at ``location`` (see :func:`locate_checkpoint`) and its marker, refused when
    another Ray version wrote it (unless ``allow_version_mismatch``)."""
    checkpoint = locate_checkpoint(location, runs_root, warn)
    info = read_info(checkpoint)
    check_ray_version(checkpoint, info, allow_version_mismatch)
    return checkpoint, info


def locate_checkpoint(location: str, runs_root: Path, warn: Callable[[str], None] | None = None) -> Path:
    """A checkpoint from a run folder, a checkpoint folder, or a run's storage URI; ``warn`` hears
    of a run's damaged checkpoints passed over."""
    if is_uri(location):
        run_dir, _ = open_run(location, runs_root)
        return resolve_checkpoint(run_dir, warn)
    return resolve_checkpoint(Path(location), warn)


class RunMirror:
    """Keeps a run's storage copy up to date without ever stopping training for it.

    After each checkpoint it uploads what is new. When the storage fails (an endpoint down,
    a network blip) it says so once, training goes on locally, and the next sync uploads
    every checkpoint the copy missed, in order, and applies the prunes it missed. Nothing
    local is ever deleted because a remote call failed.
    """

    def __init__(self, folder: StorageFolder, warn: Callable[[str], None]) -> None:
        self.folder, self.warn = folder, warn
        self.pending: list[Path] = []  # checkpoints not yet uploaded, oldest first
        self.pruned: set[str] = set()  # checkpoints pruned locally, maybe still on the storage
        self.failed_syncs = 0  # since the storage last answered

    def sync(self, *names: str, checkpoint: Path | None = None, pruned: tuple[str, ...] = ()) -> bool:
        """Upload ``checkpoint`` (and any missed before it), apply prunes, then ``names``; True when
        the storage copy is complete."""
        if checkpoint is not None and checkpoint not in self.pending:
            self.pending.append(checkpoint)
        self.pruned.update(pruned)
        self.pending = [p for p in self.pending if p.name not in self.pruned]
        try:
            while self.pending:
                self.folder.push_checkpoint(self.pending[0])
                self.pending.pop(0)
            for name in sorted(self.pruned):
                self.folder.delete_checkpoint(name)
            self.pruned.clear()
            self.folder.push(*names)
        except StorageError as exc:
            if not self.failed_syncs:
                self.warn(
                    f"storage copy at {self.folder.describe()} failed ({exc}); training goes on "
                    "locally and the copy catches up at the next checkpoint"
                )
            self.failed_syncs += 1
            return False
        if self.failed_syncs:
            self.warn(
                f"storage copy at {self.folder.describe()} caught up after {self.failed_syncs} failed syncs"
            )
            self.failed_syncs = 0
        return True
