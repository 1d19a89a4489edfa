"""The MLflow run of one run folder: opened or continued when training starts, one metrics row per
iteration, the run's files at its end; its id kept in ``metadata.json``.

``rl_app track RUN`` sends a run folder after the fact (what the server lacks), which is also how a
run whose server was down catches up.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_app.console.telemetry import flatten_numbers
from rl_app.runs.files import read_json, write_json
from rl_app.tracking.logger import MlflowLog, RunOpening, finite_numbers, flat_params
from rl_app.tracking.target import TrackingTarget

if TYPE_CHECKING:
    from rich.console import Console

RUN_KEY = "run"
ARTIFACTS = ("experiment.yaml", "config.yaml", "summary.json", "progress.csv", "reward_curve.png", "export")
METADATA_KEY = "mlflow"


def recorded_run_id(meta: Mapping[str, Any], target: TrackingTarget) -> str | None:
    """The MLflow run a metadata file (metadata.json, sweep.json) names, when it is on ``target``."""
    recorded = meta.get(METADATA_KEY) or {}
    return recorded.get("run_id") if recorded.get("uri") == target.uri else None


def record_run_id(meta_file: Path, target: TrackingTarget, run_id: str, experiment_id: str) -> None:
    """Keep the MLflow run's place in ``meta_file``: a resume or ``rl_app track`` continues it."""
    meta = read_json(meta_file)
    meta[METADATA_KEY] = {**target.as_dict(), "experiment_id": experiment_id, "run_id": run_id}
    write_json(meta_file, meta)


def run_tags(meta: Mapping[str, Any], run_dir: Path) -> dict[str, str]:
    """What identifies a run in MLflow: experiment, folder, seed, host, git revision, versions."""
    tags = {
        "rl_app.experiment": str(meta.get("experiment", run_dir.parent.name)),
        "rl_app.run_dir": str(run_dir.resolve()),
        "seed": str(meta.get("seed")),
        "host": str(meta.get("hostname", "")),
        "mlflow.source.name": "rl_app",
        "mlflow.user": getpass.getuser(),
    }
    if meta.get("git_revision"):
        tags["mlflow.source.git.commit"] = str(meta["git_revision"])
    tags.update({f"version.{name}": str(v) for name, v in (meta.get("versions") or {}).items()})
    return tags


def iteration_values(metrics: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, float]:
    """An iteration's metrics: the progress.csv columns and the learners' numbers (losses, entropy,
    gradient norms, learning rates) as ``learners/<module>/<name>``."""
    values = finite_numbers(metrics)
    values.update(finite_numbers(flatten_numbers(dict(result.get("learners") or {}), "learners/")))
    return values


def progress_rows(rows: Iterable[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """progress.csv rows (as text or numbers) as (timesteps, finite numbers)."""
    kept = []
    for row in rows:
        numbers = {k: float(v) for k, v in row.items() if v not in ("", None)}
        kept.append((int(numbers["timesteps"]), finite_numbers(numbers)))
    return kept


class RunTracking:
    """The MLflow run of ``run_dir`` (its metadata.json written): opened now, logged to from a thread."""

    def __init__(
        self,
        target: TrackingTarget,
        run_dir: Path,
        warn: Callable[[str], None],
        earlier_rows: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        from rl_app.config.loader import read_yaml

        self.target, self.run_dir = target, run_dir
        meta = read_json(run_dir / "metadata.json")
        self.log = MlflowLog(target, warn, on_open=self._opened)
        self.log.open_run(
            RUN_KEY,
            RunOpening(
                run_name=f"{meta.get('experiment', run_dir.parent.name)}/{run_dir.name}",
                tags=run_tags(meta, run_dir),
                params=flat_params(read_yaml(run_dir / "experiment.yaml")),
                run_id=recorded_run_id(meta, target),
                backfill=progress_rows(earlier_rows),
            ),
        )

    def _opened(self, key: str, run_id: str, experiment_id: str) -> None:
        record_run_id(self.run_dir / "metadata.json", self.target, run_id, experiment_id)

    def iteration(self, step: int, metrics: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        self.log.log_metrics(RUN_KEY, step, iteration_values(metrics, result))

    def finish(self, status: str | None, wait_s: float = 30.0) -> list[str]:
        """The run's files logged and the run ended as ``status`` (None: left running); what was
        not logged, one line each."""
        self.log.log_artifacts(RUN_KEY, (self.run_dir / name for name in ARTIFACTS))
        if status is not None:
            self.log.close_run(RUN_KEY, status)
        return self.log.close(wait_s)

    @property
    def run_id(self) -> str | None:
        return self.log.run_ids.get(RUN_KEY)


def track_run(run_dir: Path, tracking_uri: str | None, console: Console | None = None) -> int:
    """``rl_app track RUN``: the run folder sent to MLflow; exit code 1 when some of it was not."""
    from rl_app.config import validate_experiment
    from rl_app.config.loader import read_yaml
    from rl_app.console.tables import output_console, warner
    from rl_app.errors import UserError
    from rl_app.runs.layout import EXPERIMENT_FILE, is_run_dir
    from rl_app.tracking.target import tracking_target

    if not is_run_dir(run_dir):
        raise UserError(f"'{run_dir}' is not a run folder (no metadata.json)")
    console = console or output_console()
    meta = read_json(run_dir / "metadata.json")
    source = str(run_dir / EXPERIMENT_FILE)
    experiment = validate_experiment(read_yaml(run_dir / EXPERIMENT_FILE), source)
    target = tracking_target(
        experiment,
        str(meta.get("experiment", run_dir.parent.name)),
        track=True,
        uri=tracking_uri,
        runs_root=run_dir.parent.parent,
        recorded=meta.get(METADATA_KEY),
    )
    assert target is not None  # track=True always names one
    run_id, unsent = track_run_folder(run_dir, target, warner(console))
    for line in unsent:
        warner(console)(line)
    if run_id is not None:
        console.print(f"MLflow run {run_id} in {target.describe()}")
    return 1 if unsent else 0


def track_run_folder(
    run_dir: Path, target: TrackingTarget, warn: Callable[[str], None]
) -> tuple[str | None, list[str]]:
    """Send ``run_dir`` to MLflow: params and tags, every progress row the run lacks, the files;
    the MLflow run id and what could not be logged."""
    from rl_app.runs.layout import run_status
    from rl_app.runs.progress import read_progress

    progress = run_dir / "progress.csv"
    tracking = RunTracking(target, run_dir, warn, read_progress(progress) if progress.is_file() else [])
    status = run_status(run_dir)
    unsent = tracking.finish(status if status in ("finished", "interrupted", "failed") else None)
    return tracking.run_id, unsent
