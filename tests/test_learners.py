"""Our PPO learner (fused Adam, one finiteness check, multi-tensor gradient clipping) against
RLlib's: the same state and episodes give bit-equal weights (equal to rounding with the fused
Adam)."""

from __future__ import annotations

import copy
import math
import unittest.mock
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import unfused
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import ALL_MODULES, NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.rllib.utils.torch_utils import clip_gradients as rllib_clip_gradients

from rl_app.cluster.resources import plan_resources
from rl_app.config import load_experiment
from rl_app.rllib.accel.gradient_step import clip_gradients
from rl_app.rllib.accel.ppo_learner import BatchedStepPPOLearner, ColumnMinibatches
from rl_app.rllib.config import algorithm_config
from rl_app.rllib.env_runner import env_runner_class


@pytest.mark.parametrize("scale", [1e-3, 10.0, float("inf")])
def test_global_norm_clipping_is_rllibs(scale: float) -> None:
    """Below the clip, above it, and with an overflowing gradient: the same norm and gradients."""
    generator = torch.Generator().manual_seed(0)
    gradients = [torch.randn(shape, generator=generator) * 1.0 for shape in ((64, 4), (64,), (2, 64), (2,))]
    gradients[0][0, 0] = scale if scale == float("inf") else gradients[0][0, 0]
    gradients = [g * (1.0 if scale == float("inf") else scale) for g in gradients]
    ours = {i: g.clone() for i, g in enumerate(gradients)}
    theirs = {i: g.clone() for i, g in enumerate(gradients)}
    our_norm = clip_gradients(ours, grad_clip=0.5, grad_clip_by="global_norm")
    their_norm = rllib_clip_gradients(theirs, grad_clip=0.5, grad_clip_by="global_norm")
    torch.testing.assert_close(our_norm, their_norm, rtol=0, atol=0)
    for i, gradient in ours.items():
        torch.testing.assert_close(gradient, theirs[i], rtol=0, atol=0, equal_nan=True)
    if scale == 10.0:
        assert not torch.equal(ours[0], gradients[0])  # it did clip


@pytest.mark.parametrize(("minibatch_size", "num_epochs"), [(64, 3), (256, 20)])  # 256: as shipped
def test_ppo_learner_updates_exactly_as_rllibs(
    minibatch_size: int, num_epochs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ppo_cartpole (gradient clipping at 0.5): our learner and RLlib's PPO torch learner from the
    same state over the same episodes, minibatches shuffled alike (ours cut from the columns,
    RLlib's through SampleBatch slices), end with bit-equal weights with RLlib's Adam kept, and
    equal to rounding with the fused one."""
    cut, losses = [], []
    column_minibatches = ColumnMinibatches.__iter__
    categorical_loss = BatchedStepPPOLearner._categorical_loss

    def counted(self: ColumnMinibatches) -> Any:
        for minibatch in column_minibatches(self):
            cut.append(len(minibatch.policy_batches[DEFAULT_MODULE_ID]))
            yield minibatch

    def counted_loss(self: BatchedStepPPOLearner, *args: Any) -> Any:
        losses.append(self._logs_this_minibatch())
        return categorical_loss(self, *args)

    monkeypatch.setattr(ColumnMinibatches, "__iter__", counted)
    monkeypatch.setattr(BatchedStepPPOLearner, "_categorical_loss", counted_loss)
    loaded = load_experiment("ppo_cartpole", ("env_runners.num_envs_per_env_runner=4",))
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    assert config.learner_class is BatchedStepPPOLearner
    episodes = env_runner_class(True, 20, fast=True)(config=config).sample(num_timesteps=256)
    env = gym.make("CartPole-v1")
    spaces = {DEFAULT_MODULE_ID: (env.observation_space, env.action_space)}
    ours, theirs = _ours_and_rllibs(config, spaces)
    assert all(optimizer.defaults["fused"] for optimizer in ours._named_optimizers.values())
    exact = config.copy(copy_frozen=False).learners(learner_class=unfused(BatchedStepPPOLearner))
    ours_unfused = exact.build_learner(spaces=spaces)
    assert not any(optimizer.defaults["fused"] for optimizer in ours_unfused._named_optimizers.values())
    ours_unfused.set_state(ours.get_state())
    before = {k: t.clone() for k, t in ours.module[DEFAULT_MODULE_ID].state_dict().items()}
    norms, stats, totals = [], [], []
    for learner in (ours_unfused, theirs, ours):
        np.random.seed(0)  # the minibatch shuffle
        for _ in range(2):  # the second update's results hold the first's lifetime sums
            results = learner.update(
                episodes=copy.deepcopy(episodes),  # RLlib's learner connector extends them in place
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 256},
                minibatch_size=minibatch_size,
                num_epochs=num_epochs,
                shuffle_batch_per_epoch=True,
            )
        norms.append(results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"].peek())
        stats.append({key: _number(s.peek()) for key, s in results[DEFAULT_MODULE_ID].items()})
        totals.append(_peeked(results[ALL_MODULES]))
    mine, reference, fused = (
        learner.module[DEFAULT_MODULE_ID].state_dict() for learner in (ours_unfused, theirs, ours)
    )
    assert any(not torch.equal(before[k], mine[k]) for k in before)  # it did learn
    for key, tensor in mine.items():
        torch.testing.assert_close(tensor, reference[key], rtol=0, atol=0, msg=key)
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)
    assert norms[0] == norms[1]
    # Every statistic RLlib's learner reports, ours reports alike: the losses, entropy, KL and
    # explained variance of the last minibatch (ours computes them for that one only), steps, rates.
    rates = {key for key in stats[1] if "throughput" in key}
    assert {"policy_loss", "vf_loss", "entropy", "mean_kl_loss", "vf_explained_var"} <= set(stats[1])
    assert {k: v for k, v in stats[0].items() if k not in rates} == {
        k: v for k, v in stats[1].items() if k not in rates
    }
    # The step counts, logged by ours once per update and by RLlib's per minibatch, sum alike.
    assert totals[1]["num_env_steps_trained_lifetime"] > 0 and totals[1]["num_module_steps_trained"] > 0
    assert {"num_module_steps_trained", "num_module_steps_trained_lifetime"} <= set(stats[1])
    for mine_totals in (totals[0], totals[2]):
        assert _counts(mine_totals) == _counts(totals[1])
    # Our loss ran on each of our minibatches, the statistics taken on the last of each update only.
    assert len(losses) == len(cut) and losses.count(True) == 4
    # Our two learners cut their minibatches from the columns: every one full-sized, over all epochs.
    assert cut and set(cut) == {minibatch_size} and len(cut) >= 4 * num_epochs * 256 // minibatch_size
    env.close()


@pytest.mark.parametrize(
    ("overrides", "masked", "vanishing"),
    [
        ((), True, "old"),
        ((), True, "new"),
        (("training.entropy_coeff=0.01",), False, "old"),
        (("training.use_kl_loss=false", "training.entropy_coeff=0.01"), True, "new"),
    ],
)
def test_ppo_categorical_loss_is_rllibs_with_vanishing_probabilities(
    overrides: tuple[str, ...], masked: bool, vanishing: str
) -> None:
    """Our categorical PPO loss and RLlib's on the same outputs and batch: the same loss, gradient
    and statistics, where the old or the new policy gives an action probability 0 (torch's KL then
    reads 0 for the old one's, inf for the new one's), with and without entropy, KL and mask."""
    loaded = load_experiment("ppo_cartpole", overrides)
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    spaces = {DEFAULT_MODULE_ID: (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(3))}
    ours, theirs = _ours_and_rllibs(config, spaces)
    generator = torch.Generator().manual_seed(0)
    rows = 12
    logits = torch.randn(rows, 3, generator=generator)
    previous = torch.randn(rows, 3, generator=generator)
    (logits if vanishing == "new" else previous)[0, 1] = -math.inf
    (logits if vanishing == "new" else previous)[1] = torch.tensor([0.0, 200.0, -200.0])  # exp underflows
    batch = {
        "obs": torch.randn(rows, 4, generator=generator),
        "actions": torch.tensor([2, 0, 1] * (rows // 3)),
        "action_logp": torch.randn(rows, generator=generator) - 1.0,
        "action_dist_inputs": previous,
        "advantages": torch.randn(rows, generator=generator),
        "value_targets": torch.randn(rows, generator=generator),
    }
    if masked:
        batch["loss_mask"] = torch.arange(rows) % 4 != 3
    results = []
    for learner in (ours, theirs):
        inputs = logits.clone().requires_grad_()
        embeddings = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        fwd_out = {"action_dist_inputs": inputs, "embeddings": embeddings}
        module_config = learner.config.get_config_for_module(DEFAULT_MODULE_ID)
        loss = learner.compute_loss_for_module(
            module_id=DEFAULT_MODULE_ID, config=module_config, batch=batch, fwd_out=fwd_out
        )
        if loss.isfinite():
            loss.backward()
        stats = learner.metrics.reduce()[DEFAULT_MODULE_ID]
        results.append(
            (loss.detach(), inputs.grad, embeddings.grad, {k: _number(v) for k, v in stats.items()})
        )
    (loss, logit_grad, embedding_grad, stats), reference = results
    torch.testing.assert_close(loss, reference[0], rtol=0, atol=0, equal_nan=True)
    kl = "use_kl_loss=false" not in str(overrides)
    assert bool(loss.isfinite()) == (vanishing == "old" or not kl)
    if loss.isfinite():
        torch.testing.assert_close(logit_grad, reference[1], rtol=0, atol=0)
        torch.testing.assert_close(embedding_grad, reference[2], rtol=0, atol=0)
    assert stats.keys() == reference[3].keys()
    for key, value in reference[3].items():
        assert stats[key] == value or (math.isnan(stats[key]) and math.isnan(value)), key


@pytest.mark.parametrize("bad", [None, math.inf, math.nan])
def test_a_clipped_step_with_non_finite_gradients_goes_rllibs_way(bad: float | None) -> None:
    """Our clip tells apply_gradients whether every gradient was finite; where one is not, the step
    is RLlib's (its nan/inf gradients zeroed): the weights end as RLlib's learner leaves them."""
    loaded = load_experiment("ppo_cartpole")
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    config = config.copy(copy_frozen=False).learners(learner_class=unfused(BatchedStepPPOLearner))
    spaces = {DEFAULT_MODULE_ID: (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))}
    ours, theirs = _ours_and_rllibs(config, spaces)
    generator = torch.Generator().manual_seed(0)
    gradients = [torch.randn(p.shape, generator=generator) for p in ours._params.values()]
    if bad is not None:
        gradients[1].view(-1)[0] = bad
    for learner in (ours, theirs):
        for param, gradient in zip(learner._params.values(), gradients, strict=True):
            param.grad = gradient.clone()
        learner.apply_gradients(
            learner.postprocess_gradients({pid: p.grad for pid, p in learner._params.items()})
        )
    for key, tensor in ours.module[DEFAULT_MODULE_ID].state_dict().items():
        torch.testing.assert_close(tensor, theirs.module[DEFAULT_MODULE_ID].state_dict()[key], rtol=0, atol=0)
        assert tensor.isfinite().all(), key


def _ours_and_rllibs(config: Any, spaces: dict[str, Any]) -> tuple[Any, Any]:
    """The learner ``config`` builds, and RLlib's PPO torch learner started from its state."""
    ours = config.build_learner(spaces=spaces)
    theirs = (
        config.copy(copy_frozen=False).learners(learner_class=PPOTorchLearner).build_learner(spaces=spaces)
    )
    theirs.set_state(ours.get_state())
    return ours, theirs


def _peeked(stats: dict[str, Any]) -> dict[str, Any]:
    """A nested dict of RLlib ``Stats``, each read as a number."""
    return {key: _peeked(s) if isinstance(s, dict) else _number(s.peek()) for key, s in stats.items()}


def _counts(stats: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``_peeked`` results flattened, without the timings and rates (NaN read as "nan")."""
    flat: dict[str, Any] = {}
    for key, value in stats.items():
        if "timer" in key or "throughput" in key:
            continue
        if isinstance(value, dict):
            flat |= _counts(value, f"{prefix}{key}/")
        else:
            flat[prefix + key] = "nan" if isinstance(value, float) and math.isnan(value) else value
    return flat


def _number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("minibatch_size", [4, 5, 12, 13, 30])  # dividing the batch, not, equal, over
@pytest.mark.parametrize("shuffle", [True, False])
def test_column_minibatches_are_rllibs_cyclic_minibatches(minibatch_size: int, shuffle: bool) -> None:
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

    def batch() -> MultiAgentBatch:
        columns = {"obs": torch.arange(24.0).reshape(12, 2), "actions": torch.arange(12)}
        return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=12)

    def minibatches(make: Any) -> list[dict[str, torch.Tensor]]:
        np.random.seed(7)
        iterator = MiniBatchCyclicIterator(
            batch(), num_epochs=3, minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle
        )
        return [
            dict(m.policy_batches[DEFAULT_MODULE_ID]) | {"env_steps": m.env_steps()} for m in make(iterator)
        ]

    assert ColumnMinibatches.refusal(MiniBatchCyclicIterator(batch(), minibatch_size=4)) is None
    infos = SampleBatch({"obs": torch.zeros(3), "infos": np.array([{}, {}, {}])})
    with_infos = MultiAgentBatch({DEFAULT_MODULE_ID: infos}, env_steps=3)
    assert ColumnMinibatches.refusal(MiniBatchCyclicIterator(with_infos, minibatch_size=2)) is not None
    assert ColumnMinibatches.refusal(object.__new__(MiniBatchCyclicIterator)) is not None  # another Ray's
    ours, theirs = minibatches(ColumnMinibatches), minibatches(lambda iterator: iterator)
    assert len(ours) == len(theirs) >= 3 * 12 // minibatch_size
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.keys() == reference.keys()
        for key, value in reference.items():
            assert torch.equal(torch.as_tensor(mine[key]), torch.as_tensor(value)), key


def test_ppo_in_the_driver_gives_its_runner_the_weights_in_place_as_rllib_does(ray_session: None) -> None:
    """ppo_cartpole samples in the driver: our PPO step copies the learner's weights into the runner
    in place instead of RLlib's sync_weights (numpy, object store, new tensors). Three steps of each
    from the same seed: the same learner and runner weights, weights sequence numbers and
    off-policyness statistics (which read the sequence numbers the episodes carry)."""
    from ray.rllib.algorithms.ppo.ppo import PPO
    from ray.rllib.utils.metrics import DIFF_NUM_GRAD_UPDATES_VS_SAMPLER_POLICY, LEARNER_RESULTS

    from rl_app.rllib.accel.driver import DriverPPO, local_learner

    loaded = load_experiment("ppo_cartpole", ("evaluation.interval=0",))
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    results = []
    for ours in (True, False):
        algo = config.build_algo()
        assert isinstance(algo, DriverPPO) and algo.env_runner_group.num_remote_workers() == 0
        syncs = unittest.mock.Mock(wraps=algo.env_runner_group.sync_weights)
        algo.env_runner_group.sync_weights = syncs
        try:
            for _ in range(3):
                algo.training_step() if ours else PPO.training_step(algo)
            assert syncs.call_count == (0 if ours else 3)
            learner = local_learner(algo.learner_group)
            off_policyness = algo.metrics.peek(
                (LEARNER_RESULTS, DEFAULT_MODULE_ID, DIFF_NUM_GRAD_UPDATES_VS_SAMPLER_POLICY)
            )
            results.append(
                (
                    {k: v.clone() for k, v in learner.module[DEFAULT_MODULE_ID].state_dict().items()},
                    {k: v.clone() for k, v in algo.env_runner.module.state_dict().items()},
                    (learner._weights_seq_no, algo.env_runner._weights_seq_no, off_policyness),
                )
            )
        finally:
            algo.stop()
    (weights, runner_weights, counts), (their_weights, their_runner_weights, their_counts) = results
    assert counts == their_counts and counts[0] == counts[1] > 0
    for key, tensor in weights.items():
        torch.testing.assert_close(tensor, their_weights[key], rtol=0, atol=0, msg=key)
    assert runner_weights.keys() == their_runner_weights.keys() and len(runner_weights) < len(weights)
    for key, tensor in runner_weights.items():
        torch.testing.assert_close(tensor, their_runner_weights[key], rtol=0, atol=0, msg=key)
        torch.testing.assert_close(tensor, weights[key], rtol=0, atol=0, msg=key)
