"""Weights from the learner to the env runner when both live in the driver, and PPO's training step
that uses it.

RLlib 2.60 ends every training step with ``EnvRunnerGroup.sync_weights``: the learner's weights are
read out as numpy arrays, put into Ray's object store (even with no remote runner to read them) and
loaded back into the local runner's module as new tensors. With the runner in the learner's process
its tensors are copied from the learner's in place, and it takes the learner's weights sequence
number as RLlib's ``set_state`` would (the episodes it samples next carry it, and the learner's
off-policyness statistics read it). :class:`DriverPPO` is RLlib's PPO with that sync, registered
through ``AlgorithmConfig.algo_class`` (RLlib's extension point for a custom ``training_step``), as
the off-policy algorithms are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ray.rllib.algorithms.ppo.ppo import PPO
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from rl_app.rllib.accel.adapter import sample_from_runners, set_weights_seq_no, weights_seq_no_of


def matching_weights(
    runner_module: Any, learner_module: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The runner module's tensors (its inference-only twin) and the learner module's of the same
    names, in one order, for an in-place copy."""
    source = learner_module.state_dict()
    targets = runner_module.state_dict()
    return list(targets.values()), [source[name] for name in targets]


def in_place_sync(runner: Any, learner: Any) -> Callable[[], None] | None:
    """A function that gives ``runner`` the weights of ``learner`` (both in this process) as
    RLlib's ``sync_weights`` would, in place; None where the learner has no single default module or
    the two modules live on different devices."""
    if set(learner.module.keys()) != {DEFAULT_MODULE_ID}:
        return None
    runner_weights, learner_weights = matching_weights(runner.module, learner.module[DEFAULT_MODULE_ID])
    if any(r.device != w.device for r, w in zip(runner_weights, learner_weights, strict=True)):
        return None

    def sync() -> None:
        with torch.no_grad():
            torch._foreach_copy_(runner_weights, learner_weights)
        seq_no = weights_seq_no_of(learner)
        if seq_no > 0:  # RLlib's set_state: a sequence number of 0 is not kept
            set_weights_seq_no(runner, seq_no)

    return sync


def local_learner(learner_group: Any) -> Any:
    """The learner of a local ``learner_group`` (``is_local``), through its public ``foreach_learner``."""
    (result,) = learner_group.foreach_learner(lambda learner: learner)
    return result.get()


class DriverPPO(PPO):
    """RLlib's PPO whose weights reach a runner in the driver in place (see the module docstring)."""

    metrics: Any
    env_runner_group: Any
    env_runner: Any
    learner_group: Any

    def _driver_sync(self) -> Callable[[], None] | None:
        """The in-place sync when the only env runner and the learner are in the driver (made anew
        each step, as the off-policy step makes it: nothing to keep in step with the modules)."""
        remote = self.env_runner_group.num_remote_workers()
        if remote or self.env_runner is None or not self.learner_group.is_local:
            return None
        return in_place_sync(self.env_runner, local_learner(self.learner_group))

    def training_step(self) -> None:
        sync = self._driver_sync()
        if sync is None:
            return super().training_step()
        # RLlib 2.60's PPO.training_step (new API stack), with ``sync`` for ``sync_weights``.
        config: Any = self.config
        by_agent_steps = config.count_steps_by == "agent_steps"
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, env_runner_results = sample_from_runners(
                self.env_runner_group,
                **{("max_agent_steps" if by_agent_steps else "max_env_steps"): config.total_train_batch_size},
                sample_timeout_s=config.sample_timeout_s,
            )
            if not episodes:
                return None
            self.metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = self.learner_group.update(
                episodes=episodes,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
                    ),
                    NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                        (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), default=0
                    ),
                },
                num_epochs=config.num_epochs,
                minibatch_size=config.minibatch_size,
                shuffle_batch_per_epoch=config.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            sync()
        return None
