"""A sweep's console: one line per trial event and a trial table every 15 s."""

from __future__ import annotations

import math
import time
from typing import Any

from ray import tune
from rich.console import Console

from rl_app.console.progress import format_value, sweep_console, trial_table


def error_file(trial: Any) -> str:
    """Tune's error.txt of ``trial`` in the sweep folder (not in Ray's session staging folder)."""
    return f"{trial.path}/error.txt"


class SweepProgress(tune.Callback):
    """A trial table every ``interval_s`` and one line per event (start, done, crash, error)."""

    def __init__(self, keys: list[str], interval_s: float = 15.0) -> None:
        self.keys = keys
        self.interval_s = interval_s
        self._last_table = 0.0

    @property
    def console(self) -> Console:
        return sweep_console()

    def _values(self, trial: Any) -> str:
        return ", ".join(f"{k}={format_value(trial.config.get(k))}" for k in self.keys)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.console.print(f"trial {trial.trial_id} started: {self._values(trial)}")

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        if time.monotonic() - self._last_table >= self.interval_s:
            done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)
            running = sum(t.status == "RUNNING" for t in trials)
            title = f"trials: {done}/{len(trials)} done, {running} running"
            self.console.print(trial_table(title, [live_row(t) for t in trials], self.keys))
            self._last_table = time.monotonic()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        how = result.get("stop_reason") or "stopped early by the scheduler"
        self.console.print(
            f"trial {trial.trial_id} done after {result.get('training_iteration', 0)} iterations, "
            f"{result.get('timesteps', 0):,} timesteps: {how}"
        )

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.console.print(
            f"[yellow]trial {trial.trial_id} crashed[/yellow] (failure {trial.num_failures}), "
            f"retrying from its last checkpoint; details in {error_file(trial)}"
        )

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.console.print(
            f"[red]trial {trial.trial_id} errored[/red] after {trial.num_failures} failure(s); "
            f"details in {error_file(trial)}"
        )


def live_row(trial: Any) -> dict[str, Any]:
    result = trial.last_result or {}
    return {
        "trial": trial.trial_id.rsplit("_", 1)[-1],
        "status": trial.status.lower(),
        "crashes": trial.num_failures,
        "iter": result.get("training_iteration", ""),
        "timesteps": result.get("timesteps", ""),
        "return": result.get("return_mean", math.nan),
        "eval_return": result.get("eval_return_mean", math.nan),
        "values": trial.config,
    }
