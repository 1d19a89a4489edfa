"""Checkpoint lifecycle: atomic saves, keep the last K, find the latest good one."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

CHECKPOINT_NAME = re.compile(r"^iter_(\d{6,})$")


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (half-written ones are never listed)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and CHECKPOINT_NAME.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(algo: Any, run_dir: Path, iteration: int, keep: int) -> Path:
    """Save ``algo`` as ``checkpoints/iter_NNNNNN``, then prune to the newest ``keep``.

    RLlib writes into a hidden temporary folder that is renamed into place only
    once complete, so a process killed mid-save leaves no checkpoint that looks
    finished.
    """
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:06d}"
    if final.exists():
        return final
    partial = root / f".partial-iter_{iteration:06d}"
    shutil.rmtree(partial, ignore_errors=True)
    algo.save_to_path(str(partial.resolve()))
    os.replace(partial, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final
