"""One torch learner's gradient step in a few multi-tensor ops, shared by rl_app's PPO, DQN and SAC learners.

Small models updated often (SAC at one update per env step, PPO's minibatches) spend much of an
update around the torch math. Registered through ``AlgorithmConfig.learners(learner_class=...)``:

- the optimizers RLlib builds as plain Adams are the same Adams with torch's fused kernel (one op
  per step instead of a dozen per parameter tensor). It can round an element differently in the
  last bit, so a long run drifts from RLlib's learner's as any two float orders do; a seeded run
  still repeats itself;
- one multi-tensor norm answers "all gradients finite?" where RLlib 2.60's
  ``TorchLearner.apply_gradients`` checks every tensor, each a reduction and a host sync (any
  nan/inf, or an overflowing norm, hands the step to RLlib's own path, so what happens then is
  RLlib's);
- DQN and SAC Polyak-average their target networks with the same arithmetic
  (``tau * main + (1 - tau) * target``) as three multi-tensor ops over tensors listed once, where
  RLlib goes through state dicts and ``load_state_dict``.

With the fused Adam off (``fused_adam = False``) every update is bit-equal to RLlib's learner's;
with it, equal to rounding (tests/test_offpolicy.py, tests/test_learners.py)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.torch_utils import clip_gradients as rllib_clip_gradients

from rl_app.rllib.accel.adapter import (
    LearnerInternals,
    forward_train,
)


def polyak_average_tensors(mains: list[torch.Tensor], targets: list[torch.Tensor], tau: float) -> None:
    """``target = tau * main + (1 - tau) * target`` for each pair of floating-point tensors (a main
    net's and its target copy's, listed in the same order)."""
    with torch.no_grad():
        scaled_main = torch._foreach_mul(mains, tau)
        torch._foreach_mul_(targets, 1 - tau)
        torch._foreach_add_(targets, scaled_main)


def target_tensors(module: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
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


class GradientStepMixin(LearnerInternals):
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
    """What RLlib 2.60's Learner logs of the steps trained (the adapter's override calls this) over
    ``count`` minibatches of ``size`` rows and ``env_steps`` env steps each, in one call per metric:
    its sums are then count x size, its mean the size, its window-1 sequence number the last, and its
    throughputs (computed at each reduce from the sums) the same."""
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
