"""rl_app's faster replacements for parts of RLlib 2.60, and the one plan that decides which run.

The parts, each proven equal to the RLlib path it replaces by tests (docs/internals.md says how
each works, bench/README.md what each saves):

- ``runner``: sampling with one forward pass and one env step per vector step, episodes made from
  the call's step arrays (or transitions handed straight to a replay buffer), ``runner.py``;
- ``learner``: the torch learners' gradient step in a few multi-tensor ops, ``learners.py``;
- ``training_step``: PPO's weights copied in place when runner and learner share the driver
  (``driver.py``); DQN's and SAC's rounds run inside the learner's process (``offpolicy.py``);
- ``replay_buffer``: RLlib's prioritized episode buffer as flat arrays, ``offpolicy.py``;
- ``module``: SAC's concatenated critic's training pass without distribution objects
  (``rl_app/rllib/catalog.py``).

An algorithm's registry entry (``rl_app.algorithms``) names the parts it can use;
:func:`plan_acceleration` decides, once per experiment, which of them apply and why the others do
not. The plan is printed on the Resources line and written to metadata.json. Everything is off
with ``acceleration: off`` in the experiment, ``RL_APP_ACCELERATION=off``, on a Ray other than
:data:`SUPPORTED_RAY`, or when :mod:`rl_app.rllib.accel.adapter` finds RLlib's insides changed: the
run then uses RLlib's own env runner, learner, training step and buffer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rl_app.algorithms import algorithm_spec

# The Ray version whose RLlib the parts copy and were proven equal to.
SUPPORTED_RAY = "2.60.0"
SWITCH_ENV = "RL_APP_ACCELERATION"
PARTS = ("runner", "learner", "training_step", "replay_buffer", "module")
# The learner_config_dict key under which rl_app.rllib.config hands SAC's ``training.critic_loss`` to
# rl_app's SAC learner (RLlib's has no such setting).
CRITIC_LOSS = "critic_loss"
PART_NAMES = {
    "runner": "runner",
    "learner": "learner",
    "training_step": "training step",
    "replay_buffer": "replay buffer",
    "module": "SAC module",
}


@dataclass(frozen=True)
class AccelerationPlan:
    """Which of rl_app's parts an experiment runs (``on``), and why not the others it could."""

    on: tuple[str, ...]
    off: dict[str, str] = field(default_factory=dict)  # part -> why RLlib's own runs instead
    everything_off: str | None = None  # why no part runs at all

    def uses(self, part: str) -> bool:
        return part in self.on

    def describe(self) -> str:
        """The Resources line's word on it."""
        if self.everything_off:
            return f"RLlib's own classes throughout ({self.everything_off})"
        if not self.on and not self.off:
            return "RLlib's own classes throughout (no rl_app parts for this algorithm)"
        parts = [f"rl_app's {', '.join(PART_NAMES[p] for p in self.on)}"] if self.on else []
        parts += [f"RLlib's {PART_NAMES[p]} ({why})" for p, why in self.off.items()]
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"on": list(self.on), "off": dict(self.off), "everything_off": self.everything_off}


def switched_off(experiment: Any) -> str | None:
    """Why no part runs at all (the switch, this Ray, RLlib's insides), or None."""
    import ray

    if experiment.acceleration == "off":
        return "acceleration: off"
    if os.environ.get(SWITCH_ENV, "").strip().lower() == "off":
        return f"${SWITCH_ENV}=off"
    if ray.__version__ != SUPPORTED_RAY:
        return f"Ray {ray.__version__}: rl_app's parts are proven on Ray {SUPPORTED_RAY} only"
    from rl_app.rllib.accel.adapter import adapter_problem

    problem = adapter_problem()
    return f"RLlib's insides differ from {SUPPORTED_RAY}'s: {problem}" if problem else None


def _runner_refusal(experiment: Any) -> str | None:
    import gymnasium as gym

    from rl_app.envs import observation_space

    runners = experiment.env_runners
    if runners.runner == "rllib":
        return "env_runners.runner: rllib"
    if not isinstance(observation_space(experiment.env), gym.spaces.Box):
        return "observations are not a Box"
    return None


def _replay_refusal(experiment: Any) -> str | None:
    import gymnasium as gym

    from rl_app.envs import observation_space

    buffer = experiment.training.replay_buffer
    if buffer is not None and buffer.implementation == "rllib":
        return "training.replay_buffer.implementation: rllib"
    if buffer is not None and buffer.type != "PrioritizedEpisodeReplayBuffer":
        return f"training.replay_buffer.type {buffer.type}"
    if experiment.learners.num_learners > 1:
        return f"learners.num_learners {experiment.learners.num_learners}"
    if not isinstance(observation_space(experiment.env), gym.spaces.Box):
        return "observations are not a Box"
    return None


def _driver_step_refusal(resources: Any) -> str | None:
    if resources is not None and resources.num_env_runners:
        return "remote env runners: RLlib's sync_weights"
    if resources is not None and resources.num_learners:
        return "remote learners: RLlib's sync_weights"
    return None


def _module_refusal(experiment: Any) -> str | None:
    from rl_app.envs import action_space, observation_space
    from rl_app.rllib.catalog import is_concat_critic_eligible

    if experiment.model.sac_critic == "multi_stream":
        return "model.sac_critic: multi_stream is RLlib's module"
    if not is_concat_critic_eligible(observation_space(experiment.env), action_space(experiment.env)):
        return "no concatenated critic for these spaces"
    return None


def plan_acceleration(experiment: Any, resources: Any = None) -> AccelerationPlan:
    """The parts ``experiment`` runs on ``resources`` (a ResourcePlan; None: judged without it)."""
    capable = algorithm_spec(experiment.algorithm).accelerated
    if not capable:
        return AccelerationPlan(on=())
    everything_off = switched_off(experiment)
    if everything_off:
        return AccelerationPlan(on=(), everything_off=everything_off)
    if experiment.model.use_lstm:  # sequences, state and padding: RLlib's runner and learner
        return AccelerationPlan(on=(), off={p: "model.use_lstm" for p in PARTS if p in capable})
    from rl_app.envs.multi_agent import multi_agent_section

    if multi_agent_section(experiment) is not None:  # ours take one module, one agent's episodes
        return AccelerationPlan(on=(), off={p: "several agents" for p in PARTS if p in capable})
    replay = _replay_refusal(experiment) if "replay_buffer" in capable else None
    refusals = {
        "runner": _runner_refusal(experiment),
        # DQN's and SAC's learner, training step and buffer go together: the step feeds the
        # learner's lean update from the buffer's columns.
        "learner": replay,
        "training_step": replay if "replay_buffer" in capable else _driver_step_refusal(resources),
        "replay_buffer": replay,
        "module": _module_refusal(experiment) if "module" in capable else None,
    }
    on = tuple(p for p in PARTS if p in capable and refusals[p] is None)
    off = {p: str(refusals[p]) for p in PARTS if p in capable and refusals[p] is not None}
    return AccelerationPlan(on=on, off=off)


def part_classes() -> tuple[dict[str, type], dict[str, type]]:
    """rl_app's learner class and algorithm class (its training step) by algorithm name, for the
    algorithms whose registry entries name those parts."""
    from rl_app.rllib.accel.driver import DriverPPO
    from rl_app.rllib.accel.offpolicy import ArrayReplayDQN, ArrayReplaySAC
    from rl_app.rllib.accel.offpolicy_learners import BatchedStepDQNLearner, BatchedStepSACLearner
    from rl_app.rllib.accel.ppo_learner import BatchedStepPPOLearner

    learners: dict[str, type] = {
        "PPO": BatchedStepPPOLearner,
        "DQN": BatchedStepDQNLearner,
        "SAC": BatchedStepSACLearner,
    }
    training_steps: dict[str, type] = {"PPO": DriverPPO, "DQN": ArrayReplayDQN, "SAC": ArrayReplaySAC}
    return learners, training_steps


def apply_plan(plan: AccelerationPlan, algorithm: str, config: Any) -> None:
    """Point ``config`` at rl_app's classes for the parts ``plan`` runs (RLlib's extension points:
    ``algo_class``, ``learner_class``; the runner class and SAC's module are chosen where the
    config names them)."""
    learners, training_steps = part_classes()
    if plan.uses("training_step"):
        config.algo_class = training_steps[algorithm]
    if plan.uses("learner"):
        config.learners(learner_class=learners[algorithm])
