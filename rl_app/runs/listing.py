"""``rl_app runs``: every run folder under a root with its status, progress and latest checkpoint."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rl_app.runs.checkpoints import latest_checkpoint
from rl_app.runs.layout import run_status
from rl_app.runs.progress import read_progress


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
