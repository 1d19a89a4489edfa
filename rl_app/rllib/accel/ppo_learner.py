"""RLlib's PPO torch learner with rl_app's gradient step, its minibatches cut straight from the train
batch's columns (:class:`ColumnMinibatches`) and, for categorical actions, its loss in plain tensor
ops with the loss statistics taken once per update (tests/test_learners.py: bit-equal updates)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import torch
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator
from ray.rllib.utils.torch_utils import explained_variance

from rl_app.rllib.accel.adapter import (
    cyclic_iterator_settings,
    has_sequence_slices,
)
from rl_app.rllib.accel.gradient_step import (
    GradientStepMixin,
    log_steps_trained,
)


class BatchedStepPPOLearner(GradientStepMixin, PPOTorchLearner):
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
    ``concat_samples`` (a copy of every column per minibatch). tests/test_learners.py holds the
    two to bit-equal updates."""

    def __init__(self, cyclic: MiniBatchCyclicIterator) -> None:
        settings = cast(dict[str, Any], cyclic_iterator_settings(cyclic))
        ((self._module_id, module_batch),) = settings["batch"].policy_batches.items()
        self._columns: dict[str, torch.Tensor] = dict(module_batch)
        self._env_steps = len(settings["batch"])
        self._rows_per_minibatch = settings["minibatch_size"]
        self._epochs = settings["num_epochs"]
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
        while epochs < self._epochs:
            wanted, parts = self._rows_per_minibatch, []
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
            self.last, self.count = epochs >= self._epochs, self.count + 1
            yield MultiAgentBatch({self._module_id: SampleBatch(minibatch)}, self._env_steps)
