"""Self-play: the opponent is a frozen copy of the learner, refreshed when the learner beats it.

Runs as RLlib's ``on_train_result`` callback on the driver, through public names only: the
learner group's ``get_weights`` (the learner's whole module; the env runners' may be inference-only)
and ``Algorithm.set_state``, which also sends the new weights to every env runner.
"""

from __future__ import annotations

import math
from typing import Any

from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EPISODE_MODULE_RETURN_MEAN

# Where an iteration's result says whether the opponent was refreshed (read by rl_app.rllib.results).
REFRESHED = "opponent_refreshed"


class RefreshOpponent:
    """``on_train_result``: copy ``learner``'s weights into ``opponent`` once the learner's mean
    episode return over the iteration reaches ``refresh_return``."""

    def __init__(self, learner: str, opponent: str, refresh_return: float) -> None:
        self.learner, self.opponent, self.refresh_return = learner, opponent, refresh_return

    def __call__(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        returns = result.get(ENV_RUNNER_RESULTS, {}).get(EPISODE_MODULE_RETURN_MEAN) or {}
        learner_return = returns.get(self.learner, math.nan)
        result[REFRESHED] = bool(learner_return >= self.refresh_return)
        if result[REFRESHED]:
            copy_module(algorithm, self.learner, self.opponent)


def copy_module(algorithm: Any, source: str, target: str) -> None:
    """Give module ``target`` the weights of module ``source``, in the learner and the env runners."""
    weights = algorithm.learner_group.get_weights(module_ids=[source])[source]
    state = {COMPONENT_LEARNER_GROUP: {COMPONENT_LEARNER: {COMPONENT_RL_MODULE: {target: weights}}}}
    algorithm.set_state(state)
