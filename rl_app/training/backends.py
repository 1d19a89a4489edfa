"""The training loop's backends: an RLlib ``Algorithm`` (:class:`AlgorithmBackend`), or the tabular
Q-learning baseline (:class:`TabularBackend`), behind one small interface (train an iteration,
evaluate, save, restore, reseed, warm start)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from rl_app.algorithms import algorithm_spec
from rl_app.cluster.resources import ResourcePlan
from rl_app.config import ExperimentConfig
from rl_app.errors import EnvRunnersLostError, UserError
from rl_app.runs.progress import IterationMetrics


class Backend(Protocol):
    def train(self, previous_timesteps: int, elapsed_s: float) -> tuple[IterationMetrics, dict[str, Any]]:
        """One iteration: our metrics and the whole result (for TensorBoard)."""
        ...

    def evaluate(self) -> float: ...

    def save(self, folder: Path, replay_buffer: bool) -> None: ...

    def restore(self, checkpoint: Path) -> None: ...

    def reseed(self, seed: int) -> None: ...

    def warm_start(self, checkpoint: Path) -> None: ...

    def notices(self) -> list[str]:
        """What the last iteration has to tell the user beyond its metrics (runners lost or back)."""
        ...

    def stop(self) -> None: ...


class AlgorithmBackend:
    """An RLlib ``Algorithm`` (kept as ``algo``), through the functions of :mod:`rl_app.rllib`."""

    def __init__(self, algo: Any, evaluation_interval: int, max_runner_restarts: int) -> None:
        from rl_app.rllib.runners import RunnerWatch

        self.algo, self.evaluation_interval = algo, evaluation_interval
        self.max_runner_restarts = max_runner_restarts
        self.runners = RunnerWatch(algo.env_runner_group)
        self.evaluation_runners = RunnerWatch(algo.eval_env_runner_group, "evaluation runner")
        self._notices: list[str] = []

    def train(self, previous_timesteps: int, elapsed_s: float) -> tuple[IterationMetrics, dict[str, Any]]:
        from rl_app.rllib.results import metrics_from_result

        self._stop_if_runners_lost()
        self.runners.wait_for_one()
        result = self.algo.train()
        metrics = metrics_from_result(result, previous_timesteps, elapsed_s, self.evaluation_interval)
        group = self.algo.env_runner_group  # None for the offline algorithms: they sample nothing
        metrics.runner_restarts = float(group.num_remote_worker_restarts()) if group is not None else 0.0
        changes = [watch.look() for watch in (self.runners, self.evaluation_runners)]
        self._notices = [line for change in changes if change for line in change.describe()]
        if self.runners.total:
            metrics.runners_alive = float(self.runners.alive)
        return metrics, result

    def notices(self) -> list[str]:
        return self._notices

    def _stop_if_runners_lost(self) -> None:
        """Stop before the next iteration once remote runners crashed more than the limit allows.

        Crashes are RLlib's restarts plus the runners still down. Ray's per-actor restart limit
        (which RLlib sets to the same number) would let each runner crash that often; the limit
        is for the run, and without this check RLlib would go on sampling from what is left.
        """
        group = self.algo.env_runner_group
        if group is None:
            return
        down = group.num_remote_workers() - group.num_healthy_remote_workers()
        crashes = group.num_remote_worker_restarts() + down
        if down and crashes > self.max_runner_restarts:
            raise EnvRunnersLostError(
                f"env runners crashed {crashes} times, more than env_runners.max_restarts="
                f"{self.max_runner_restarts} allows ({down} of {group.num_remote_workers()} down); "
                "the run stops at its last complete iteration, saved as the final checkpoint"
            )

    def evaluate(self) -> float:
        from rl_app.rllib.results import evaluation_return

        return evaluation_return(self.algo.evaluate())

    def save(self, folder: Path, replay_buffer: bool) -> None:
        from rl_app.rllib.algorithm import save_algorithm

        save_algorithm(self.algo, folder, replay_buffer=replay_buffer)

    def restore(self, checkpoint: Path) -> None:
        from rl_app.rllib.algorithm import restore_algorithm

        restore_algorithm(self.algo, checkpoint)

    def reseed(self, seed: int) -> None:
        from rl_app.rllib.algorithm import reseed_env_runners

        reseed_env_runners(self.algo, seed)

    def warm_start(self, checkpoint: Path) -> None:
        from rl_app.rllib.algorithm import warm_start

        warm_start(self.algo, checkpoint)

    def stop(self) -> None:
        self.algo.stop()


class TabularBackend:
    """The tabular Q-learning baseline; it evaluates on the experiment's schedule itself."""

    def __init__(self, experiment: ExperimentConfig, source: str) -> None:
        from rl_app.tabular.qlearning import TabularQLearning

        self.experiment = experiment
        self.qlearning = TabularQLearning(experiment, source)

    def train(self, previous_timesteps: int, elapsed_s: float) -> tuple[IterationMetrics, dict[str, Any]]:
        metrics = replace(self.qlearning.train(), elapsed_s=elapsed_s, evaluation_s=0.0)
        interval = self.experiment.evaluation.interval
        if interval and metrics.iteration % interval == 0:
            began = time.perf_counter()
            eval_return = self.evaluate()
            evaluation_s = time.perf_counter() - began
            metrics = replace(
                metrics,
                eval_return_mean=eval_return,
                evaluation_s=evaluation_s,
                iteration_s=metrics.iteration_s + evaluation_s,
            )
        numbers = {key: value for key, value in metrics.values().items() if not math.isnan(value)}
        return metrics, {
            "tabular": {**numbers, "epsilon": self._epsilon(), "states_visited": self._visited()}
        }

    def _epsilon(self) -> float:
        from rl_app.tabular.qlearning import epsilon_at

        return epsilon_at(self.qlearning.training.epsilon, self.qlearning.counters.timesteps)

    def _visited(self) -> int:
        return int((self.qlearning.q_table != 0).any(axis=1).sum())

    def evaluate(self) -> float:
        # Evaluation episodes are seeded apart from training's, as RLlib's evaluation runners are.
        seed = (self.experiment.seed or 0) + 1_000_000
        return self.qlearning.evaluate(self.experiment.evaluation.episodes, seed)

    def save(self, folder: Path, replay_buffer: bool) -> None:
        self.qlearning.save(folder)

    def restore(self, checkpoint: Path) -> None:
        self.qlearning.restore(checkpoint)

    def reseed(self, seed: int) -> None:
        self.qlearning.reseed(seed)

    def warm_start(self, checkpoint: Path) -> None:
        self.qlearning.load_table(checkpoint)  # the table only: the counters start fresh

    def notices(self) -> list[str]:
        return []

    def stop(self) -> None:
        self.qlearning.close()


def prepare_backend(
    experiment: ExperimentConfig, plan: ResourcePlan, source: str
) -> tuple[dict[str, Any], Callable[[], Backend]]:
    """The experiment's settings with defaults filled in, and a function building its backend.

    Everything that can reject the experiment (RLlib's validation, the tabular checks of spaces
    and bins) runs here, before a run folder is written.
    """
    if algorithm_spec(experiment.algorithm).backend == "tabular":
        learner = TabularBackend(experiment, source)
        settings = experiment.model_dump(mode="json", by_alias=True, exclude={"extends"})
        return settings, lambda: learner
    from rl_app.rllib.algorithm import build_algorithm
    from rl_app.rllib.config import algorithm_config, resolved_settings

    config = algorithm_config(experiment, plan, source)
    interval, max_restarts = experiment.evaluation.interval, experiment.env_runners.max_restarts
    return resolved_settings(experiment, config, plan), lambda: AlgorithmBackend(
        build_algorithm(config), interval, max_restarts
    )


def require_rllib(experiment: ExperimentConfig, what: str) -> None:
    """A one-line error for the commands the tabular baseline does not take."""
    if algorithm_spec(experiment.algorithm).backend != "rllib":
        raise UserError(f"{what} runs RLlib algorithms; {experiment.algorithm} is the tabular baseline")
