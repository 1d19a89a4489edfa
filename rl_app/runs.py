"""Run folders: ``runs/<experiment>/<timestamp>/`` with everything needed to reproduce.

A run folder holds ``experiment.yaml`` (the validated experiment, what resume
uses), ``config.yaml`` (the same with RLlib's defaults filled in),
``metadata.json``, ``status.json``, ``progress.csv``, ``checkpoints/``,
``tensorboard/``, ``summary.json`` and ``reward_curve.png``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from rl_app.errors import UserError

TRACKED_PACKAGES = ("rl_app", "ray", "torch", "gymnasium", "numpy", "pydantic", "pyarrow")


def new_run_dir(runs_root: Path, experiment_name: str) -> Path:
    """Create a fresh run folder; never reuses an existing one."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    parent = runs_root / experiment_name
    parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        candidate = parent / (stamp if attempt == 0 else f"{stamp}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"could not create a new run folder under {parent}")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_revision(directory: Path) -> str | None:
    """The commit of ``directory``'s repository, with ``-dirty`` for uncommitted changes."""
    try:
        revision = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return revision or None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON via a temporary file so readers never see a half-written file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    partial.replace(path)


def write_run_metadata(
    run_dir: Path,
    *,
    experiment_name: str,
    experiment_file: Path,
    resolved: dict[str, Any],
    overrides: tuple[str, ...],
    resources: dict[str, Any],
    argv: list[str],
    storage: str | None = None,
) -> None:
    """Save the resolved config, command line, versions, git revision and seed."""
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    (run_dir / "command.txt").write_text(" ".join(argv) + "\n")
    write_json(
        run_dir / "metadata.json",
        {
            "experiment": experiment_name,
            "experiment_file": str(experiment_file),
            "storage": storage,
            "overrides": list(overrides),
            "seed": resolved.get("seed"),
            "git_revision": git_revision(experiment_file.parent),
            "versions": package_versions(),
            "resources": resources,
            "hostname": platform.node(),
            "argv": argv,
            "started_at": datetime.now(UTC).isoformat(),
            "executable": sys.executable,
        },
    )


def experiment_dict(experiment: Any) -> dict[str, Any]:
    """The validated experiment as plain data: what ``experiment.yaml`` holds and resume compares."""
    data: dict[str, Any] = experiment.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"extends"}
    )
    return data


def write_experiment(run_dir: Path, experiment: Any) -> None:
    """The validated experiment, as resume reloads it."""
    (run_dir / "experiment.yaml").write_text(yaml.safe_dump(experiment_dict(experiment), sort_keys=False))


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"'{path}' is missing") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"'{path}' is unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"'{path}' is not a JSON object")
    return data


def write_status(run_dir: Path, status: str, **extra: Any) -> None:
    """``status.json``: running (with our pid), finished, interrupted or failed."""
    write_json(
        run_dir / "status.json",
        {
            "status": status,
            "pid": os.getpid(),
            "hostname": platform.node(),
            "updated_at": datetime.now(UTC).isoformat(),
            **extra,
        },
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_status(run_dir: Path) -> str:
    """running, finished, interrupted, failed, or killed (says running, but its process is gone)."""
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    state = str(status.get("status", "unknown"))
    if state == "running" and status.get("hostname") == platform.node():
        return "running" if _alive(int(status.get("pid", -1))) else "killed"
    return state


def is_run_dir(path: Path) -> bool:
    return (path / "metadata.json").is_file()


@dataclass
class RunRow:
    """One line of ``rl_app runs``."""

    path: Path
    experiment: str
    status: str
    started_at: str
    iterations: int = 0
    timesteps: int = 0
    best_return: float = math.nan
    last_checkpoint: str = ""


def find_runs(runs_root: Path) -> list[RunRow]:
    """Every run folder under ``runs_root``, oldest first."""
    from rl_app.checkpoints import latest_checkpoint
    from rl_app.report import read_progress

    rows = []
    for meta_file in sorted(runs_root.glob("*/*/metadata.json")):
        run_dir = meta_file.parent
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        row = RunRow(
            path=run_dir,
            experiment=str(meta.get("experiment", run_dir.parent.name)),
            status=run_status(run_dir),
            started_at=str(meta.get("started_at", ""))[:19].replace("T", " "),
        )
        progress = run_dir / "progress.csv"
        if progress.is_file():
            metrics = read_progress(progress)
            if metrics:
                row.iterations = int(metrics[-1]["iteration"])
                row.timesteps = int(metrics[-1]["timesteps"])
                evals = [m["eval_return_mean"] for m in metrics if not math.isnan(m["eval_return_mean"])]
                trains = [m["return_mean"] for m in metrics if not math.isnan(m["return_mean"])]
                row.best_return = max(evals or trains or [math.nan])
        latest = latest_checkpoint(run_dir)
        row.last_checkpoint = latest.name if latest else ""
        rows.append(row)
    rows.sort(key=lambda r: r.started_at)
    return rows


@dataclass
class RunMirror:
    """Keeps a copy of a local run folder at ``storage/<experiment>/<stamp>``."""

    storage: Any  # rl_app.storage.Storage
    local: Path

    @property
    def parts(self) -> tuple[str, str]:
        return (self.local.parent.name, self.local.name)

    def describe(self) -> str:
        return self.storage.describe(*self.parts)

    def push(self, *names: str) -> None:
        """Upload these files or folders of the run folder."""
        from rl_app.storage import upload

        for name in names:
            if (self.local / name).exists():
                upload(self.local / name, self.storage, *self.parts, name)

    def push_checkpoint(self, checkpoint: Path, pruned: list[str]) -> None:
        """Upload a checkpoint file by file, its marker last, then delete the pruned ones."""
        from rl_app.checkpoints import MARKER
        from rl_app.storage import delete_dir, upload

        remote = (*self.parts, "checkpoints", checkpoint.name)
        files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MARKER)
        for file in [*files, checkpoint / MARKER]:
            upload(file, self.storage, *remote, *file.relative_to(checkpoint).parts)
        for name in pruned:
            delete_dir(self.storage, *self.parts, "checkpoints", name)

    def pull(self) -> None:
        """Download the run's files and its complete checkpoints into the local folder."""
        from rl_app.checkpoints import MARKER, is_complete
        from rl_app.storage import download, exists, list_dirs

        if not exists(self.storage, *self.parts, "metadata.json"):
            raise UserError(f"no run at '{self.describe()}' (metadata.json not found)")
        self.local.mkdir(parents=True, exist_ok=True)
        for name in ("metadata.json", "experiment.yaml", "config.yaml", "status.json", "progress.csv"):
            if exists(self.storage, *self.parts, name):
                download(self.storage, self.local / name, *self.parts, name)
        for name in list_dirs(self.storage, *self.parts, "checkpoints"):
            target = self.local / "checkpoints" / name
            if is_complete(target) or not exists(self.storage, *self.parts, "checkpoints", name, MARKER):
                continue
            download(self.storage, target, *self.parts, "checkpoints", name)


def locate_checkpoint(location: str, runs_root: Path) -> Path:
    """A checkpoint from a run folder, a checkpoint folder, or a run's storage URI."""
    from rl_app.checkpoints import resolve_checkpoint
    from rl_app.storage import is_uri

    if is_uri(location):
        run_dir, _ = open_run(location, runs_root)
        return resolve_checkpoint(run_dir)
    return resolve_checkpoint(Path(location))


def open_run(location: str, runs_root: Path) -> tuple[Path, RunMirror | None]:
    """A run folder from a local path or a storage URI (downloaded under ``runs_root``)."""
    from rl_app.storage import Storage, is_uri, open_storage

    if not is_uri(location):
        run_dir = Path(location)
        if not is_run_dir(run_dir):
            what = "does not exist" if not run_dir.exists() else "is not a run folder (no metadata.json)"
            raise UserError(f"run '{location}' {what}")
        meta = json.loads((run_dir / "metadata.json").read_text())
        storage_uri = meta.get("storage")
        mirror = RunMirror(open_storage(storage_uri), run_dir) if storage_uri else None
        return run_dir, mirror
    base, sep, query = location.partition("?")
    storage = open_storage(location)
    parent = storage.root.rstrip("/").rsplit("/", 2)
    if len(parent) < 3:
        raise UserError(f"run '{location}' must be STORAGE/<experiment>/<timestamp>")
    root_uri = base.rstrip("/").rsplit("/", 2)[0] + sep + query
    root_storage = Storage(uri=root_uri, fs=storage.fs, root=parent[0])
    run_dir = runs_root / parent[1] / parent[2]
    mirror = RunMirror(root_storage, run_dir)
    mirror.pull()
    return run_dir, mirror
