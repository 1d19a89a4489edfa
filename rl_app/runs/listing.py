"""``rl_app runs``: every run folder under a root with its status, progress and latest checkpoint."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_app.runs.checkpoints import latest_checkpoint
from rl_app.runs.layout import experiment_data, run_status
from rl_app.runs.progress import read_progress


@dataclass
class RunRow:
    """One line of ``rl_app runs``."""

    path: Path
    experiment: str
    status: str
    started_at: str
    env: str = ""
    iterations: int = 0
    timesteps: int = 0
    best_return: float = math.nan
    last_checkpoint: str = ""
    mlflow_run_id: str = ""

    def as_json(self, runs_root: Path) -> dict[str, Any]:
        """The row for ``rl_app runs --json``: the run as a path relative to ``runs_root``, NaN as null."""
        return {
            "run": str(self.path.relative_to(runs_root)),
            "path": str(self.path),
            "experiment": self.experiment,
            "env": self.env,
            "status": self.status,
            "started_at": self.started_at,
            "iterations": self.iterations,
            "timesteps": self.timesteps,
            "best_return": None if math.isnan(self.best_return) else self.best_return,
            "last_checkpoint": self.last_checkpoint,
            "mlflow_run_id": self.mlflow_run_id or None,
        }


def _env_id(run_dir: Path) -> str:
    """The env of a run, from its experiment.yaml (read as plain YAML: listing validates nothing)."""
    env = experiment_data(run_dir).get("env")
    return str(env.get("id", "") if isinstance(env, dict) else env or "")


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
            env=_env_id(run_dir),
            mlflow_run_id=str((meta.get("mlflow") or {}).get("run_id", "")),
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
