"""Our per-iteration numbers, read from an RLlib ``Algorithm.train()`` result by RLlib's own keys."""

from __future__ import annotations

from typing import Any

from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EPISODE_LEN_MEAN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    EVALUATION_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES_LIFETIME,
)
from ray.tune.result import TIME_THIS_ITER_S, TRAINING_ITERATION

from rl_app.runs.progress import IterationMetrics, number_or_nan


def metrics_from_result(
    result: dict[str, Any], previous_timesteps: int, elapsed_s: float
) -> IterationMetrics:
    """Pick our reported numbers out of one RLlib ``Algorithm.train()`` result."""
    runners = result.get(ENV_RUNNER_RESULTS, {})
    evaluation = result.get(EVALUATION_RESULTS, {}).get(ENV_RUNNER_RESULTS, {})
    timesteps = int(
        result.get(NUM_ENV_STEPS_SAMPLED_LIFETIME) or runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME) or 0
    )
    iteration_s = float(result.get(TIME_THIS_ITER_S) or 0.0)
    return IterationMetrics(
        iteration=int(result[TRAINING_ITERATION]),
        timesteps=timesteps,
        episodes=int(runners.get(NUM_EPISODES_LIFETIME) or 0),
        return_mean=number_or_nan(runners.get(EPISODE_RETURN_MEAN)),
        return_min=number_or_nan(runners.get(EPISODE_RETURN_MIN)),
        return_max=number_or_nan(runners.get(EPISODE_RETURN_MAX)),
        episode_len_mean=number_or_nan(runners.get(EPISODE_LEN_MEAN)),
        eval_return_mean=number_or_nan(evaluation.get(EPISODE_RETURN_MEAN)),
        steps_per_s=(timesteps - previous_timesteps) / iteration_s if iteration_s > 0 else 0.0,
        iteration_s=iteration_s,
        elapsed_s=elapsed_s,
    )
