"""One sweep trial: a Ray Tune ``Trainable`` that trains an experiment with sampled values.

A trial is exactly ``rl_app train`` with overrides: the sampled values are set into
the experiment, validated by our schema, mapped onto RLlib's config by the same
adapter, and judged by the same stop rules. Its checkpoints are RLlib's own plus
our marker, so ``rl_app evaluate``/``export``/``train --init-from`` take them.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ray import tune

from rl_app.checkpoints import checkpoint_info, read_info, restore_algorithm, write_checkpoint
from rl_app.resources import ResourcePlan

TRIAL_STATE = "trial_state.json"

# The keys every trial result carries; the sweep metric is one of them.
METRIC_KEYS = {"return": "return_mean", "eval_return": "eval_return_mean"}
TIME_ATTRS = {"timesteps": "timesteps", "iterations": "training_iteration"}


def trial_experiment(data: dict[str, Any], values: dict[str, Any], source: str) -> Any:
    """The validated experiment of one trial: ``data`` with the sampled ``values`` set."""
    from rl_app.config.loader import validate_experiment, with_values

    return validate_experiment(with_values(data, values), source)


class ExperimentTrial(tune.Trainable):
    """Trains ``experiment`` (plain data, no sweep section) with Tune's sampled ``config`` set into it."""

    def setup(  # type: ignore[override]
        self, config: dict[str, Any], *, experiment: dict[str, Any], name: str, plan: ResourcePlan
    ) -> None:
        from rl_app.ray_session import quiet_libraries
        from rl_app.rllib_adapter import build_algorithm, build_algorithm_config

        quiet_libraries()
        self.name = name
        self.experiment = trial_experiment(experiment, config, f"sweep trial {self.trial_id}")
        self.algo = build_algorithm(build_algorithm_config(self.experiment, plan, name))
        self.timesteps = 0
        self.elapsed_before = 0.0
        self.started = time.monotonic()
        self.last_return = math.nan
        self.last_eval = math.nan

    def step(self) -> dict[str, Any]:
        from rl_app.train import metrics_from_result, stop_reason

        elapsed = self.elapsed_before + time.monotonic() - self.started
        metrics = metrics_from_result(self.algo.train(), self.timesteps, elapsed)
        self.timesteps = metrics.timesteps
        evaluated = self.experiment.evaluation.interval > 0
        reason = stop_reason(self.experiment.stop, metrics, evaluated)
        self.last_return = metrics.return_mean
        if not math.isnan(metrics.eval_return_mean):
            self.last_eval = metrics.eval_return_mean
        result = asdict(metrics)
        del result["iteration"]  # Tune counts training_iteration itself
        # Schedulers need the metric in every result: the latest evaluation until the next one.
        result["eval_return_mean"] = self.last_eval
        if reason is not None:
            result["stop_reason"] = reason
            result["done"] = True
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        folder = Path(checkpoint_dir)
        info = checkpoint_info(
            self.experiment,
            self.name,
            iteration=self.iteration,
            timesteps=self.timesteps,
            return_mean=self.last_return,
            eval_return_mean=self.last_eval,
        )
        elapsed = self.elapsed_before + time.monotonic() - self.started
        state = {"elapsed_s": elapsed, "last_return": self.last_return, "last_eval": self.last_eval}

        def write_state(folder: Path) -> None:
            (folder / TRIAL_STATE).write_text(json.dumps(state))

        write_checkpoint(self.algo, folder, info, extra=write_state)
        # Returning None makes Tune hand load_checkpoint() the folder itself.

    def load_checkpoint(self, checkpoint: str) -> None:  # type: ignore[override]
        folder = Path(checkpoint)
        restore_algorithm(self.algo, folder)
        self.timesteps = read_info(folder).timesteps
        state = json.loads((folder / TRIAL_STATE).read_text())
        self.elapsed_before = state["elapsed_s"]
        self.last_return, self.last_eval = state["last_return"], state["last_eval"]
        self.started = time.monotonic()

    def cleanup(self) -> None:
        self.algo.stop()
