"""Our per-iteration numbers, read from an RLlib ``Algorithm.train()`` result by RLlib's own keys."""

from __future__ import annotations

import math
import time
from typing import Any

from ray.rllib.env.env_runner import NUM_ENV_STEP_FAILURES_LIFETIME
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    EPISODE_LEN_MEAN,
    EPISODE_MODULE_RETURN_MEAN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    EVALUATION_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_EPISODES_LIFETIME,
)
from ray.tune.result import TIME_THIS_ITER_S, TRAINING_ITERATION

from rl_app.rllib.self_play import REFRESHED
from rl_app.runs.progress import IterationMetrics, number_or_nan

# Our key in RLlib's evaluation results: the seconds its evaluation episodes took.
EVALUATION_SECONDS = "evaluation_s"


class EvaluationClock:
    """Times each ``Algorithm.evaluate()`` from its ``on_evaluate_start`` callback to its
    ``on_evaluate_end`` (the episodes and their metrics; the weights and filter statistics sent to
    the evaluation runners before are not counted) and adds the seconds to its results, which
    ``on_evaluate_end`` may extend, so that an iteration's evaluation cost is told apart from its
    training's."""

    def __init__(self) -> None:
        self.began: float | None = None

    def start(self, **_: Any) -> None:
        self.began = time.perf_counter()

    def end(self, *, evaluation_metrics: dict[str, Any], **_: Any) -> None:
        if self.began is not None:
            evaluation_metrics[EVALUATION_SECONDS] = time.perf_counter() - self.began
            self.began = None


def evaluated_this_iteration(iteration: int, evaluation_interval: int) -> bool:
    """Whether RLlib evaluated in ``iteration``: every ``evaluation_interval`` iterations, as
    ``Algorithm.step`` decides. Its results keep the last evaluation's numbers on the
    iterations between, so they alone cannot tell."""
    return bool(evaluation_interval) and iteration % evaluation_interval == 0


def evaluation_return(result: dict[str, Any]) -> float:
    """The mean episode return of an evaluation result (``Algorithm.evaluate()`` or train's)."""
    evaluation = result.get(EVALUATION_RESULTS, result).get(ENV_RUNNER_RESULTS, {})
    return number_or_nan(evaluation.get(EPISODE_RETURN_MEAN))


def policy_returns(result: dict[str, Any]) -> dict[str, float]:
    """Each policy's mean episode return in an env runners' result (several agents; else empty)."""
    found = result.get(ENV_RUNNER_RESULTS, {}).get(EPISODE_MODULE_RETURN_MEAN) or {}
    return {str(policy): number_or_nan(value) for policy, value in sorted(found.items())}


def metrics_from_result(
    result: dict[str, Any], previous_timesteps: int, elapsed_s: float, evaluation_interval: int = 0
) -> IterationMetrics:
    """Pick our reported numbers out of one RLlib ``Algorithm.train()`` result; the evaluation
    return only on an iteration that evaluated (NaN on the others)."""
    runners = result.get(ENV_RUNNER_RESULTS, {})
    iteration = int(result[TRAINING_ITERATION])
    # Offline algorithms sample nothing: their steps are the recorded ones trained on.
    trained = result.get(LEARNER_RESULTS, {}).get(ALL_MODULES, {}).get(NUM_ENV_STEPS_TRAINED_LIFETIME)
    timesteps = int(
        result.get(NUM_ENV_STEPS_SAMPLED_LIFETIME)
        or runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME)
        or trained
        or 0
    )
    iteration_s = float(result.get(TIME_THIS_ITER_S) or 0.0)
    evaluated = evaluated_this_iteration(iteration, evaluation_interval)
    evaluation_s = result.get(EVALUATION_RESULTS, {}).get(EVALUATION_SECONDS) if evaluated else 0.0
    return IterationMetrics(
        iteration=iteration,
        timesteps=timesteps,
        episodes=int(runners.get(NUM_EPISODES_LIFETIME) or 0),
        return_mean=number_or_nan(runners.get(EPISODE_RETURN_MEAN)),
        return_min=number_or_nan(runners.get(EPISODE_RETURN_MIN)),
        return_max=number_or_nan(runners.get(EPISODE_RETURN_MAX)),
        episode_len_mean=number_or_nan(runners.get(EPISODE_LEN_MEAN)),
        eval_return_mean=evaluation_return(result) if evaluated else math.nan,
        steps_per_s=(timesteps - previous_timesteps) / iteration_s if iteration_s > 0 else 0.0,
        iteration_s=iteration_s,
        evaluation_s=number_or_nan(evaluation_s),
        elapsed_s=elapsed_s,
        env_failures=float(runners.get(NUM_ENV_STEP_FAILURES_LIFETIME) or 0),
        policy_returns=policy_returns(result),
        eval_policy_returns=policy_returns(result.get(EVALUATION_RESULTS, {})) if evaluated else {},
        notes=["self-play: the opponent now plays as the learner"] if result.get(REFRESHED) else [],
    )
