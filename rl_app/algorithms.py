"""The algorithm registry: one entry per supported RLlib algorithm.

Adding an algorithm (IMPALA, APPO, ...) is one entry here; if its hyperparameters
are not covered by an existing training section, add a section to the schema.
This module imports neither Ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_app.config.schema import DQNTraining, PPOTraining, SACTraining, TrainingSection


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config_class: str  # "module:Class" of the RLlib AlgorithmConfig subclass
    training: type[TrainingSection]
    off_policy: bool = False
    # Samples while the learner updates (APPO); synchronous ones alternate the two.
    asynchronous_sampling: bool = False


ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec("PPO", "ray.rllib.algorithms.ppo:PPOConfig", PPOTraining),
        AlgorithmSpec(
            "APPO", "ray.rllib.algorithms.appo:APPOConfig", PPOTraining, asynchronous_sampling=True
        ),
        AlgorithmSpec("DQN", "ray.rllib.algorithms.dqn:DQNConfig", DQNTraining, off_policy=True),
        AlgorithmSpec("SAC", "ray.rllib.algorithms.sac:SACConfig", SACTraining, off_policy=True),
    )
}
