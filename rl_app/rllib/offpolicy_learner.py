"""RLlib's DQN and SAC learners with a gradient step's per-tensor bookkeeping done in a few ops.

At one small update per env step (SAC) the bookkeeping around the torch math is a large share of
an update: RLlib 2.60's ``TorchLearner.apply_gradients`` checks every gradient tensor for nan/inf
twice, each a reduction and a host sync, and ``DQNLearner`` Polyak-averages the target networks
through state dicts and ``load_state_dict``. Here one multi-tensor norm answers "all finite?" (any
nan/inf, or an overflowing norm, hands the step to RLlib's own path, so what happens then is
RLlib's), and the target average is the same arithmetic (``tau * main + (1 - tau) * target``) as
three multi-tensor ops. Registered through ``AlgorithmConfig.learners(learner_class=...)`` with the
array replay (rl_app/rllib/offpolicy.py); proven equal to RLlib's in tests/test_offpolicy.py.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.dqn.dqn_learner import DQNLearner
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.core.rl_module.apis import TargetNetworkAPI
from ray.rllib.utils.metrics import LAST_TARGET_UPDATE_TS, NUM_ENV_STEPS_SAMPLED_LIFETIME, NUM_TARGET_UPDATES


def polyak_average(main_net: torch.nn.Module, target_net: torch.nn.Module, tau: float) -> None:
    """``target = tau * main + (1 - tau) * target`` over every parameter and buffer of
    ``target_net`` (a copy of ``main_net``, so the two list their tensors in the same order)."""
    targets = [*target_net.parameters(), *target_net.buffers()]
    if not all(tensor.is_floating_point() for tensor in targets):
        update_target_network(main_net=main_net, target_net=target_net, tau=tau)  # RLlib's, for int buffers
        return
    with torch.no_grad():
        scaled_main = torch._foreach_mul([*main_net.parameters(), *main_net.buffers()], tau)
        torch._foreach_mul_(targets, 1 - tau)
        torch._foreach_add_(targets, scaled_main)


class _BatchedStepMixin:
    """The two overrides, for RLlib's DQN and SAC torch learners (see the module docstring)."""

    config: Any
    metrics: Any
    module: Any
    last_update_ts_by_mid: Any
    _params: dict[Any, torch.Tensor]
    _module_optimizers: dict[str, list[str]]
    _grad_scalers: Any
    _lr_scheduler_classes: Any

    def apply_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> None:
        gradients = list(gradients_dict.values())
        special = self._grad_scalers is not None or self._lr_scheduler_classes is not None
        if special or not gradients or any(g is None for g in gradients) or not all_finite(gradients):
            return super().apply_gradients(gradients_dict)  # type: ignore[misc]
        for pid, gradient in gradients_dict.items():
            self._params[pid].grad = gradient
        for module_id, optimizer_names in self._module_optimizers.items():
            for optimizer_name in optimizer_names:
                self.get_optimizer(module_id, optimizer_name).step()  # type: ignore[attr-defined]
        return None

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        # DQNLearner's (RLlib 2.60) with polyak_average for its update_target_network.
        super(DQNLearner, self).after_gradient_based_update(timesteps=timesteps)  # type: ignore[misc]
        timestep = timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)
        for module_id, module in self.module._rl_modules.items():
            config = self.config.get_config_for_module(module_id)
            unwrapped = module.unwrapped()
            if timestep - self.last_update_ts_by_mid[module_id] < config.target_network_update_freq:
                continue
            if not isinstance(unwrapped, TargetNetworkAPI):
                continue
            for main_net, target_net in unwrapped.get_target_network_pairs():
                polyak_average(main_net, target_net, config.tau)
            self.metrics.log_value((module_id, NUM_TARGET_UPDATES), 1, reduce="lifetime_sum")
            self.last_update_ts_by_mid[module_id] = timestep
            self.metrics.log_value((module_id, LAST_TARGET_UPDATE_TS), timestep, reduce="max")


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element is finite, in one host sync: a norm is finite only if its elements are
    (a finite tensor whose norm overflows reads as not finite, and RLlib's path then decides)."""
    return bool(torch.stack(torch._foreach_norm(tensors)).isfinite().all())


class BatchedStepDQNLearner(_BatchedStepMixin, DQNTorchLearner):
    """RLlib's DQN torch learner with the batched gradient-step bookkeeping."""


class BatchedStepSACLearner(_BatchedStepMixin, SACTorchLearner):  # type: ignore[misc]
    """RLlib's SAC torch learner with the batched gradient-step bookkeeping."""
