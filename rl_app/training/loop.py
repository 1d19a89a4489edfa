"""The one training loop: step (an iteration -> metrics, stop rule), save and load a checkpoint.

``rl_app train`` (:mod:`rl_app.training.run`) and each sweep trial
(:mod:`rl_app.training.trial`) drive it, so a checkpoint, a resumed run and a restored
trial behave the same in both.
"""

from __future__ import annotations

import math
import pickle
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_app.config import ExperimentConfig
from rl_app.config.schema import StopSection
from rl_app.envs import flattened_observation_space
from rl_app.envs.multi_agent import multi_agent_section, multi_agent_setup
from rl_app.envs.spaces import flattened_description
from rl_app.runs.checkpoints import CheckpointInfo, installed_versions, read_info, write_marker
from rl_app.runs.progress import IterationMetrics
from rl_app.training.backends import Backend

LOOP_STATE = "rl_app_state.pkl"
LEGACY_RNG_STATE = "rng_state.pkl"  # what checkpoints of earlier versions hold instead


def stop_reason(stop: StopSection, metrics: IterationMetrics, evaluated: bool) -> str | None:
    """The first stop criterion of the experiment that ``metrics`` meets, if any.

    With evaluation on, the return criterion is judged on the evaluation return
    (deterministic episodes), not on the noisier training episodes.
    """
    judged, label = (
        (metrics.eval_return_mean, "evaluation") if evaluated else (metrics.return_mean, "training")
    )
    if stop.return_ is not None and judged >= stop.return_:
        return f"mean {label} return {judged:.1f} >= {stop.return_:g}"
    if stop.timesteps is not None and metrics.timesteps >= stop.timesteps:
        return f"timesteps {metrics.timesteps:,} >= {stop.timesteps:,}"
    if stop.iterations is not None and metrics.iteration >= stop.iterations:
        return f"iterations {metrics.iteration} >= {stop.iterations}"
    if stop.time_s is not None and metrics.elapsed_s >= stop.time_s:
        return f"time {metrics.elapsed_s:.0f}s >= {stop.time_s:g}s"
    return None


@dataclass
class Step:
    """One iteration: our metrics, the learner's whole result (for TensorBoard), the stop verdict."""

    metrics: IterationMetrics
    result: dict[str, Any]
    stop_reason: str | None
    notices: list[str]  # what the learner says about the iteration (env runners lost or back)


class TrainingLoop:
    """Trains ``backend`` one iteration at a time and saves or loads everything a resume needs."""

    def __init__(self, backend: Backend, experiment: ExperimentConfig, name: str) -> None:
        self.backend, self.experiment, self.name = backend, experiment, name
        self.iteration = 0
        self.timesteps = 0
        self.last: IterationMetrics | None = None
        self.latest_eval_return = math.nan  # the most recent evaluation, whichever iteration ran it
        self._elapsed_before = 0.0
        self._started = time.monotonic()

    @property
    def algo(self) -> Any:
        """The RLlib ``Algorithm`` being trained (RLlib learners only)."""
        return self.backend.algo  # type: ignore[attr-defined]

    @property
    def elapsed_s(self) -> float:
        """Training time of the whole run, earlier processes included."""
        return self._elapsed_before + time.monotonic() - self._started

    @property
    def evaluated(self) -> bool:
        return self.experiment.evaluation.interval > 0

    def step(self) -> Step:
        """Train one iteration; its metrics and whether a stop criterion is met."""
        metrics, result = self.backend.train(self.timesteps, self.elapsed_s)
        self.iteration, self.timesteps, self.last = metrics.iteration, metrics.timesteps, metrics
        if not math.isnan(metrics.eval_return_mean):
            self.latest_eval_return = metrics.eval_return_mean
        return Step(
            metrics,
            result,
            stop_reason(self.experiment.stop, metrics, self.evaluated),
            self.backend.notices(),
        )

    def evaluate(self) -> float:
        """Evaluate the current policy now, outside the schedule; its mean return."""
        self.latest_eval_return = self.backend.evaluate()
        return self.latest_eval_return

    def save(self, folder: Path) -> CheckpointInfo:
        """Write a checkpoint into ``folder``: RLlib's own (plus the replay buffer), our loop
        state (the driver's RNGs, the clock), and the marker, last."""
        last = self.last
        info = CheckpointInfo(
            iteration=self.iteration,
            timesteps=self.timesteps,
            return_mean=last.return_mean if last else math.nan,
            eval_return_mean=last.eval_return_mean if last else math.nan,
            algorithm=self.experiment.algorithm,
            env=self.experiment.env.id,
            experiment=self.name,
            replay_buffer=self.experiment.checkpoint.replay_buffer,
            versions=installed_versions(),
            **self._spaces(),
        )
        self.backend.save(folder, replay_buffer=info.replay_buffer)
        with (folder / LOOP_STATE).open("wb") as handle:
            pickle.dump(self._state(), handle)
        write_marker(folder, info)
        return info

    @property
    def policies(self) -> list[str]:
        """The policies of a multi-agent experiment, sorted (empty for one agent)."""
        return sorted(self._spaces().get("policies") or {})

    def _spaces(self) -> dict[str, Any]:
        """The marker's description of the observations: the env's, or each policy's (both read
        from an env made once per process)."""
        section = multi_agent_section(self.experiment)
        if section is None:
            return {"observation_space": flattened_observation_space(self.experiment.env)}
        spaces = multi_agent_setup(self.experiment.env, section).spaces
        return {"policies": {policy: flattened_description(obs) for policy, (obs, _) in spaces.items()}}

    def load(self, checkpoint: Path) -> CheckpointInfo:
        """Continue from ``checkpoint``: the algorithm and its replay buffer, fresh env-runner
        seeds (``seed + iteration``, so the episodes after it are not the first ones again),
        then the driver's RNGs, counters and clock as they were saved."""
        info = read_info(checkpoint)
        self.backend.restore(checkpoint)
        self.backend.reseed((self.experiment.seed or 0) + info.iteration)
        self.iteration, self.timesteps = info.iteration, info.timesteps
        state = _read_state(checkpoint)
        if "numpy" in state:
            import numpy as np
            import torch

            random.setstate(state["python"])
            np.random.set_state(state["numpy"])
            torch.set_rng_state(state["torch"])
        self._elapsed_before = float(state.get("elapsed_s", 0.0))
        self._started = time.monotonic()
        self.latest_eval_return = float(state.get("latest_eval_return", info.eval_return_mean))
        return info

    def _state(self) -> dict[str, Any]:
        import numpy as np
        import torch

        return {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "elapsed_s": self.elapsed_s,
            "latest_eval_return": self.latest_eval_return,
        }


def _read_state(checkpoint: Path) -> dict[str, Any]:
    for name in (LOOP_STATE, LEGACY_RNG_STATE):
        try:
            with (checkpoint / name).open("rb") as handle:
                state: dict[str, Any] = pickle.load(handle)
                return state
        except FileNotFoundError:
            continue
    return {}
