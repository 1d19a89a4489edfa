"""Run folders: ``runs/<experiment>/<timestamp>/`` with everything needed to reproduce.

A run folder holds ``experiment.yaml`` (the validated experiment, what resume
uses), ``config.yaml`` (the same with RLlib's defaults filled in),
``metadata.json``, ``status.json``, ``progress.csv``, ``checkpoints/``,
``tensorboard/``, ``summary.json`` and ``reward_curve.png``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from rl_app.config import ExperimentConfig
from rl_app.runs.files import write_json

EXPERIMENT_FILE = "experiment.yaml"
CONFIG_FILE = "config.yaml"
TRACKED_PACKAGES = ("rl_app", "ray", "torch", "gymnasium", "numpy", "pydantic", "pyarrow")


def check_runs_root(runs_root: Path) -> None:
    """Say now, before Ray starts, when run folders cannot be made under ``runs_root``; creates
    nothing (a probe folder in its nearest existing parent is made and removed)."""
    import tempfile

    from rl_app.errors import UserError

    existing = runs_root.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is a file, not a folder")
        os.rmdir(tempfile.mkdtemp(prefix=".rl_app-probe-", dir=existing))
    except OSError as exc:
        raise UserError(
            f"--runs-dir {runs_root}: cannot create run folders there ({exc.strerror or exc})"
        ) from None


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
    """Save the resolved config, command line, versions, git revision, seed, and which of rl_app's
    faster parts run (the acceleration plan, kept out of the config)."""
    resolved = dict(resolved)
    acceleration_plan = resolved.pop("acceleration_plan", None)
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(resolved, sort_keys=False))
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
            "acceleration_plan": acceleration_plan,
            "hostname": platform.node(),
            "argv": argv,
            "started_at": datetime.now(UTC).isoformat(),
            "executable": sys.executable,
        },
    )


def experiment_dict(experiment: ExperimentConfig) -> dict[str, Any]:
    """The validated experiment as plain data: what ``experiment.yaml`` holds and resume compares."""
    data: dict[str, Any] = experiment.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"extends"}
    )
    return data


def write_experiment(folder: Path, experiment: ExperimentConfig | dict[str, Any]) -> Path:
    """``folder/experiment.yaml``: the validated experiment (or its plain data), as resume reloads it."""
    data = experiment if isinstance(experiment, dict) else experiment_dict(experiment)
    path = folder / EXPERIMENT_FILE
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def as_trained(run_dir: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A run's experiment data with the critic it trained: SAC runs whose config.yaml does not name
    ``model.sac_critic`` predate it and trained RLlib's multi-stream critic."""
    if data.get("algorithm") != "SAC" or "sac_critic" in (data.get("model") or {}):
        return data
    try:
        resolved = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return data
    if not isinstance(resolved, dict) or "sac_critic" in (resolved.get("model") or {}):
        return data
    return {**data, "model": {**(data.get("model") or {}), "sac_critic": "multi_stream"}}


def experiment_data(folder: Path) -> dict[str, Any]:
    """``folder/experiment.yaml`` as plain data, unvalidated; empty when missing or unreadable."""
    try:
        data = yaml.safe_load((folder / EXPERIMENT_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_experiment(checkpoint: Path) -> ExperimentConfig | None:
    """The experiment a checkpoint was trained with: its run's, or its sweep trial's experiment.yaml."""
    from rl_app.config import validate_experiment
    from rl_app.config.loader import read_yaml

    for folder in (checkpoint.parent.parent, checkpoint.parent):  # run folder, sweep trial folder
        source = folder / EXPERIMENT_FILE
        if source.is_file() and (folder == checkpoint.parent or is_run_dir(folder)):
            return validate_experiment(read_yaml(source), str(source))
    return None


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
    """A run folder is one with ``metadata.json``."""
    return (path / "metadata.json").is_file()
