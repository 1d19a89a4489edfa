"""The algorithm registry: one entry per supported algorithm.

Adding an RLlib algorithm (IMPALA, ...) is one entry here; if its hyperparameters are
not covered by an existing training section, add a section to the schema. QLearning is the
one algorithm RLlib does not run: its backend is :mod:`rl_app.tabular`.
This package imports neither Ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_app.config.schema import (
    APPOTraining,
    DQNTraining,
    IMPALATraining,
    PPOTraining,
    QLearningTraining,
    SACTraining,
    Section,
)


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    # "module:Class" of its AlgorithmConfig in RLlib's algorithms package (see rl_app/rllib/config.py).
    rllib_config: str
    training: type[Section]
    # Samples while the learner updates (IMPALA, APPO); synchronous ones alternate the two.
    asynchronous_sampling: bool = False
    backend: Literal["rllib", "tabular"] = "rllib"


ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec("PPO", "ppo:PPOConfig", PPOTraining),
        AlgorithmSpec("APPO", "appo:APPOConfig", APPOTraining, asynchronous_sampling=True),
        AlgorithmSpec("IMPALA", "impala:IMPALAConfig", IMPALATraining, asynchronous_sampling=True),
        AlgorithmSpec("DQN", "dqn:DQNConfig", DQNTraining),
        AlgorithmSpec("SAC", "sac:SACConfig", SACTraining),
        AlgorithmSpec("QLearning", "", QLearningTraining, backend="tabular"),
    )
}


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The registry entry of algorithm ``name`` (the schema has already checked it exists)."""
    return ALGORITHMS[name]
