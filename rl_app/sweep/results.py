"""A sweep's outcome: every trial ranked, results.csv, the best trial as an experiment file."""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ray import tune

from rl_app.config import ExperimentConfig, validate_experiment
from rl_app.config.data import with_values
from rl_app.config.sweep import trial_data
from rl_app.console.progress import format_value
from rl_app.console.sweep import error_file
from rl_app.runs.layout import experiment_dict
from rl_app.runs.progress import number_or_nan
from rl_app.runs.remote import StorageFolder
from rl_app.sweep.tuner import tune_filesystem


@dataclass
class TrialRow:
    """One trial's outcome, as results.csv and the plots show it."""

    trial: str
    status: str  # finished | pruned | error | unfinished
    failures: int
    values: dict[str, Any]
    score: float
    iterations: int
    timesteps: int
    return_mean: float
    eval_return_mean: float
    checkpoint: str
    trial_dir: str
    error: str
    nodes: str = ""  # the addresses of the nodes the trial ran on, in turn (more than one after a retry)
    history: list[dict[str, float]] = field(default_factory=list, repr=False)
    rank: int = 0
    fs_path: str = field(default="", repr=False)  # the trial folder on Tune's filesystem


def _status(trial: Any) -> str:
    if trial.status == "ERROR":
        return "error"
    if trial.status == "TERMINATED":
        return "finished" if "stop_reason" in (trial.last_result or {}) else "pruned"
    return "unfinished"


EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b: \S")


def _error_line(trial: Any, folder: StorageFolder) -> str:
    """The root cause of the trial's last failure: the first 'SomeError: message' line of it.

    Tune's error.txt holds a section per failure; in each, Python prints the original
    exception before the ones that wrap it (RLlib re-raises env errors as a bare RuntimeError).
    """
    text = folder.read_text(error_file(trial))
    if not text:
        return ""
    last_failure = text.rsplit("Failure # ", 1)[-1]
    lines = [line.strip() for line in last_failure.splitlines() if line.strip()]
    causes = [line for line in lines if EXCEPTION_LINE.match(line)]
    return (causes or lines or [""])[0][:300]


def collect_trials(folder: StorageFolder, metric_key: str, mode: str) -> list[TrialRow]:
    """Every trial of the sweep, ranked best first by ``metric_key``."""
    analysis = tune.ExperimentAnalysis(folder.path, storage_filesystem=tune_filesystem(folder))
    frames = analysis.trial_dataframes
    rows = []
    for trial in analysis.trials:
        result = trial.last_result or {}
        frame = frames.get(trial.trial_id)
        history = []
        if frame is not None and "timesteps" in frame:
            history = frame[["timesteps", "return_mean", "eval_return_mean"]].astype(float).to_dict("records")
            if "evaluated" in frame:  # the other results carry the latest evaluation forward
                for point, evaluated in zip(history, frame["evaluated"].astype(bool), strict=True):
                    if not evaluated:
                        point["eval_return_mean"] = math.nan
        ran_on = (
            list(frame["node_ip"]) if frame is not None and "node_ip" in frame else [result.get("node_ip")]
        )
        best = analysis.get_best_checkpoint(trial, metric_key, mode) if trial.checkpoint else None
        checkpoint = best or trial.checkpoint
        rows.append(
            TrialRow(
                trial=trial.trial_id,
                status=_status(trial),
                failures=int(trial.num_failures),
                values=dict(trial.config),
                score=number_or_nan(result.get(metric_key)),
                iterations=int(result.get("training_iteration", 0)),
                timesteps=int(result.get("timesteps", 0)),
                return_mean=number_or_nan(result.get("return_mean")),
                eval_return_mean=number_or_nan(result.get("eval_return_mean")),
                checkpoint=folder.display(checkpoint.path) if checkpoint else "",
                trial_dir=folder.display(str(trial.path or "")),
                error=_error_line(trial, folder) if trial.status == "ERROR" else "",
                nodes=" then ".join(dict.fromkeys(str(node) for node in ran_on if node)),
                history=history,
                fs_path=str(trial.path or ""),
            )
        )
    sign = 1.0 if mode == "max" else -1.0
    rows.sort(key=lambda r: (math.isfinite(r.score), sign * r.score if math.isfinite(r.score) else 0.0))
    rows.reverse()  # best first; trials without a score last
    for rank, row in enumerate(rows, start=1):
        row.rank = rank
    return rows


def write_results_csv(rows: list[TrialRow], keys: list[str], metric: str, out: Path) -> Path:
    fields = ["rank", "trial", "status", "failures", metric, "iterations", "timesteps", "return_mean",
              "eval_return_mean", *keys, "nodes", "checkpoint", "trial_dir", "error"]  # fmt: skip
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {
                    "rank": row.rank,
                    "trial": row.trial,
                    "status": row.status,
                    "failures": row.failures,
                    metric: row.score,
                    "iterations": row.iterations,
                    "timesteps": row.timesteps,
                    "return_mean": row.return_mean,
                    "eval_return_mean": row.eval_return_mean,
                    **{k: format_value(row.values.get(k)) for k in keys},
                    "nodes": row.nodes,
                    "checkpoint": row.checkpoint,
                    "trial_dir": row.trial_dir,
                    "error": row.error,
                }
            )
    return out


def write_best_experiment(
    experiment: ExperimentConfig, name: str, best: TrialRow, metric: str, out_dir: Path
) -> Path:
    """The best trial as a self-contained experiment file that ``rl_app train`` takes."""
    data = {k: v for k, v in experiment_dict(experiment).items() if k != "sweep"}
    data = with_values(data, best.values)
    sampled = ", ".join(f"{k}={format_value(v)}" for k, v in best.values.items())
    data["description"] = (
        f"Best trial {best.trial} of sweep {name} ({out_dir}): {metric} {best.score:.1f} "
        f"after {best.timesteps:,} timesteps with {sampled}. Best checkpoint: {best.checkpoint}"
    )
    path = out_dir / f"{name}_best.yaml"
    validate_experiment(data, str(path))
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_trial_experiments(
    experiment: ExperimentConfig, rows: list[TrialRow], folder: StorageFolder
) -> None:
    """Each trial folder's ``experiment.yaml``: what evaluate and export read for its checkpoints."""
    for row in rows:
        if row.fs_path:
            data = with_values(trial_data(experiment_dict(experiment)), row.values)
            folder.write_text(f"{row.fs_path}/experiment.yaml", yaml.safe_dump(data, sort_keys=False))
