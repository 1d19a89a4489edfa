"""RLlib's DQN and SAC torch learners with rl_app's gradient step, their target networks averaged in
multi-tensor ops, SAC's four losses in one backward pass, and a lean update of one replayed
minibatch whose metrics are logged once per training step (tests/test_offpolicy.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import torch
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.core.learner.learner import LR_KEY
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.core.rl_module.apis import TargetNetworkAPI
from ray.rllib.policy.sample_batch import SampleBatch
from ray.rllib.utils.metrics import (
    LAST_TARGET_UPDATE_TS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_TARGET_UPDATES,
)
from ray.rllib.utils.metrics.ray_metrics import TimerAndPrometheusLogger

from rl_app.rllib.accel import CRITIC_LOSS
from rl_app.rllib.accel.adapter import (
    after_gradient_based_update_below_dqn,
    squared_critic_losses,
)
from rl_app.rllib.accel.gradient_step import (
    GradientStepMixin,
    log_steps_trained,
    polyak_average_tensors,
    target_tensors,
)


@dataclasses.dataclass
class UpdateTotals:
    """What :meth:`OffPolicyLearnerMixin.update_from_columns` logs once per training step."""

    updates: int = 0
    rows: int = 0  # per update, the same in all (what makes one logged mean RLlib's running mean)
    losses: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # the last update's
    target_updates: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # count, last ts


class OffPolicyLearnerMixin(GradientStepMixin):
    """DQN's and SAC's target-network average in multi-tensor ops (see the module docstring), and
    a lean update for one replayed minibatch in the algorithm's own process."""

    last_update_ts_by_mid: Any
    TOTAL_LOSS_KEY: str

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        # DQNLearner's (RLlib 2.60) with polyak_average_tensors for its update_target_network.
        after_gradient_based_update_below_dqn(self, timesteps)
        for module_id, timestep in self._average_targets(timesteps):
            self.metrics.log_value((module_id, NUM_TARGET_UPDATES), 1, reduce="lifetime_sum")
            self.metrics.log_value((module_id, LAST_TARGET_UPDATE_TS), timestep, reduce="max")

    def _average_targets(self, timesteps: dict[str, Any]) -> list[tuple[str, int]]:
        """Move each module's targets towards its nets where the update frequency says so; returns
        (module, timestep) of those it moved."""
        timestep = timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)
        moved = []
        for module_id, module in self.module.items():
            config = self.config.get_config_for_module(module_id)
            unwrapped = module.unwrapped()
            if timestep - self.last_update_ts_by_mid[module_id] < config.target_network_update_freq:
                continue
            if not isinstance(unwrapped, TargetNetworkAPI):
                continue
            # The module's tensors, listed once (a walk over both nets' layers per update otherwise).
            cache = self.__dict__.setdefault("_target_tensors", {})
            if module_id not in cache or cache[module_id][0] is not unwrapped:
                cache[module_id] = (unwrapped, target_tensors(unwrapped))
            tensors = cache[module_id][1]
            if tensors is None:
                for main_net, target_net in unwrapped.get_target_network_pairs():
                    update_target_network(main_net=main_net, target_net=target_net, tau=config.tau)
            else:
                mains, targets = tensors
                polyak_average_tensors(mains, targets, config.tau)
            self.last_update_ts_by_mid[module_id] = timestep
            moved.append((module_id, timestep))
        return moved

    def lean_update_refusal(self) -> str | None:
        """Why :meth:`update_from_columns` cannot stand in for ``update``, or None."""
        if self.config.num_learners > 1 or len(self.module) != 1:
            return "several learners or modules"
        if self.config.policies_to_train is not None:
            return "policies_to_train (RLlib's update decides per batch which modules learn)"
        if self.uses_lr_schedule():
            return "a learning-rate schedule (its rate logged at every update)"
        return None

    def update_from_columns(self, columns: dict[str, np.ndarray], timesteps: dict[str, Any]) -> None:
        """``update(batch=..., _no_metrics_reduce=True)`` for one minibatch of replayed columns, as
        RLlib's ``Learner.update`` (2.60) runs it for our single module, less its per-call
        machinery (training data, iterator, batch conversion through ``tree``): the same gradient
        step and target average. What it logs once per update in window-1, sum, mean or max
        metrics is kept here and logged by :meth:`log_update_totals`, to the same reduced values."""
        (module_id,) = self.module.keys()
        rows = len(next(iter(columns.values())))
        totals = self.__dict__.setdefault("_totals", UpdateTotals())
        if totals.updates and rows != totals.rows:
            raise ValueError(f"a lean update of {rows} rows after {totals.rows}: one size per training step")
        self.learner_weights_seq_no += 1
        # convert_to_torch_tensor's conversion: float64 columns become float32.
        tensors = {}
        for name, column in columns.items():
            tensor = torch.from_numpy(column)
            if tensor.is_floating_point() and tensor.dtype != torch.float16:
                tensor = tensor.float()
            tensors[name] = tensor.to(self.learner_device)
        with TimerAndPrometheusLogger(self.inner_update_timer):
            _, losses, _ = self.gradient_update({module_id: SampleBatch(tensors)})
        totals.updates, totals.rows, totals.losses = totals.updates + 1, rows, losses
        # Learner.after_gradient_based_update's rates: each optimizer's set from its (unscheduled)
        # rate again, as after a restored optimizer state that had another.
        self.reset_scheduled_rates()
        for moved_id, timestep in self._average_targets(timesteps):
            count, last = totals.target_updates.get(moved_id, (0, timestep))
            totals.target_updates[moved_id] = (count + 1, max(last, timestep))

    def log_update_totals(self) -> None:
        """Log what :meth:`update_from_columns` kept since the last call (a no-op after none)."""
        totals = self.__dict__.pop("_totals", None)
        if totals is None or totals.updates == 0:
            return
        (module_id,) = self.module.keys()
        steps = totals.updates * totals.rows
        if steps > 0:  # Prometheus counters take positive increments only
            self.count_steps_trained(steps, steps)
        log_steps_trained(
            self.metrics, module_id, self.learner_weights_seq_no, totals.updates, totals.rows, totals.rows
        )
        for loss_id, loss in totals.losses.items():
            self.metrics.log_value(key=(loss_id, self.TOTAL_LOSS_KEY), value=loss, window=1)
        # Learner.after_gradient_based_update's learning rates, one per update: constant without a
        # schedule, so their mean, computed as RLlib's reduce computes it (the nanmean of N copies
        # can differ from the rate in the last bit).
        for optimizer_module, optimizer_names in self.optimizer_names_by_module.items():
            for optimizer_name in optimizer_names:
                rate = self.optimizer_rate(optimizer_name)
                self.metrics.log_value(
                    key=(optimizer_module, f"{optimizer_name[len(optimizer_module) + 1 :]}_{LR_KEY}"),
                    reduce="mean",
                    value=float(np.nanmean(np.full(totals.updates, rate))),
                )
        for moved_id, (count, timestep) in totals.target_updates.items():
            self.metrics.log_value((moved_id, NUM_TARGET_UPDATES), count, reduce="lifetime_sum")
            self.metrics.log_value((moved_id, LAST_TARGET_UPDATE_TS), timestep, reduce="max")


class BatchedStepDQNLearner(OffPolicyLearnerMixin, DQNTorchLearner):
    """RLlib's DQN torch learner with the batched gradient-step bookkeeping."""


class BatchedStepSACLearner(OffPolicyLearnerMixin, SACTorchLearner):  # type: ignore[misc]
    """RLlib's SAC torch learner with the batched gradient-step bookkeeping and one backward pass
    per update where RLlib runs four.

    SAC's four losses (actor, critic, twin critic, log-alpha) reach disjoint parameters: each loss
    sees the others' parameters only detached (alpha, the next-state terms) or frozen (the critics
    under the actor's loss). So one backward of their sum (RLlib's ``total_loss``) leaves on every
    parameter the gradient that RLlib's four ``retain_graph`` backwards, one per optimizer, leave
    on it.
    """

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: Any, fwd_out: Any) -> Any:
        """RLlib's SAC loss; with ``training.critic_loss: mse`` its critics' Huber losses become half
        their squared TD errors (rl_app.rllib.config puts the choice in ``learner_config_dict``)."""
        loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        if config.learner_config_dict.get(CRITIC_LOSS) != "mse":
            return loss
        return squared_critic_losses(self, module_id, config, batch, fwd_out)

    def compute_gradients(self, loss_per_module: Any, **kwargs: Any) -> Any:
        if self.uses_grad_scaler() or self.config.num_learners > 1:
            return super().compute_gradients(loss_per_module, **kwargs)
        self.forget_per_optimizer_losses()  # those RLlib's compute_gradients would pop
        self.zero_all_gradients()
        cast(torch.Tensor, sum(loss_per_module.values())).backward()
        return {pid: param.grad for pid, param in self.params_by_id.items()}
