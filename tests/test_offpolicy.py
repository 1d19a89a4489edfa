"""Our array replay against RLlib's: the same episode chunks give the same n-step transitions, the
same set of drawable steps, the same importance weights for the same priorities, and, through
RLlib's learner connector, the same train batch; DQN and SAC experiments pick it and say so."""

from __future__ import annotations

import contextlib
import pickle
from typing import Any
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import unfused
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

from rl_app.cluster.resources import plan_resources
from rl_app.config import load_experiment
from rl_app.rllib.accel import plan_acceleration
from rl_app.rllib.accel.offpolicy import ArrayReplayDQN, ArrayReplaySAC
from rl_app.rllib.accel.replay_buffer import ArrayPrioritizedEpisodeReplayBuffer
from rl_app.rllib.config import algorithm_config
from rl_app.rllib.env_runner import env_runner_class

GAMMA, N_STEP, ALPHA, BETA = 0.97, 3, 0.6, 0.4


def rllib_learner_class(learner: Any) -> type:
    """The RLlib learner class ``learner``'s class derives from."""
    return next(c for c in type(learner).__mro__ if c.__module__.startswith("ray.rllib."))


def experiment_config(name: str, overrides: tuple[str, ...] = ()) -> Any:
    loaded = load_experiment(name, ("env_runners.num_envs_per_env_runner=4", *overrides))
    return algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)


def sampled_chunks(name: str, calls: int, steps: int) -> tuple[Any, list[list[Any]]]:
    """The config of ``name`` and ``calls`` lists of episode chunks from its env runner: episodes
    that end inside a call, and ones that carry on into the next call."""
    config = experiment_config(name)
    runner = env_runner_class(True, 20, fast=True)(config=config)
    return config, [runner.sample(num_timesteps=steps, random_actions=True) for _ in range(calls)]


def filled_pair(
    chunks: list[list[Any]],
) -> tuple[PrioritizedEpisodeReplayBuffer, ArrayPrioritizedEpisodeReplayBuffer]:
    theirs = PrioritizedEpisodeReplayBuffer(capacity=100_000, alpha=ALPHA)
    ours = ArrayPrioritizedEpisodeReplayBuffer(capacity=100_000, alpha=ALPHA)
    theirs.rng, ours.rng = np.random.default_rng(0), np.random.default_rng(1)
    for call in chunks:
        theirs.add(call)
        ours.add(call)
    assert ours.get_num_timesteps() == theirs.get_num_timesteps()
    return theirs, ours


def key(observation: np.ndarray, action: Any) -> tuple[bytes, bytes]:
    return np.asarray(observation).tobytes(), np.asarray(action).tobytes()


def slot_of(ours: ArrayPrioritizedEpisodeReplayBuffer) -> dict[tuple[bytes, bytes], int]:
    """Each stored step's slot, by its observation and action (no wrap-around in these buffers)."""
    columns = ours.get_state()["columns"]
    slots = {key(o, a): i for i, (o, a) in enumerate(zip(columns["obs"], columns["actions"], strict=True))}
    assert len(slots) == ours.get_num_timesteps()  # every step tells itself apart
    return slots


def rllib_draws(buffer: PrioritizedEpisodeReplayBuffer, size: int) -> list[Any]:
    return buffer.sample(num_items=size, n_step=N_STEP, gamma=GAMMA, beta=BETA)


@pytest.fixture(scope="module")
def cartpole() -> tuple[Any, list[list[Any]]]:
    return sampled_chunks("dqn_cartpole", calls=8, steps=40)


def test_each_transition_is_rllibs_n_step_transition(cartpole: tuple[Any, list[list[Any]]]) -> None:
    theirs, ours = filled_pair(cartpole[1])
    slots = slot_of(ours)
    # ~320 steps: 6,000 draws miss a given one with probability e^-19, so both cover all of them.
    drawn = rllib_draws(theirs, 6000)
    starts = np.array([slots[key(e.get_observations(0), e.get_actions(0))] for e in drawn])
    batch = ours.batch_at(starts, np.full(len(starts), N_STEP), GAMMA, BETA)
    np.testing.assert_allclose(batch["rewards"], [e.get_rewards(0) for e in drawn], rtol=1e-12)
    np.testing.assert_array_equal(batch["new_obs"], [e.get_observations(1) for e in drawn])
    np.testing.assert_array_equal(batch["terminateds"], [e.is_terminated for e in drawn])
    np.testing.assert_array_equal(batch["truncateds"], [e.is_truncated for e in drawn])
    assert batch["terminateds"].any() and not batch["terminateds"].all()

    # Which steps can be drawn at all: RLlib redraws a step whose n-step window runs past its
    # episode's stored steps; ours never returns one. Over 6,000 draws both cover every such step.
    ours_drawn = ours.sample_batch(6000, n_step=N_STEP, gamma=GAMMA, beta=BETA)
    ours_keys = {key(o, a) for o, a in zip(ours_drawn["obs"], ours_drawn["actions"], strict=True)}
    theirs_keys = {key(e.get_observations(0), e.get_actions(0)) for e in drawn}
    assert ours_keys == theirs_keys
    assert len(theirs_keys) < ours.get_num_timesteps()  # some steps (episode tails) are not drawable


def test_same_priorities_give_rllibs_importance_weights(cartpole: tuple[Any, list[list[Any]]]) -> None:
    theirs, ours = filled_pair(cartpole[1])

    def td_error(observations: np.ndarray) -> np.ndarray:  # a priority that follows the transition
        return 0.5 + np.abs(np.sin(1000 * np.asarray(observations).sum(axis=-1)))

    for _ in range(4):  # every drawable step gets td_error(step) in both buffers
        drawn = rllib_draws(theirs, 3000)
        theirs.update_priorities(td_error([e.get_observations(0) for e in drawn]))
        batch = ours.sample_batch(3000, n_step=N_STEP, gamma=GAMMA, beta=BETA)
        ours.update_priorities(td_error(batch["obs"]))
    slots = slot_of(ours)
    drawn = rllib_draws(theirs, 2000)
    starts = np.array([slots[key(e.get_observations(0), e.get_actions(0))] for e in drawn])
    weights = ours.batch_at(starts, np.full(len(starts), N_STEP), GAMMA, BETA)["weights"]
    expected = [e.get_extra_model_outputs("weights", 0) for e in drawn]
    np.testing.assert_allclose(weights, expected, rtol=1e-6)  # RLlib keeps them as float32
    assert np.ptp(weights) > 0.05  # the priorities differ, so must the weights


def test_draws_follow_the_priorities() -> None:
    _, chunks = sampled_chunks("dqn_cartpole", calls=1, steps=16)  # 4 envs x 4 steps
    ours = ArrayPrioritizedEpisodeReplayBuffer(capacity=16, alpha=0.5)
    ours.rng = np.random.default_rng(0)
    ours.add(chunks[0])
    slots = slot_of(ours)

    def slots_of(batch: dict[str, np.ndarray]) -> np.ndarray:
        return np.array([slots[key(o, a)] for o, a in zip(batch["obs"], batch["actions"], strict=True)])

    batch = ours.sample_batch(500)
    ours.update_priorities(slots_of(batch) + 1.0)  # slot i gets priority (i + 1) ** alpha
    drawn = np.concatenate([slots_of(ours.sample_batch(1000)) for _ in range(40)])
    expected = np.sqrt(np.arange(1.0, 17.0))
    np.testing.assert_allclose(
        np.bincount(drawn, minlength=16) / len(drawn), expected / expected.sum(), atol=0.01
    )


@pytest.mark.parametrize("capacity", [1, 7, 1000, 1 << 16])
def test_every_tree_node_is_its_childrens_sum_and_min_after_batched_and_single_sets(capacity: int) -> None:
    from rl_app.rllib.accel.replay_buffer import _SegmentTree

    rng = np.random.default_rng(capacity)
    trees = {
        np.add: _SegmentTree(capacity, np.add, 0.0),
        np.minimum: _SegmentTree(capacity, np.minimum, np.inf),
    }
    leaves = {np.add: np.zeros(trees[np.add].leaves), np.minimum: np.full(trees[np.add].leaves, np.inf)}
    for call in range(60):
        if call % 3 == 0:  # one step, as a single-env add
            slots = rng.integers(0, capacity, 1)
        elif call % 3 == 1:  # a contiguous run that may wrap, as a chunk's add
            slots = (rng.integers(0, capacity) + np.arange(min(capacity, 40))) % capacity
        else:  # scattered distinct slots, as a priority update
            slots = np.unique(rng.integers(0, capacity, 50))
        values = rng.random(len(slots))
        for reduce, tree in trees.items():
            tree.set(slots, values)
            leaves[reduce][slots] = values
    for reduce, tree in trees.items():
        n = tree.leaves
        np.testing.assert_array_equal(tree.nodes[n:], leaves[reduce])
        inner = np.arange(1, n)
        np.testing.assert_array_equal(
            tree.nodes[inner], reduce(tree.nodes[2 * inner], tree.nodes[2 * inner + 1])
        )


@pytest.mark.parametrize(
    ("experiment", "env_id", "calls"),
    [("dqn_cartpole", "CartPole-v1", 6), ("sac_pendulum", "Pendulum-v1", 25)],  # Pendulum: truncations
)
def test_the_train_batch_is_rllibs_learner_connector_batch(experiment: str, env_id: str, calls: int) -> None:
    config, chunks = sampled_chunks(experiment, calls=calls, steps=40)
    theirs, ours = filled_pair(chunks)
    drawn = rllib_draws(theirs, 256)
    env = gym.make(env_id)
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (env.observation_space, env.action_space)})
    expected = learner._learner_connector(
        rl_module=learner.module, batch={}, episodes=drawn, shared_data={}, metrics=learner.metrics
    )[DEFAULT_MODULE_ID]
    slots = slot_of(ours)
    starts = np.array([slots[key(e.get_observations(0), e.get_actions(0))] for e in drawn])
    batch = convert_to_torch_tensor(ours.batch_at(starts, np.full(len(starts), N_STEP), GAMMA, BETA))
    assert set(batch) == set(expected)
    for column, value in expected.items():
        assert batch[column].dtype == value.dtype, column
        torch.testing.assert_close(batch[column], value, rtol=1e-6, atol=0, msg=column)


def test_a_full_buffer_forgets_its_oldest_steps_and_keeps_every_window_whole(
    cartpole: tuple[Any, list[list[Any]]],
) -> None:
    everything = ArrayPrioritizedEpisodeReplayBuffer(capacity=100_000)
    small = ArrayPrioritizedEpisodeReplayBuffer(capacity=50)  # wraps around six times
    for call in cartpole[1]:
        everything.add(call)
        small.add(call)
    assert small.get_num_timesteps() == 50
    kept = small.get_state()["columns"]["obs"]
    np.testing.assert_array_equal(kept, everything.get_state()["columns"]["obs"][-50:])
    batch = small.sample_batch(2000, n_step=N_STEP, gamma=GAMMA)
    slots = slot_of(everything)
    starts = np.array([slots[key(o, a)] for o, a in zip(batch["obs"], batch["actions"], strict=True)])
    full = everything.batch_at(starts, batch["n_step"], GAMMA, 0.0)
    for column in ("rewards", "new_obs", "terminateds", "truncateds"):
        np.testing.assert_array_equal(batch[column], full[column], err_msg=column)


def test_state_round_trips_and_rllibs_buffer_state_is_taken_over(
    cartpole: tuple[Any, list[list[Any]]],
) -> None:
    theirs, ours = filled_pair(cartpole[1])
    ours.sample_batch(64, n_step=N_STEP)
    ours.update_priorities(np.linspace(0.1, 3.0, 64))
    restored = ArrayPrioritizedEpisodeReplayBuffer(capacity=100_000, alpha=ALPHA)
    restored.rng = np.random.default_rng(7)  # set_state keeps the (seeded) sampling RNG
    restored.set_state(pickle.loads(pickle.dumps(ours.get_state())))
    ours.rng = np.random.default_rng(7)
    one, two = ours.sample_batch(256, n_step=N_STEP), restored.sample_batch(256, n_step=N_STEP)
    for column in one:
        np.testing.assert_array_equal(one[column], two[column], err_msg=column)
    ours_bytes, theirs_bytes = len(pickle.dumps(ours.get_state())), len(pickle.dumps(theirs.get_state()))
    assert ours_bytes * 10 < theirs_bytes, (ours_bytes, theirs_bytes)

    # A checkpoint of a run that replayed through RLlib's buffer: its steps, each drawable one alike.
    taken_over = ArrayPrioritizedEpisodeReplayBuffer(capacity=100_000, alpha=ALPHA)
    taken_over.set_state(theirs.get_state())
    assert taken_over.get_num_timesteps() == theirs.get_num_timesteps()
    drawn = rllib_draws(theirs, 500)
    slots = slot_of(taken_over)
    starts = np.array([slots[key(e.get_observations(0), e.get_actions(0))] for e in drawn])
    batch = taken_over.batch_at(starts, np.full(len(starts), N_STEP), GAMMA, BETA)
    np.testing.assert_array_equal(batch["new_obs"], [e.get_observations(1) for e in drawn])
    np.testing.assert_allclose(batch["rewards"], [e.get_rewards(0) for e in drawn], rtol=1e-12)


def test_dqn_and_sac_choose_the_array_buffer_and_say_so() -> None:
    for name, algorithm in (("dqn_cartpole", ArrayReplayDQN), ("sac_pendulum", ArrayReplaySAC)):
        plan = plan_acceleration(load_experiment(name).config)
        assert plan.uses("replay_buffer") and plan.uses("training_step") and plan.uses("learner")
        config = experiment_config(name)
        assert config.algo_class is algorithm

    forced = ("training.replay_buffer.implementation=rllib",)
    plan = plan_acceleration(load_experiment("dqn_cartpole", forced).config)
    assert "RLlib's replay buffer (training.replay_buffer.implementation: rllib)" in plan.describe()
    config = experiment_config("dqn_cartpole", forced)
    assert config.algo_class.__name__ == "DQN"
    uniform = load_experiment("dqn_cartpole", ("training.replay_buffer={type: EpisodeReplayBuffer}",))
    assert (
        plan_acceleration(uniform.config).off["replay_buffer"]
        == "training.replay_buffer.type EpisodeReplayBuffer"
    )
    assert "replay_buffer" not in plan_acceleration(load_experiment("ppo_cartpole").config).as_dict()["off"]


def test_one_learner_call_over_a_rounds_minibatches_is_those_updates_in_turn() -> None:
    """Uniform replay's round (alpha 0): one learner call over k pre-drawn minibatches leaves the
    same weights and optimizer state as k learner calls, one per minibatch."""
    config, chunks = sampled_chunks("dqn_cartpole", calls=3, steps=64)
    buffer = ArrayPrioritizedEpisodeReplayBuffer(capacity=1000, alpha=0.0)
    buffer.rng = np.random.default_rng(3)
    buffer.add([chunk for call in chunks for chunk in call])
    minibatch, rounds = 32, 4
    columns = buffer.sample_batch(minibatch * rounds, n_step=N_STEP, gamma=GAMMA)
    env = gym.make("CartPole-v1")
    spaces = {DEFAULT_MODULE_ID: (env.observation_space, env.action_space)}
    one_call, in_turn = config.build_learner(spaces=spaces), config.build_learner(spaces=spaces)
    in_turn.set_state(one_call.get_state())
    before = {name: t.clone() for name, t in one_call.module[DEFAULT_MODULE_ID].state_dict().items()}
    timesteps = {"num_env_steps_sampled_lifetime": 0}  # no target-network sync in either

    def batch(rows: slice) -> MultiAgentBatch:
        return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({k: v[rows] for k, v in columns.items()})}, 0)

    one_call.update(batch=batch(slice(None)), minibatch_size=minibatch, num_epochs=1, timesteps=timesteps)
    for start in range(0, minibatch * rounds, minibatch):
        in_turn.update(batch=batch(slice(start, start + minibatch)), timesteps=timesteps)
    after_one, after_turn = (
        learner.module[DEFAULT_MODULE_ID].state_dict() for learner in (one_call, in_turn)
    )
    assert any(not torch.equal(before[name], after_one[name]) for name in before)  # it did learn
    for name, tensor in after_one.items():
        torch.testing.assert_close(tensor, after_turn[name], rtol=0, atol=0, msg=name)


def test_the_local_runner_acts_with_the_learners_weights_after_each_update(ray_session: None) -> None:
    """With the learner and the only runner in this process, weights are copied in place; after
    training the runner's (inference-only) module holds exactly the learner's weights."""
    config = experiment_config(
        "sac_pendulum",
        ("training.num_steps_sampled_before_learning_starts=64", "evaluation.interval=0"),
    )
    algo = config.build_algo()
    try:
        runner_module = algo.env_runner.module
        before = {name: t.clone() for name, t in runner_module.state_dict().items()}
        while algo.train()["learners"][DEFAULT_MODULE_ID]["num_module_steps_trained"] == 0:
            pass
        learner_state = algo.learner_group.get_state(components="learner/rl_module", inference_only=True)
        weights = learner_state["learner"]["rl_module"][DEFAULT_MODULE_ID]
        after = runner_module.state_dict()
        assert set(after) == set(weights)
        assert any(not torch.equal(before[name], after[name]) for name in before)  # it was updated
        for name, tensor in after.items():
            torch.testing.assert_close(tensor, torch.as_tensor(weights[name]), rtol=0, atol=0, msg=name)
    finally:
        algo.stop()


def update_in_turn(
    buffer: ArrayPrioritizedEpisodeReplayBuffer,
    learners: tuple[Any, ...],
    context: Any = lambda learner: contextlib.nullcontext(),
) -> None:
    """Three updates on 32 replayed transitions each, every learner in turn on the same batch from
    the same torch seed (SAC's loss samples actions), inside ``context(learner)``; every step syncs
    the targets (SAC: tau 0.005; DQN: a full copy)."""
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    for step in range(1, 4):
        columns = buffer.sample_batch(32, n_step=1, gamma=0.99)
        batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, 32)
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: step * 10_000}
        for learner in learners:
            torch.manual_seed(step)
            with context(learner):
                learner.update(batch=batch, timesteps=timesteps)


@pytest.mark.parametrize("name", ["sac_pendulum", "dqn_cartpole"])
def test_our_learner_updates_exactly_as_rllibs(name: str) -> None:
    """The same state and batches through RLlib's torch learner and ours (one finiteness check for
    all gradients, the target average as multi-tensor ops, SAC's one backward pass): bit-equal
    weights, targets included, with RLlib's Adam kept (equal to rounding with the fused one), and a
    step with a nan gradient handed to RLlib's own handling."""

    from rl_app.rllib.accel.gradient_step import all_finite
    from rl_app.rllib.accel.offpolicy_learners import BatchedStepDQNLearner, BatchedStepSACLearner

    assert all_finite([torch.ones(3), torch.zeros(2, 2)])
    assert not all_finite([torch.ones(3), torch.tensor([0.0, float("inf")])])
    config, chunks = sampled_chunks(name, calls=2, steps=64)
    assert config.learner_class in (BatchedStepDQNLearner, BatchedStepSACLearner)
    buffer = ArrayPrioritizedEpisodeReplayBuffer(capacity=1000, alpha=0.0)
    buffer.rng = np.random.default_rng(5)
    buffer.add([chunk for call in chunks for chunk in call])
    env = gym.make("Pendulum-v1" if name == "sac_pendulum" else "CartPole-v1")
    spaces = {DEFAULT_MODULE_ID: (env.observation_space, env.action_space)}
    ours = config.build_learner(spaces=spaces)
    rllib_class = rllib_learner_class(ours)
    assert all(optimizer.defaults["fused"] for optimizer in ours._named_optimizers.values())
    theirs = config.copy(copy_frozen=False).learners(learner_class=rllib_class).build_learner(spaces=spaces)
    exact = (
        config.copy(copy_frozen=False)
        .learners(learner_class=unfused(type(ours)))
        .build_learner(spaces=spaces)
    )
    for learner in (theirs, exact):
        learner.set_state(ours.get_state())
    update_in_turn(buffer, (exact, theirs, ours))
    mine, reference, fused = (
        learner.module[DEFAULT_MODULE_ID].state_dict() for learner in (exact, theirs, ours)
    )
    assert any("target" in key for key in mine)
    for key, tensor in mine.items():
        torch.testing.assert_close(tensor, reference[key], rtol=0, atol=0, msg=key)
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)

    for learner in (exact, theirs):
        poisoned = {pid: torch.ones_like(p) for pid, p in learner._params.items()}
        poisoned[next(iter(poisoned))][0] = float("nan")
        learner.apply_gradients(poisoned)
    mine, reference = (learner.module[DEFAULT_MODULE_ID].state_dict() for learner in (exact, theirs))
    for key, tensor in mine.items():
        torch.testing.assert_close(tensor, reference[key], rtol=0, atol=0, msg=key, equal_nan=True)
    env.close()


def test_the_squared_critic_loss_is_rllibs_update_with_half_the_squared_td_error() -> None:
    """``training.critic_loss: mse``: the same state and batches through our learner, and through
    RLlib's own SAC learner with its Huber loss widened until every TD error falls inside it (delta
    1e30: half the squared error, computed by torch's Huber), give bit-equal weights, targets
    included; RLlib's Huber of delta 1 gives other weights on the same batches."""

    from rl_app.rllib.accel.offpolicy_learners import BatchedStepSACLearner

    config = experiment_config("sac_pendulum", ("training.critic_loss=mse",))
    assert config.learner_class is BatchedStepSACLearner
    assert config.learner_config_dict == {"critic_loss": "mse"}
    _, chunks = sampled_chunks("sac_pendulum", calls=2, steps=64)
    buffer = ArrayPrioritizedEpisodeReplayBuffer(capacity=1000, alpha=0.0)
    buffer.rng = np.random.default_rng(5)
    buffer.add([chunk for call in chunks for chunk in call])
    env = gym.make("Pendulum-v1")
    spaces = {DEFAULT_MODULE_ID: (env.observation_space, env.action_space)}
    ours = (
        config.copy(copy_frozen=False)
        .learners(learner_class=unfused(BatchedStepSACLearner))
        .build_learner(spaces=spaces)
    )
    rllib_class = rllib_learner_class(ours)
    widened, huber = (
        config.copy(copy_frozen=False).learners(learner_class=rllib_class).build_learner(spaces=spaces)
        for _ in range(2)
    )
    for learner in (widened, huber):
        learner.set_state(ours.get_state())
    huber_loss = torch.nn.HuberLoss

    def wide(reduction: str, delta: float) -> torch.nn.Module:
        assert delta == 1.0  # RLlib's, widened here
        return huber_loss(reduction=reduction, delta=1e30)

    update_in_turn(
        buffer,
        (ours, widened, huber),
        lambda learner: (
            mock.patch("torch.nn.HuberLoss", wide) if learner is widened else contextlib.nullcontext()
        ),
    )
    mine, reference, rllibs = (
        learner.module[DEFAULT_MODULE_ID].state_dict() for learner in (ours, widened, huber)
    )
    assert any("target" in key for key in mine)
    for key, tensor in mine.items():
        torch.testing.assert_close(tensor, reference[key], rtol=0, atol=0, msg=key)
    assert any(not torch.equal(tensor, rllibs[key]) for key, tensor in mine.items() if "qf" in key)
    env.close()


def flattened(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """A nested dict's leaves by key path."""
    flat: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flattened(value, (*prefix, key)))
        else:
            flat[(*prefix, key)] = value
    return flat


def flat_results(results: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """Reduced metrics as {key path: numpy value}, less the throughputs (rates over wall time)."""
    flat = {}
    for key, value in flattened(results).items():
        if not key[-1].endswith("_throughput"):
            value = value.peek() if hasattr(value, "peek") else value  # a learner's reduce gives Stats
            flat[key] = np.asarray(value.numpy() if torch.is_tensor(value) else value)
    return flat


@pytest.mark.parametrize("name", ["sac_pendulum", "dqn_cartpole"])
def test_the_lean_update_is_rllibs_update_with_its_metrics_logged_once(name: str) -> None:
    """Our learner's update from replayed columns (no training data, iterator or tree conversion;
    its per-update counters, window-1 values and learning rates logged once per training step)
    against ``Learner.update`` on the same batches: bit-equal weights and targets, and the same
    reduced metrics, step counts, losses, TD errors, target updates and learning rates."""
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    from rl_app.rllib.accel.offpolicy import as_multi_agent_batch

    config, chunks = sampled_chunks(name, calls=2, steps=64)
    buffer = ArrayPrioritizedEpisodeReplayBuffer(capacity=1000, alpha=0.0)
    buffer.rng = np.random.default_rng(7)
    buffer.add([chunk for call in chunks for chunk in call])
    env = gym.make("Pendulum-v1" if name == "sac_pendulum" else "CartPole-v1")
    spaces = {DEFAULT_MODULE_ID: (env.observation_space, env.action_space)}
    lean, full = config.build_learner(spaces=spaces), config.build_learner(spaces=spaces)
    full.set_state(lean.get_state())
    assert lean.lean_update_refusal() is None
    for learner in (lean, full):  # as after restoring optimizers saved with another rate
        for optimizer in learner._named_optimizers.values():
            learner._set_optimizer_lr(optimizer, lr=0.05)
    updates = 7  # some rates' mean over 7 copies is not the rate to the last bit
    for step in range(1, updates + 1):  # DQN's targets copied at some steps, SAC's averaged at each
        columns = buffer.sample_batch(32, n_step=1, gamma=0.99)
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: (step // 2) * 10_000 + step}
        torch.manual_seed(step)  # SAC's loss samples actions
        lean.update_from_columns(columns, timesteps)
        torch.manual_seed(step)
        full.update(batch=as_multi_agent_batch(columns), timesteps=timesteps, _no_metrics_reduce=True)
    for key, tensor in lean.module[DEFAULT_MODULE_ID].state_dict().items():
        torch.testing.assert_close(
            tensor, full.module[DEFAULT_MODULE_ID].state_dict()[key], rtol=0, atol=0, msg=key
        )
    with pytest.raises(ValueError, match="one size per training step"):
        lean.update_from_columns(buffer.sample_batch(16, n_step=1, gamma=0.99), timesteps)
    lean.log_update_totals()
    lean.log_update_totals()  # nothing kept since: logs nothing (the counts would double)
    ours, theirs = flat_results(lean.metrics.reduce()), flat_results(full.metrics.reduce())
    assert set(ours) == set(theirs)
    assert ours[(DEFAULT_MODULE_ID, "num_module_steps_trained")] == updates * 32
    assert ours[(DEFAULT_MODULE_ID, "num_target_updates")] > 0
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=str(key))
    env.close()


@pytest.mark.parametrize("name", ["dqn_cartpole", "sac_pendulum"])
def test_a_training_step_in_one_process_is_rllibs_rounds_in_turn(ray_session: None, name: str) -> None:
    """With the runner and the learner in the driver, one training step runs an iteration's rounds
    inside one learner call, the runner's steps going to the buffer as transitions, and collects
    metrics once: the same env steps, stored steps, replay draws (SAC's made prioritized, so its TD
    errors must reach the priorities), weights, runner weights and learner results as running
    RLlib's rounds (episodes from the runner, learner-group update, metrics per round) one after
    another."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    overrides = ("training.num_steps_sampled_before_learning_starts=64", "evaluation.interval=0")
    if name == "sac_pendulum":  # rounds of 20 steps: several lean updates in the training step
        overrides += ("env_runners.rollout_fragment_length=5", "training.replay_buffer.alpha=1.0")
    lifetime = (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
    results = []
    for in_one_process in (True, False):
        algo = experiment_config(name, overrides).build_algo()  # reseeds torch's and numpy's RNGs
        try:
            if in_one_process:
                learner = algo.learner_group._learner
                with mock.patch.object(
                    learner, "update_from_columns", wraps=learner.update_from_columns
                ) as lean:
                    algo.training_step()
                assert algo.env_runner._open_episodes is not None  # it sampled transitions, not episodes
                # One minibatch per update (SAC's prioritized replay) takes the lean update; DQN's
                # round of uniform minibatches one learner.update call.
                assert lean.call_count > 1 if name == "sac_pendulum" else not lean.called
                steps = algo.metrics.peek(lifetime)
                assert steps >= algo.config.min_sample_timesteps_per_iteration > 64
                assert algo.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, "num_module_steps_trained")) > 0
            else:
                while algo.metrics.peek(lifetime, default=0) < steps:
                    algo._round(algo._sample_from_runners, algo._update_learner_group, algo._sync_runners)
                assert algo.metrics.peek(lifetime) == steps
            learner_state = algo.learner_group.get_state(components="learner/rl_module")
            weights = learner_state["learner"]["rl_module"][DEFAULT_MODULE_ID]
            runner_weights = {k: v.clone() for k, v in algo.env_runner.module.state_dict().items()}
            # The runner's weights sequence number, which its next episodes carry: as RLlib's sync sets it.
            seq_no = algo.env_runner._weights_seq_no
            # RLlib's stats kept with window 1 (losses, Q values, the weights' number)
            window_one = {
                k
                for k, v in flattened(algo.metrics.stats[LEARNER_RESULTS]).items()
                if getattr(v, "_window", 0) == 1
            }
            learner_results = flat_results(algo.metrics.reduce()[LEARNER_RESULTS])
            buffer_state = algo.local_replay_buffer.get_state()
            results.append((weights, runner_weights, seq_no, buffer_state, learner_results, window_one))
        finally:
            algo.stop()
    (
        (weights, runner_weights, seq_no, buffer, learner_results, _),
        (their_weights, their_runner_weights, their_seq_no, their_buffer, their_learner_results, window_one),
    ) = results
    # The same learner results: step counts, target updates, learning rates, batch sizes. Window-1
    # stats are the last update's here, where RLlib's root logger averages each round's last.
    assert set(learner_results) == set(their_learner_results)
    assert (DEFAULT_MODULE_ID, "qf_loss") in window_one
    for key, value in their_learner_results.items():
        if key not in window_one:
            np.testing.assert_array_equal(learner_results[key], value, err_msg=str(key))
    for key, value in weights.items():
        np.testing.assert_array_equal(value, their_weights[key], err_msg=key)
    assert seq_no == their_seq_no > 0
    for key, tensor in runner_weights.items():
        torch.testing.assert_close(tensor, their_runner_weights[key], rtol=0, atol=0, msg=key)
        torch.testing.assert_close(tensor, torch.as_tensor(weights[key]), rtol=0, atol=0, msg=key)
    np.testing.assert_array_equal(buffer["priority"], their_buffer["priority"])
    np.testing.assert_array_equal(buffer["successor"], their_buffer["successor"])
    for column, values in buffer["columns"].items():
        np.testing.assert_array_equal(values, their_buffer["columns"][column], err_msg=column)
    if name == "sac_pendulum":  # prioritized (dqn_cartpole: uniform): TD errors became priorities
        assert len(np.unique(buffer["priority"])) > 10


@pytest.mark.parametrize("name", ["dqn_cartpole", "sac_pendulum"])
def test_the_in_process_step_keeps_rllibs_own_training_step_schedule(ray_session: None, name: str) -> None:
    """Against RLlib's own DQN/SAC (``acceleration: off``: its training step, episode buffer and
    learner): over several iterations, the same env steps sampled, rows trained, target updates
    and learner result keys. (Their replay draws come from different RNG streams, so the weights
    part ways after the first update; the equal-draws comparison is the test above.)"""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        LEARNER_RESULTS,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
        NUM_MODULE_STEPS_TRAINED_LIFETIME,
        NUM_TARGET_UPDATES,
    )

    overrides = ("training.num_steps_sampled_before_learning_starts=64", "evaluation.interval=0")
    schedules = []
    for acceleration in ("auto", "off"):
        config = experiment_config(name, (*overrides, f"acceleration={acceleration}"))
        assert (config.algo_class.__module__.startswith("rl_app.")) == (acceleration == "auto")
        algo = config.build_algo()
        try:
            rows = []
            for _ in range(4):
                result = algo.train()
                learner = result[LEARNER_RESULTS][DEFAULT_MODULE_ID] if LEARNER_RESULTS in result else {}
                rows.append(
                    (
                        result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME],
                        learner.get(NUM_MODULE_STEPS_TRAINED_LIFETIME),
                        learner.get(NUM_TARGET_UPDATES),
                        algo.local_replay_buffer.get_num_timesteps(),
                        sorted(learner),
                    )
                )
        finally:
            algo.stop()
        schedules.append(rows)
    ours, theirs = schedules
    for mine, other in zip(ours, theirs, strict=True):
        # A call's last vector step adds up to one step per env: once the policies differ, so do
        # the envs that reset, and the totals by a few steps.
        assert abs(mine[0] - other[0]) <= 4 * 8, (mine[0], other[0])
        assert mine[3] == mine[0] and other[3] == other[0]  # every sampled step stored
        assert mine[1:3] == other[1:3] and mine[4] == other[4]  # rows trained, target updates, keys
    assert ours[-1][1] > 0 and ours[-1][2] > 0  # it did train and move its targets


@pytest.mark.parametrize(
    ("name", "overrides", "schedule", "updates_per_step"),
    [
        ("sac_pendulum", (), "1 update of 256 rows per env step", 1.0),
        # RLlib's round is n_step's largest step count when rollout_fragment_length is auto.
        ("sac_pendulum", ("training.n_step=[2,5]",), "1 update of 256 rows per 5 env steps", 0.2),
        ("dqn_cartpole", (), "64 updates of 128 rows per 256 env steps", 0.25),
    ],
)
def test_a_run_says_how_often_it_updates_and_updates_that_often(
    ray_session: None, name: str, overrides: tuple[str, ...], schedule: str, updates_per_step: float
) -> None:
    """The Replay line (and config.yaml's replay_schedule) against the updates an iteration makes."""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        LEARNER_RESULTS,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
        NUM_MODULE_STEPS_TRAINED_LIFETIME,
    )

    from rl_app.rllib.config import replay_schedule, resolved_settings

    loaded = load_experiment(
        name, ("training.num_steps_sampled_before_learning_starts=0", "evaluation.interval=0", *overrides)
    )
    plan = plan_resources(loaded.config, 2, 0)
    config = algorithm_config(loaded.config, plan, loaded.source)
    assert replay_schedule(loaded.config, config) == schedule
    assert resolved_settings(loaded.config, config, plan)["replay_schedule"] == schedule
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    steps = result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME]
    updates = result[LEARNER_RESULTS][DEFAULT_MODULE_ID][NUM_MODULE_STEPS_TRAINED_LIFETIME] / (
        config.total_train_batch_size
    )
    assert steps >= 100
    assert updates / steps == pytest.approx(updates_per_step, rel=0.05)


def test_on_policy_runs_say_nothing_of_replay() -> None:
    from rl_app.rllib.config import replay_schedule, resolved_settings

    loaded = load_experiment("ppo_cartpole")
    plan = plan_resources(loaded.config, 2, 0)
    config = algorithm_config(loaded.config, plan, loaded.source)
    assert replay_schedule(loaded.config, config) is None
    assert "replay_schedule" not in resolved_settings(loaded.config, config, plan)
