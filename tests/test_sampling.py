"""The batched runner against RLlib's runner: same config, seeds and weights give the same
episodes (observations, actions, rewards, boundaries, lookback, extra model outputs) and the same
metrics, for every algorithm it serves; experiments it does not fit say so and use RLlib's."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from rich.console import Console

from rl_app.cluster.resources import plan_resources
from rl_app.config import load_experiment
from rl_app.rllib.accel import plan_acceleration
from rl_app.rllib.accel.runner import BatchedEnvRunner
from rl_app.rllib.config import algorithm_config, describe_rllib_setup
from rl_app.rllib.env_runner import env_runner_class

TESTS = Path(__file__).resolve().parent
EPISODE_METRICS = ("episode_return_mean", "episode_len_mean", "num_env_steps_sampled", "num_episodes")


def runner_pair(name: str, overrides: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """Our runner and RLlib's (through RLAppEnvRunner), built from one config, same weights."""
    loaded = load_experiment(name, ("env_runners.num_envs_per_env_runner=4", *overrides))
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    ours = env_runner_class(True, 20, fast=True)(config=config)
    theirs = env_runner_class(True, 20, fast=False)(config=config)
    assert isinstance(ours, BatchedEnvRunner) and not isinstance(theirs, BatchedEnvRunner)
    theirs.set_state(ours.get_state())
    return ours, theirs


def episode_data(episode: Any) -> dict[str, Any]:
    return {
        "id": episode.id_,
        "t_started": episode.t_started,
        "observation_space": episode.observation_space,
        "len": len(episode),
        "terminated": episode.is_terminated,
        "truncated": episode.is_truncated,
        "lookback": (episode.observations.lookback, episode.actions.lookback, episode.rewards.lookback),
        "observations": episode.get_observations(),
        "actions": episode.get_actions(),
        "rewards": episode.get_rewards(),
        "infos": episode.get_infos(),
        **{f"extra.{k}": episode.get_extra_model_outputs(k) for k in sorted(episode.extra_model_outputs)},
    }


def assert_same_episodes(ours: list[Any], theirs: list[Any], ids: dict[str, str]) -> None:
    assert [len(e) for e in ours] == [len(e) for e in theirs]
    for mine, other in zip(map(episode_data, ours), map(episode_data, theirs), strict=True):
        # Ids are random; the same episode must keep one id across calls, in both.
        assert ids.setdefault(mine.pop("id"), other["id"]) == other.pop("id")
        assert mine.keys() == other.keys()
        for key, value in mine.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == other[key].dtype, key
                np.testing.assert_array_equal(value, other[key], err_msg=key)
            else:
                assert value == other[key], key


# Exploring, then greedy (inference), then exploring again. SAC stays exploring: its greedy
# log-probs have another shape, which RLlib's own runner cannot put in one episode either.
MIXED, EXPLORING, GREEDY = [True, True, False, True], [True, True, True], [False, False, False]


def ended_episodes(state: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Return and length of every episode that ended in a buffer that holds all its steps, in the
    order they ended: the episodes are the chains of successor links."""
    successor = state["successor"] - (state["added"] - len(state["successor"]))  # serial -> row
    columns = state["columns"]
    heads = sorted(set(range(len(successor))) - set(successor[successor >= 0].tolist()))
    ended = []
    for row in heads:
        chain = [row]
        while successor[chain[-1]] >= 0:
            chain.append(int(successor[chain[-1]]))
        if columns["terminated"][chain[-1]] or columns["truncated"][chain[-1]]:
            ended.append((chain[-1], float(columns["rewards"][chain].sum()), len(chain)))
    ended.sort()  # by the row of the last step: the order of ending
    return [r for _, r, _ in ended], [n for _, _, n in ended]


@pytest.mark.parametrize(
    ("experiment", "calls", "overrides"),
    [
        ("ppo_cartpole", MIXED, ()),  # CartPole's own vector env (one numpy step for all envs)
        ("ppo_cartpole", MIXED, ("env_runners.vectorize=sync",)),  # gymnasium's SyncVectorEnv
        ("appo_cartpole", MIXED, ()),
        ("dqn_cartpole", MIXED, ()),  # epsilon-greedy inside the module, from the step count
        ("sac_pendulum", EXPLORING, ()),  # squashed Gaussian, unsquashed to the bounds, truncated episodes
        ("sac_pendulum", GREEDY, ()),
        ("ppo_catch", MIXED, ()),
        # uint8 frames from ale-py's vector env (C++ threads); one env, so that a game ends
        ("ppo_pong", MIXED, ("env_runners.num_envs_per_env_runner=1",)),
        # RLlib's MeanStdFilter connector, its statistics compared too; one env, so that an episode ends
        ("ppo_halfcheetah", [True] * 4, ("env_runners.num_envs_per_env_runner=1",)),
    ],
)
def test_same_weights_and_seeds_give_rllibs_episodes_and_metrics(
    experiment: str, calls: list[bool], overrides: tuple[str, ...], shipped: Path
) -> None:
    import torch

    ours, theirs = runner_pair(experiment, overrides)
    ids: dict[str, str] = {}
    continued, sampled = False, 0
    for call, explore in enumerate(calls):
        torch.manual_seed(call)
        mine = ours.sample(num_timesteps=282, explore=explore)
        sampled += sum(len(e) for e in mine)
        torch.manual_seed(call)
        other = theirs.sample(num_timesteps=282, explore=explore)
        assert_same_episodes(mine, other, ids)
        continued |= any(len(e) and e.t_started > 0 for e in mine)
    assert continued, "no episode continued across calls"
    my_metrics, their_metrics = ours.get_metrics(), theirs.get_metrics()
    for key in EPISODE_METRICS:
        assert my_metrics[key].peek() == their_metrics[key].peek(), key
    assert my_metrics["num_episodes"].peek() > 0
    mine_state, their_state = ours.get_state(), theirs.get_state()
    assert mine_state["num_env_steps_sampled_lifetime"] == their_state["num_env_steps_sampled_lifetime"]
    # The env-to-module connectors' states: a MeanStdFilter's running statistics, where there is one.
    np.testing.assert_equal(mine_state["env_to_module_connector"], their_state["env_to_module_connector"])
    if "MeanStdFilter" in mine_state["env_to_module_connector"]:
        (stats, *_) = mine_state["env_to_module_connector"]["MeanStdFilter"][None]["running_stats"]
        assert stats["num_pushes"] > sampled  # every step's observation, and each reset's


@pytest.mark.parametrize(
    ("experiment", "calls"),
    [
        ("ppo_cartpole", [False, True, False]),  # greedy (evaluation), exploring, greedy
        ("dqn_cartpole", [False, True]),
        ("sac_pendulum", [False, False]),
        ("ppo_catch", [False, True]),
    ],
)
def test_whole_episodes_as_evaluation_samples_them_are_rllibs_too(
    experiment: str, calls: list[bool], shipped: Path
) -> None:
    """``sample(num_episodes=...)``, evaluation's call: fresh envs every call, complete episodes only,
    the first to finish in env order; a timestep call after it starts from fresh envs as well."""
    import torch

    ours, theirs = runner_pair(experiment)
    ids: dict[str, str] = {}
    for call, explore in enumerate(calls):
        torch.manual_seed(call)
        mine = ours.sample(num_episodes=6, explore=explore)
        torch.manual_seed(call)
        other = theirs.sample(num_episodes=6, explore=explore)
        assert len(mine) == 6 and all(e.is_done and e.t_started == 0 for e in mine)
        assert_same_episodes(mine, other, ids)
    torch.manual_seed(len(calls))
    mine = ours.sample(num_timesteps=60, explore=True)
    torch.manual_seed(len(calls))
    assert_same_episodes(mine, theirs.sample(num_timesteps=60, explore=True), ids)
    my_metrics, their_metrics = ours.get_metrics(), theirs.get_metrics()
    for key in EPISODE_METRICS:
        assert my_metrics[key].peek() == their_metrics[key].peek(), key


def test_a_failing_env_is_recreated_the_same_way(shipped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.syspath_prepend(str(TESTS))
    overrides = ("env.id=faulty_env:CrashingCartPole", "env.config={crash: always, after_steps: 45}")
    ours, theirs = runner_pair("ppo_cartpole", overrides)
    ids: dict[str, str] = {}
    for call in range(3):  # 25 steps per env and call: the second call meets the failure
        torch.manual_seed(call)
        mine = ours.sample(num_timesteps=100, explore=True)
        torch.manual_seed(call)
        assert_same_episodes(mine, theirs.sample(num_timesteps=100, explore=True), ids)
    assert ours.get_metrics()["num_env_step_failures"].peek() > 0  # counted per get_metrics() call
    theirs.get_metrics()
    torch.manual_seed(3)  # whole episodes (evaluation) through a failure: the failed ones dropped
    mine = ours.sample(num_episodes=30, explore=False)
    torch.manual_seed(3)
    assert_same_episodes(mine, theirs.sample(num_episodes=30, explore=False), ids)
    assert ours.get_metrics()["num_env_step_failures"].peek() > 0


def assert_same_replay(transitions: Any, episodes: Any) -> None:
    """Two array buffers hold the same steps, links and priorities (episode ids are random)."""
    for key, value in transitions.items():
        if key == "columns":
            assert value.keys() == episodes[key].keys()
            for name, column in value.items():
                assert column.dtype == episodes[key][name].dtype, name
                np.testing.assert_array_equal(column, episodes[key][name], err_msg=name)
        elif key == "open_episodes":
            assert sorted(value.values()) == sorted(episodes[key].values())
        else:
            np.testing.assert_array_equal(value, episodes[key], err_msg=key)


LONG_CALLS = [1, 7, 282, 282, 282, 3]  # 1 and 3: fewer steps than envs


@pytest.mark.parametrize(
    ("experiment", "calls", "overrides"),
    [
        ("dqn_cartpole", LONG_CALLS, ()),  # short episodes: many end inside a call
        ("sac_pendulum", LONG_CALLS, ()),  # truncated at 200 steps, continuous actions unsquashed
        ("sac_pendulum", LONG_CALLS, ("env_runners.observation_filter=MeanStdFilter",)),  # filtered rows
        (  # every env fails 45 steps into its life: calls of 25 steps per env meet it
            "dqn_cartpole",
            [1, 7, 100, 100, 100, 3],
            ("env.id=faulty_env:CrashingCartPole", "env.config={crash: always, after_steps: 45}"),
        ),
    ],
)
def test_transitions_are_the_steps_of_rllibs_episodes_in_their_order(
    experiment: str,
    calls: list[int],
    overrides: tuple[str, ...],
    shipped: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The off-policy step's path (rows straight into the replay buffer) stores what RLlib's runner's
    episode chunks store, in the same order, and leaves the same episode metrics."""
    import torch

    from rl_app.rllib.accel.replay_buffer import ArrayPrioritizedEpisodeReplayBuffer

    monkeypatch.syspath_prepend(str(TESTS))
    ours, theirs = runner_pair(experiment, overrides)
    assert ours.transition_refusal() is None
    # After an env failure RLlib's runner counts, of each episode ended since its last
    # get_metrics(), only the chunk of the call it ended in (its reset forgets the earlier
    # chunks); ours counts whole episodes (checked below against the buffer).
    failing = any("faulty_env" in override for override in overrides)
    exact = ("num_env_steps_sampled", "num_episodes") if failing else EPISODE_METRICS
    # One buffer as large as the run, one that a call's rows overflow (both keep the newest steps).
    buffers = [
        (ArrayPrioritizedEpisodeReplayBuffer(size), ArrayPrioritizedEpisodeReplayBuffer(size))
        for size in (5_000, 150)
    ]
    for call, steps in enumerate(calls):
        torch.manual_seed(call)
        transitions = ours.sample_transitions(steps)
        torch.manual_seed(call)
        episodes = theirs.sample(num_timesteps=steps, explore=True)
        for by_transitions, by_episodes in buffers:
            assert by_transitions.add(transitions) == by_episodes.add(episodes) >= steps
        if call == 2:  # metrics read between calls
            midway = ours.get_metrics()
            assert_same_metrics(midway, theirs.get_metrics(), exact)
    for by_transitions, by_episodes in buffers:
        assert_same_replay(by_transitions.get_state(), by_episodes.get_state())
    everything = buffers[0][0].get_state()
    assert everything["open_episodes"], "no episode continued across calls"
    my_metrics = ours.get_metrics()
    assert_same_metrics(my_metrics, theirs.get_metrics(), exact)
    returns, lengths = ended_episodes(everything)
    ended_before = int(midway["num_episodes"].peek()) if "num_episodes" in midway else 0
    returns, lengths = returns[ended_before:], lengths[ended_before:]  # those since the last reading
    assert my_metrics["num_episodes"].peek() == len(returns) > 0
    assert my_metrics["episode_return_mean"].peek() == pytest.approx(np.mean(returns[-100:]))
    assert my_metrics["episode_len_mean"].peek() == pytest.approx(np.mean(lengths[-100:]))
    if failing:
        assert my_metrics["num_env_step_failures"].peek() > 0
    np.testing.assert_equal(
        ours.get_state()["env_to_module_connector"], theirs.get_state()["env_to_module_connector"]
    )
    assert buffers[0][0].add(ours.sample_transitions(0)) == 0
    # Back to episodes: the envs moved on under the transition path, so every episode starts afresh.
    torch.manual_seed(len(calls))
    mine = ours.sample(num_timesteps=8, explore=True)
    torch.manual_seed(len(calls))
    assert_same_episodes(mine, theirs.sample(num_timesteps=8, explore=True, force_reset=True), {})
    assert ours._open_episodes is None


def assert_same_metrics(mine: dict[str, Any], theirs: dict[str, Any], exact: tuple[str, ...]) -> None:
    """The same keys (but the timer of RLlib's module-to-env pipeline, which ours does not run), the
    same step, episode and weights counters, and the ``exact`` figures."""
    assert set(mine) <= set(theirs) and set(theirs) - set(mine) <= {"module_to_env_connector"}
    counters = [key for key in theirs if key.startswith("num_")] + ["weights_seq_no"]
    for key in [key for key in exact if key in theirs] + counters:  # no episode metrics before one ends
        if isinstance(theirs[key], dict):  # per agent or module
            assert {k: v.peek() for k, v in mine[key].items()} == {
                k: v.peek() for k, v in theirs[key].items()
            }
        else:
            assert mine[key].peek() == theirs[key].peek(), key


def test_experiments_it_does_not_fit_use_rllibs_runner_and_say_why(shipped: Path) -> None:
    def refusal(name: str, *overrides: str) -> str | None:
        return plan_acceleration(load_experiment(name, overrides).config).off.get("runner")

    assert refusal("ppo_cartpole") is None and refusal("sac_halfcheetah") is None
    assert refusal("ppo_halfcheetah") is None  # its MeanStdFilter is applied per vector step
    assert refusal("ppo_cartpole", "env_runners.runner=rllib") == "env_runners.runner: rllib"
    assert refusal("ppo_frozenlake") == "observations are not a Box"
    loaded = load_experiment("ppo_frozenlake", ())
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    assert not issubclass(config.env_runner_cls, BatchedEnvRunner)


def test_a_runner_with_connectors_of_its_own_falls_back_to_rllibs_sampling(shipped: Path) -> None:
    """Built as ours by hand with a connector it does not know (RLlib's FlattenObservations, which
    leaves CartPole's flat observations as they are): it must sample as RLlib does, and say why."""
    import torch
    from ray.rllib.connectors.env_to_module import FlattenObservations

    loaded = load_experiment("ppo_cartpole", ("env_runners.num_envs_per_env_runner=4",))
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    config.env_runners(env_to_module_connector=lambda env, spaces=None, device=None: [FlattenObservations()])
    ours = env_runner_class(True, 20, fast=True)(config=config)
    theirs = env_runner_class(True, 20, fast=False)(config=config)
    theirs.set_state(ours.get_state())
    torch.manual_seed(0)
    mine = ours.sample(num_timesteps=60, explore=True)
    torch.manual_seed(0)
    assert_same_episodes(mine, theirs.sample(num_timesteps=60, explore=True), {})
    assert ours._pipeline_refusal_found is not None and "FlattenObservations" in ours._pipeline_refusal_found


def test_the_start_says_which_runner_samples(shipped: Path, tmp_path: Path, ray_session: None) -> None:
    from helpers import SMALL_PPO

    from rl_app.training.run import train

    out = io.StringIO()
    train(
        "ppo_cartpole",
        [*SMALL_PPO, "stop.iterations=1"],
        runs_root=tmp_path,
        console=Console(file=out, width=300),
    )
    assert "rl_app's runner, learner, training step; CartPole-v1's own vector env" in out.getvalue()


def test_cartpole_steps_its_own_vector_env_unless_told_sync(shipped: Path) -> None:
    """CartPole has a numpy vector env of its own (gymnasium's ``vector_entry_point``); envs with
    wrappers or without one, and ``vectorize: sync``, get gymnasium's SyncVectorEnv of single envs."""
    import gymnasium

    def runner_env(name: str, *overrides: str) -> Any:
        ours, _ = runner_pair(name, overrides)
        return ours.env.unwrapped

    native = runner_env("ppo_cartpole")
    assert type(native).__name__ == "CartPoleVectorEnv" and native.num_envs == 4
    assert native.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    assert isinstance(
        runner_env("ppo_cartpole", "env_runners.vectorize=sync"), gymnasium.vector.SyncVectorEnv
    )
    assert isinstance(runner_env("sac_pendulum"), gymnasium.vector.SyncVectorEnv)  # Pendulum has none
    plan = plan_resources(load_experiment("ppo_cartpole").config, 2, 0)
    assert describe_rllib_setup(load_experiment("ppo_cartpole").config, plan).endswith(
        "; CartPole-v1's own vector env"
    )
    assert "own vector env" not in describe_rllib_setup(load_experiment("ppo_catch").config, plan)


def test_returns_in_the_native_envs_float32_are_read_as_numbers() -> None:
    """CartPole's vector env gives float32 rewards, so RLlib's episode returns are numpy float32,
    which is no Python float: the evaluation return must still be read (it ranks checkpoints)."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EPISODE_RETURN_MEAN, EVALUATION_RESULTS

    from rl_app.rllib.results import evaluation_return

    result = {EVALUATION_RESULTS: {ENV_RUNNER_RESULTS: {EPISODE_RETURN_MEAN: np.float32(487.5)}}}
    assert evaluation_return(result) == 487.5
    assert np.isnan(evaluation_return({EVALUATION_RESULTS: {ENV_RUNNER_RESULTS: {}}}))


@pytest.mark.parametrize(
    "spaces",
    [
        (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2)),
        (gym.spaces.Box(0, 255, (2, 3), np.uint8), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)),
    ],
)
def test_episodes_made_from_arrays_are_the_constructors_attribute_for_attribute(spaces: tuple) -> None:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from rl_app.rllib.accel.adapter import EpisodeFactory

    observation_space, action_space = spaces
    rng = np.random.default_rng(0)
    columns = {
        "observations": np.stack([observation_space.sample() for _ in range(4)]),
        "actions": np.stack([action_space.sample() for _ in range(3)]),
        "rewards": rng.normal(size=3).astype(np.float32),
        "infos": [{}, {"a": 1}, {}, {"b": 2}],
        "extra_model_outputs": {"action_logp": rng.normal(size=3).astype(np.float32), "seq": np.full(3, 7)},
    }
    maker = EpisodeFactory(observation_space, action_space)
    assert maker.fits  # RLlib's classes are the ones it knows: the fast path is taken
    made = maker.make(**columns, terminated=False, truncated=True)
    built = SingleAgentEpisode(
        **columns,
        observation_space=observation_space,
        action_space=action_space,
        terminated=False,
        truncated=True,
        len_lookback_buffer=0,
    )

    def same(a: Any, b: Any) -> bool:
        if isinstance(b, np.ndarray):
            return a.dtype == b.dtype and np.array_equal(a, b)
        if isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
        if hasattr(b, "__dict__") and not isinstance(b, gym.Space):
            return type(a) is type(b) and same(vars(a), vars(b))
        return bool(a == b)

    for name in SingleAgentEpisode.__slots__:
        if name != "id_":
            assert same(getattr(made, name), getattr(built, name)), name
    assert made.id_ != maker.make(**columns, terminated=False, truncated=True).id_
    assert made.extra_model_outputs is not built.extra_model_outputs
    made.validate()
    assert len(made) == 3 and made.is_done and made.is_numpy
    assert same(made.get_observations(-1), built.get_observations(-1))


def test_episodes_of_an_unknown_layout_come_from_rllibs_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from rl_app.rllib.accel.adapter import EpisodeFactory

    monkeypatch.setattr(EpisodeFactory, "SHARED", (*EpisodeFactory.SHARED, "a_slot_of_another_ray"))
    maker = EpisodeFactory(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))
    assert not maker.fits
    observations = np.zeros((3, 4), np.float32)
    episode = maker.make(observations, np.array([0, 1]), np.ones(2), [{}] * 3, {}, True, False)
    assert isinstance(episode, SingleAgentEpisode) and len(episode) == 2 and episode.is_terminated
    assert episode.observations.data is observations  # the constructor keeps the array it was given
