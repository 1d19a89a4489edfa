"""The algorithm registry: one entry per supported algorithm, with what rl_app offers it.

Adding an RLlib algorithm is one entry here (and, if its hyperparameters fit no existing training
section, a section in the schema); it then runs on RLlib's own classes throughout. Its
``accelerated`` parts, ``ortho_init`` and ``image_inputs`` are what rl_app adds where its code
supports them (rl_app/rllib/accel/, rl_app/rllib/catalog.py, rl_app/rllib/pixels.py; a test
checks each declared capability has its code). QLearning is the one algorithm RLlib does not run:
its backend is :mod:`rl_app.tabular`. This package imports neither Ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_app.config.schema import (
    APPOTraining,
    BCTraining,
    CQLTraining,
    DQNTraining,
    IMPALATraining,
    IQLTraining,
    MARWILTraining,
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
    # rl_app's faster parts it can use (rl_app.rllib.accel.PARTS); the plan picks those that apply.
    accelerated: frozenset[str] = frozenset()
    ortho_init: bool = False  # its model is PPO's catalog's: model.ortho_init applies
    image_inputs: bool = False  # rl_app has a module taking its image observations as they come
    offline: bool = False  # learns from recorded episodes (offline.input) through Ray Data, samples nothing


ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            "PPO", "ppo:PPOConfig", PPOTraining,
            accelerated=frozenset({"runner", "learner", "training_step"}), ortho_init=True, image_inputs=True,
        ),
        AlgorithmSpec(
            "APPO", "appo:APPOConfig", APPOTraining, asynchronous_sampling=True,
            accelerated=frozenset({"runner"}), ortho_init=True, image_inputs=True,
        ),
        AlgorithmSpec(
            "IMPALA", "impala:IMPALAConfig", IMPALATraining, asynchronous_sampling=True,
            accelerated=frozenset({"runner"}), ortho_init=True, image_inputs=True,
        ),
        AlgorithmSpec(
            "DQN", "dqn:DQNConfig", DQNTraining,
            accelerated=frozenset({"runner", "learner", "training_step", "replay_buffer"}), image_inputs=True,
        ),
        AlgorithmSpec(
            "SAC", "sac:SACConfig", SACTraining,
            accelerated=frozenset({"runner", "learner", "training_step", "replay_buffer", "module"}),
        ),
        AlgorithmSpec("BC", "bc:BCConfig", BCTraining, offline=True),
        AlgorithmSpec(
            "MARWIL", "marwil:MARWILConfig", MARWILTraining, offline=True, ortho_init=True, image_inputs=True,
        ),
        AlgorithmSpec("CQL", "cql:CQLConfig", CQLTraining, offline=True),
        AlgorithmSpec("IQL", "iql:IQLConfig", IQLTraining, offline=True),
        AlgorithmSpec("QLearning", "", QLearningTraining, backend="tabular"),
    )
}  # fmt: skip


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The registry entry of algorithm ``name`` (the schema has already checked it exists)."""
    return ALGORITHMS[name]
