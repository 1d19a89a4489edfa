"""RLlib's PPO, DQN and SAC torch learners with a gradient step's per-tensor bookkeeping done in a few ops.

Small models updated often (SAC at one update per env step, PPO's minibatches) spend much of an
update around the torch math. Here, registered through ``AlgorithmConfig.learners(learner_class=...)``:

- the optimizers RLlib builds as plain Adams are the same Adams with torch's fused kernel (one op
  per step instead of a dozen per parameter tensor). It can round an element differently in the
  last bit (measured: weights 3e-8 apart after one ppo_cartpole iteration), so a long run drifts
  from RLlib's learner's as any two float orders do; a seeded run still repeats itself;
- one multi-tensor norm answers "all gradients finite?" where RLlib 2.60's
  ``TorchLearner.apply_gradients`` checks every tensor, each a reduction and a host sync (any
  nan/inf, or an overflowing norm, hands the step to RLlib's own path, so what happens then is
  RLlib's);
- DQN and SAC Polyak-average their target networks with the same arithmetic
  (``tau * main + (1 - tau) * target``) as three multi-tensor ops over tensors listed once, where
  RLlib goes through state dicts and ``load_state_dict``;
- PPO's minibatches are cut from the train batch's tensors (see :class:`ColumnMinibatches`);
- SAC runs one backward pass per update where RLlib runs four (see :class:`BatchedStepSACLearner`);
- DQN and SAC take one replayed minibatch without ``Learner.update``'s per-call machinery, their
  per-update metrics logged once per training step (``update_from_columns``).

With the fused Adam off (``fused_adam = False``) every update is bit-equal to RLlib's learner's;
with it, equal to rounding (tests/test_offpolicy.py, tests/test_learners.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import torch
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.learner.learner import ENTROPY_KEY, LR_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.core.rl_module.apis import TargetNetworkAPI
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    LAST_TARGET_UPDATE_TS,
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    NUM_TARGET_UPDATES,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.metrics.ray_metrics import TimerAndPrometheusLogger
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator
from ray.rllib.utils.torch_utils import clip_gradients as rllib_clip_gradients
from ray.rllib.utils.torch_utils import explained_variance

from rl_app.rllib.accel.adapter import (
    LearnerInternals,
    after_gradient_based_update_below_dqn,
    cyclic_iterator_settings,
    forward_train,
    has_sequence_slices,
)


def polyak_average_tensors(mains: list[torch.Tensor], targets: list[torch.Tensor], tau: float) -> None:
    """``target = tau * main + (1 - tau) * target`` for each pair of floating-point tensors (a main
    net's and its target copy's, listed in the same order)."""
    with torch.no_grad():
        scaled_main = torch._foreach_mul(mains, tau)
        torch._foreach_mul_(targets, 1 - tau)
        torch._foreach_add_(targets, scaled_main)


def _target_tensors(module: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """All (main, target) tensors of ``module``'s target-network pairs, or None where a target
    holds a non-float tensor (RLlib's own update then)."""
    mains: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    for main_net, target_net in module.get_target_network_pairs():
        mains += [*main_net.parameters(), *main_net.buffers()]
        targets += [*target_net.parameters(), *target_net.buffers()]
    if not all(tensor.is_floating_point() for tensor in targets):
        return None
    return mains, targets


class _BatchedStepMixin(LearnerInternals):
    """Fused Adams and one finiteness check, for RLlib's torch learners (see the module docstring)."""

    fused_adam = True

    config: Any
    metrics: Any
    module: Any

    def register_optimizer(self, *, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        # RLlib builds these learners' optimizers as plain Adams: the same Adam with torch's fused
        # kernel takes one op per step instead of a dozen per parameter tensor.
        plain_adam = type(optimizer) is torch.optim.Adam and not optimizer.state
        if self.fused_adam and plain_adam and _fusable(optimizer):
            optimizer = torch.optim.Adam(
                [param for group in optimizer.param_groups for param in group["params"]],
                **{**optimizer.defaults, "foreach": None, "fused": True},
            )
        super().register_optimizer(optimizer=optimizer, **kwargs)  # type: ignore[misc]

    def update_step(self, batch: dict[Any, Any], **kwargs: Any) -> Any:
        # TorchLearner's (RLlib 2.60), with each module's training pass called directly: the
        # module's forward_train switches it to train mode on every call, a walk over all layers.
        if self.config.num_learners > 1:  # DDP's no_sync context: RLlib's path
            return super().update_step(batch, **kwargs)
        self.compute_off_policyness(batch)
        fwd_out = {}
        for module_id, module_batch in batch.items():
            if module_id not in self.module:
                continue
            module = self.module[module_id]
            if not module.training:
                module.train()
            fwd_out[module_id] = forward_train(module, module_batch)
        loss_per_module = self.compute_losses(fwd_out=fwd_out, batch=batch)  # type: ignore[attr-defined]
        gradients = self.compute_gradients(loss_per_module)  # type: ignore[attr-defined]
        self.apply_gradients(self.postprocess_gradients(gradients))  # type: ignore[attr-defined]
        return fwd_out, loss_per_module, {}

    def clip_function(self) -> Any:
        # RLlib asks for it once per optimizer per step; what the clips saw is this step's.
        return functools.partial(clip_gradients, seen=self.__dict__.setdefault("_clipped", []))

    @staticmethod
    def _finite_by_clipping(seen: list[tuple[int, torch.Tensor]], num_gradients: int) -> bool:
        """Whether this step's global-norm clipping already showed every gradient finite: it took
        each one's norm, then scaled it by at most 1 (so no second pass over them is needed)."""
        covered = sum(count for count, _ in seen)
        return bool(seen) and covered == num_gradients and all(bool(finite) for _, finite in seen)

    def apply_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> None:
        gradients = list(gradients_dict.values())
        seen = self.__dict__.pop("_clipped", [])  # this step's clips; the next step's start afresh
        special = self.uses_grad_scaler_or_torch_lr_scheduler()
        if special or not gradients or any(g is None for g in gradients):
            return super().apply_gradients(gradients_dict)  # type: ignore[misc]
        if not self._finite_by_clipping(seen, len(gradients)) and not all_finite(gradients):
            return super().apply_gradients(gradients_dict)  # type: ignore[misc]
        for pid, gradient in gradients_dict.items():
            param = self.params_by_id[pid]
            if param.grad is not gradient:  # mostly it is: clipping scales .grad in place
                param.grad = gradient
        for module_id, optimizer_names in self.optimizer_names_by_module.items():
            for optimizer_name in optimizer_names:
                self.get_optimizer(module_id, optimizer_name).step()  # type: ignore[attr-defined]
        return None


@dataclasses.dataclass
class _UpdateTotals:
    """What :meth:`_OffPolicyMixin.update_from_columns` logs once per training step."""

    updates: int = 0
    rows: int = 0  # per update, the same in all (what makes one logged mean RLlib's running mean)
    losses: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # the last update's
    target_updates: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # count, last ts


class _OffPolicyMixin(_BatchedStepMixin):
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
                cache[module_id] = (unwrapped, _target_tensors(unwrapped))
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
        totals = self.__dict__.setdefault("_totals", _UpdateTotals())
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


def clip_gradients(
    gradients_dict: dict[Any, torch.Tensor],
    *,
    grad_clip: float,
    grad_clip_by: str,
    seen: list[tuple[int, torch.Tensor]] | None = None,
) -> Any:
    """RLlib's ``clip_gradients`` (2.60), its global-norm case in multi-tensor ops: the same
    per-tensor norms (overflow read as 1e9), their norm, and one in-place scale of every gradient.
    ``seen`` gets (how many gradients, whether each one's norm was finite) of a global-norm clip."""
    gradients = [g.detach() for g in gradients_dict.values() if g is not None]
    if grad_clip_by != "global_norm" or not gradients:
        return rllib_clip_gradients(gradients_dict, grad_clip=grad_clip, grad_clip_by=grad_clip_by)
    norms = torch.stack(torch._foreach_norm(gradients, 2.0))
    total_norm = torch.norm(norms.nan_to_num(neginf=-10e8, posinf=10e8), 2.0).nan_to_num(
        neginf=-10e8, posinf=10e8
    )
    clip_coeff = torch.clamp(grad_clip / torch.clamp(total_norm + 1e-6, min=grad_clip), max=1.0)
    torch._foreach_mul_(gradients, clip_coeff)
    if seen is not None:
        seen.append((len(gradients), norms.isfinite().all()))
    return total_norm


def _fusable(optimizer: torch.optim.Optimizer) -> bool:
    """Whether torch's fused Adam takes ``optimizer``'s place: one param group of float32 CPU tensors
    (the fused kernel's own requirements), no differentiable or capturable mode."""
    groups = optimizer.param_groups
    defaults = optimizer.defaults
    return (
        len(groups) == 1
        and not defaults.get("differentiable")
        and not defaults.get("capturable")
        and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in groups[0]["params"])
    )


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element is finite, in one host sync: a norm is finite only if its elements are
    (a finite tensor whose norm overflows reads as not finite, and RLlib's path then decides)."""
    return bool(torch.stack(torch._foreach_norm(tensors)).isfinite().all())


def log_steps_trained(
    metrics: Any, module_id: str, weights_seq_no: int, count: int, size: int, env_steps: int
) -> None:
    """What RLlib's ``Learner._log_steps_trained_metrics`` (2.60) logs over ``count`` minibatches of
    ``size`` rows and ``env_steps`` env steps each, in one call per metric: its sums are then count x
    size, its mean the size, its window-1 sequence number the last, and its throughputs (computed
    at each reduce from the sums) the same."""
    metrics.log_value((module_id, WEIGHTS_SEQ_NO), weights_seq_no, window=1)
    metrics.log_value((module_id, MODULE_TRAIN_BATCH_SIZE_MEAN), size, reduce="mean")
    metrics.log_value((module_id, NUM_MODULE_STEPS_TRAINED), count * size, reduce="sum")
    for key, value, reduce in (
        ((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), count * size, "lifetime_sum"),
        ((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), count * size, "sum"),
        ((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), count * size, "lifetime_sum"),
        ((ALL_MODULES, NUM_ENV_STEPS_TRAINED), count * env_steps, "sum"),
        ((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), count * env_steps, "lifetime_sum"),
    ):
        metrics.log_value(key, value, reduce=reduce, with_throughput=True)


class BatchedStepPPOLearner(_BatchedStepMixin, PPOTorchLearner):
    """RLlib's PPO torch learner with the batched gradient-step bookkeeping, its minibatches cut
    straight from the train batch's columns (:class:`ColumnMinibatches`) and, for categorical
    actions, its loss in plain tensor ops with the loss statistics taken once per update.

    RLlib logs those statistics (and each minibatch's off-policyness) with ``window=1``: only the
    last minibatch's reach the results, so they are computed for the last minibatch only."""

    _minibatches: ColumnMinibatches | None = None

    def minibatch_iterator(self, **kwargs: Any) -> Any:
        iterator = super().minibatch_iterator(**kwargs)
        self._minibatches = None
        if type(iterator) is MiniBatchCyclicIterator and ColumnMinibatches.refusal(iterator) is None:
            iterator = self._minibatches = ColumnMinibatches(iterator)
        return iterator

    def _logs_this_minibatch(self) -> bool:
        return self._minibatches is None or self._minibatches.last

    def compute_off_policyness(self, batch: Any) -> None:
        if self._logs_this_minibatch():
            super().compute_off_policyness(batch)

    def log_minibatch_counters(self, batch: MultiAgentBatch) -> None:
        # RLlib's Prometheus step counters, incremented by the update's totals once.
        minibatches = self._minibatches
        if minibatches is None:
            return super().log_minibatch_counters(batch)
        if minibatches.last:
            count = minibatches.count
            module_steps = sum(len(b) for b in batch.policy_batches.values())
            self.count_steps_trained(count * batch.env_steps(), count * module_steps)
        return None

    def log_minibatch_steps(self, batch: MultiAgentBatch) -> None:
        # RLlib's (2.60) seven step counts per minibatch, logged once per update: ColumnMinibatches'
        # minibatches are all one size, so the sums are count x size, the size's mean is the size
        # and the throughputs (computed at each reduce) are the same.
        minibatches = self._minibatches
        if minibatches is None:
            return super().log_minibatch_steps(batch)
        if not minibatches.last:
            return None
        ((module_id, module_batch),) = batch.policy_batches.items()
        log_steps_trained(
            self.metrics,
            module_id,
            self.learner_weights_seq_no,
            minibatches.count,
            len(module_batch),
            batch.env_steps(),
        )
        return None

    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        module = self.module[module_id].unwrapped()
        categorical = (
            module.get_train_action_dist_cls() is TorchCategorical
            and module.get_exploration_action_dist_cls() is TorchCategorical
        )
        if not categorical or not config.use_critic:
            return cast(
                torch.Tensor,
                super().compute_loss_for_module(
                    module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
                ),
            )
        return self._categorical_loss(module_id, module, config, batch, fwd_out)

    def _categorical_loss(
        self, module_id: str, module: Any, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        """PPOTorchLearner's loss (RLlib 2.60) for categorical actions, in the same tensor ops torch's
        ``Categorical`` and ``kl_divergence`` and RLlib's masked means run, so bit-equal; the entropy
        enters the graph only with a nonzero coefficient (``- 0 * entropy`` changes no bit)."""
        mask = batch.get(Columns.LOSS_MASK)
        num_valid = torch.sum(mask) if mask is not None else torch.tensor(1)

        def mean(data: torch.Tensor) -> torch.Tensor:
            return torch.mean(data) if mask is None else torch.sum(data[mask]) / num_valid

        logits = fwd_out[Columns.ACTION_DIST_INPUTS]
        log_pmf = logits - logits.logsumexp(dim=-1, keepdim=True)
        actions = batch[Columns.ACTIONS].long().unsqueeze(-1)
        logp = log_pmf.gather(-1, actions).squeeze(-1)
        logp_ratio = torch.exp(logp - batch[Columns.ACTION_LOGP])
        probs = None
        if config.use_kl_loss:
            previous = batch[Columns.ACTION_DIST_INPUTS]
            previous_log_pmf = previous - previous.logsumexp(dim=-1, keepdim=True)
            previous_probs = torch.softmax(previous_log_pmf, dim=-1)
            # In torch's order (a gradient summed in another order can differ in the last bit).
            scaled_log_ratio = previous_probs * (previous_log_pmf - log_pmf)
            probs = torch.softmax(log_pmf, dim=-1)
            action_kl = scaled_log_ratio.masked_fill(probs == 0, math.inf)
            mean_kl_loss = mean(action_kl.masked_fill(previous_probs == 0, 0.0).sum(-1))
        else:
            mean_kl_loss = torch.tensor(0.0, device=logp_ratio.device)
        entropy_coeff = self.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        logs = self._logs_this_minibatch()
        entropy = torch.tensor(0.0)
        if logs or entropy_coeff != 0:
            clamped = torch.clamp(log_pmf, min=torch.finfo(log_pmf.dtype).min)
            probs = torch.softmax(log_pmf, dim=-1) if probs is None else probs
            entropy = -(clamped * probs).sum(-1)

        advantages = batch[Postprocessing.ADVANTAGES]
        surrogate_loss = torch.min(
            advantages * logp_ratio,
            advantages * torch.clamp(logp_ratio, 1 - config.clip_param, 1 + config.clip_param),
        )
        value_fn_out = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
        vf_loss = torch.pow(value_fn_out - batch[Postprocessing.VALUE_TARGETS], 2.0)
        vf_loss_clipped = torch.clamp(vf_loss, 0, config.vf_clip_param)
        per_step = -surrogate_loss + config.vf_loss_coeff * vf_loss_clipped
        if entropy_coeff != 0:
            per_step = per_step - entropy_coeff * entropy
        total_loss = mean(per_step)
        if config.use_kl_loss:
            total_loss += cast(torch.Tensor, self.curr_kl_coeffs_per_module[module_id]) * mean_kl_loss

        if logs:
            with torch.no_grad():
                stats = {
                    POLICY_LOSS_KEY: -mean(surrogate_loss),
                    VF_LOSS_KEY: mean(vf_loss_clipped),
                    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: mean(vf_loss),
                    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(
                        batch[Postprocessing.VALUE_TARGETS], value_fn_out
                    ),
                    ENTROPY_KEY: mean(entropy),
                    LEARNER_RESULTS_KL_KEY: mean_kl_loss,
                }
            self.metrics.log_dict(stats, key=module_id, window=1)
        return total_loss


class ColumnMinibatches:
    """The minibatches of RLlib's ``MiniBatchCyclicIterator`` (RLlib 2.60) for one module's flat
    tensor columns: the same rows in the same order, shuffled by the same ``np.random``
    permutation at each epoch's end, each gathered from the columns with one ``index_select`` per
    column (a slice while nothing is shuffled) where RLlib goes through ``SampleBatch`` slices and
    ``concat_samples`` (profiled: ~0.7 ms of each ~3.9 ms ppo_cartpole minibatch update).
    tests/test_learners.py holds the two to bit-equal updates."""

    def __init__(self, cyclic: MiniBatchCyclicIterator) -> None:
        settings = cast(dict[str, Any], cyclic_iterator_settings(cyclic))
        ((self._module_id, module_batch),) = settings["batch"].policy_batches.items()
        self._columns: dict[str, torch.Tensor] = dict(module_batch)
        self._env_steps = len(settings["batch"])
        self._minibatch_size = settings["minibatch_size"]
        self._num_epochs = settings["num_epochs"]
        self._shuffle = settings["shuffle_batch_per_epoch"]
        self.last = False  # whether the minibatch last yielded is the update's final one
        self.count = 0  # minibatches yielded, all of ``minibatch_size`` rows

    @staticmethod
    def refusal(cyclic: MiniBatchCyclicIterator) -> str | None:
        """Why the cyclic iterator's batch is not one this cuts alike, or None."""
        settings = cyclic_iterator_settings(cyclic)
        if settings is None:
            return "a MiniBatchCyclicIterator of another Ray"
        batches = settings["batch"].policy_batches
        if len(batches) != 1 or settings["num_total_minibatches"]:
            return "several modules, or a fixed number of minibatches"
        (module_batch,) = batches.values()
        if (
            has_sequence_slices(module_batch)
            or Columns.SEQ_LENS in module_batch
            or Columns.INFOS in module_batch
        ):
            return "sequences or infos in the train batch"
        if len(module_batch) == 0 or not all(isinstance(v, torch.Tensor) for v in module_batch.values()):
            return "an empty batch, or columns that are not flat tensors"
        return None

    def __iter__(self) -> Iterator[MultiAgentBatch]:
        columns, size = self._columns, len(next(iter(self._columns.values())))
        device = next(iter(columns.values())).device
        # Rows of the original columns in RLlib's current (reshuffled) order: each minibatch is one
        # gather per column, where shuffling the columns, slicing and concatenating cost a copy each.
        order = np.arange(size)
        start, epochs, shuffled = 0, 0, False
        while epochs < self._num_epochs:
            wanted, parts = self._minibatch_size, []
            while start + wanted >= size:  # to the end of the batch, then round again (RLlib's >=)
                parts.append(order[start:])
                wanted -= size - start
                start, epochs = 0, epochs + 1
                if self._shuffle:
                    order, shuffled = order[np.random.permutation(size)], True
            if wanted > 0:
                parts.append(order[start : start + wanted])
                start += wanted
            if len(parts) == 1 and not shuffled:
                first = int(parts[0][0])
                minibatch = {key: value[first : first + len(parts[0])] for key, value in columns.items()}
            else:
                rows = torch.from_numpy(np.concatenate(parts)).to(device)
                minibatch = {key: value.index_select(0, rows) for key, value in columns.items()}
            self.last, self.count = epochs >= self._num_epochs, self.count + 1
            yield MultiAgentBatch({self._module_id: SampleBatch(minibatch)}, self._env_steps)


class BatchedStepDQNLearner(_OffPolicyMixin, DQNTorchLearner):
    """RLlib's DQN torch learner with the batched gradient-step bookkeeping."""


class BatchedStepSACLearner(_OffPolicyMixin, SACTorchLearner):  # type: ignore[misc]
    """RLlib's SAC torch learner with the batched gradient-step bookkeeping and one backward pass
    per update where RLlib runs four.

    SAC's four losses (actor, critic, twin critic, log-alpha) reach disjoint parameters: each loss
    sees the others' parameters only detached (alpha, the next-state terms) or frozen (the critics
    under the actor's loss). So one backward of their sum (RLlib's ``total_loss``) leaves on every
    parameter the gradient that RLlib's four ``retain_graph`` backwards, one per optimizer, leave
    on it.
    """

    def compute_gradients(self, loss_per_module: Any, **kwargs: Any) -> Any:
        if self.uses_grad_scaler() or self.config.num_learners > 1:
            return super().compute_gradients(loss_per_module, **kwargs)
        self.forget_per_optimizer_losses()  # those RLlib's compute_gradients would pop
        self.zero_all_gradients()
        cast(torch.Tensor, sum(loss_per_module.values())).backward()
        return {pid: param.grad for pid, param in self.params_by_id.items()}


# The learner class of each algorithm whose registry entry names the "learner" part.
LEARNERS = {"PPO": BatchedStepPPOLearner, "DQN": BatchedStepDQNLearner, "SAC": BatchedStepSACLearner}
