"""A sweep in MLflow: a parent run for the sweep, a child run per trial, logged from the sweep's driver.

Tune pickles its callbacks into the sweep state and unpickles them on ``sweep --resume``, so the
callback holds only the sweep folder's name and finds the live :class:`SweepTracking` by it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ray import tune

from rl_app.runs.files import read_json
from rl_app.runs.progress import CSV_FIELDS
from rl_app.tracking.logger import MlflowLog, RunOpening, finite_numbers, flat_params
from rl_app.tracking.run import record_run_id, recorded_run_id
from rl_app.tracking.target import TrackingTarget

SWEEP_KEY = "sweep"
_LIVE: dict[str, SweepTracking] = {}


class SweepTracking:
    """The sweep's parent MLflow run (its id kept in ``sweep.json``) and its trials' child runs."""

    def __init__(
        self,
        target: TrackingTarget,
        sweep_file: Path,
        name: str,
        experiment: Mapping[str, Any],
        warn: Callable[[str], None],
    ) -> None:
        self.target, self.sweep_file, self.experiment = target, sweep_file, experiment
        self.folder = str(sweep_file.parent.resolve())
        meta = read_json(sweep_file)
        self.log = MlflowLog(target, warn, on_open=self._opened)
        self.log.open_run(
            SWEEP_KEY,
            RunOpening(
                run_name=f"{name}/{sweep_file.parent.name}",
                tags={
                    "rl_app.experiment": name,
                    "rl_app.sweep_dir": self.folder,
                    "mlflow.source.name": "rl_app sweep",
                    **{f"version.{k}": str(v) for k, v in (meta.get("versions") or {}).items()},
                },
                params=flat_params(experiment),
                run_id=recorded_run_id(meta, target),
            ),
        )
        _LIVE[self.folder] = self

    def callback(self) -> TrialTracking:
        return TrialTracking(self.folder)

    def _opened(self, key: str, run_id: str, experiment_id: str) -> None:
        if key == SWEEP_KEY:
            record_run_id(self.sweep_file, self.target, run_id, experiment_id)

    def trial_started(self, trial_id: str, sampled: Mapping[str, Any]) -> None:
        if trial_id in self.log.run_ids:  # PBT's restarts, a retried trial: the same run goes on
            return
        self.log.open_run(
            trial_id,
            RunOpening(
                run_name=f"trial_{trial_id}",
                tags={"rl_app.sweep_dir": self.folder, "rl_app.trial_id": trial_id},
                params={**flat_params(self.experiment), **flat_params(sampled)},
                parent=SWEEP_KEY,
                find_by_tags={"rl_app.sweep_dir": self.folder, "rl_app.trial_id": trial_id},
            ),
        )

    def trial_result(self, trial_id: str, result: Mapping[str, Any]) -> None:
        values = {k: result[k] for k in CSV_FIELDS if k in result}
        values["iteration"] = result.get("training_iteration")
        self.log.log_metrics(trial_id, int(result.get("timesteps", 0)), finite_numbers(values))

    def trial_ended(self, trial_id: str, status: str) -> None:
        self.log.close_run(trial_id, status)

    def finish(self, status: str, files: Iterable[Path]) -> list[str]:
        """The sweep's results logged to the parent run and the run ended; what was not logged."""
        _LIVE.pop(self.folder, None)
        self.log.log_artifacts(SWEEP_KEY, files)
        self.log.close_run(SWEEP_KEY, status)
        return self.log.close()

    @property
    def run_id(self) -> str | None:
        return self.log.run_ids.get(SWEEP_KEY)


class TrialTracking(tune.Callback):
    """Tune's side: each trial's start, results and end, handed to the live sweep tracking."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def _live(self) -> SweepTracking | None:
        return _LIVE.get(self.folder)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if (live := self._live()) is not None:
            live.trial_started(trial.trial_id, trial.config)

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        if (live := self._live()) is not None:
            live.trial_result(trial.trial_id, result)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if (live := self._live()) is not None:
            live.trial_ended(trial.trial_id, "finished")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if (live := self._live()) is not None:
            live.trial_ended(trial.trial_id, "failed")
