"""Run folders: ``runs/<experiment>/<timestamp>/`` with everything needed to reproduce."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

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
) -> None:
    """Save the resolved config, command line, versions, git revision and seed."""
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    (run_dir / "command.txt").write_text(" ".join(argv) + "\n")
    write_json(
        run_dir / "metadata.json",
        {
            "experiment": experiment_name,
            "experiment_file": str(experiment_file),
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
