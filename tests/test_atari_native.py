"""ale-py's native vector env against the Python path of the ``atari`` preset: chosen for the same
experiments, the same spaces, the same frames, rewards and episode ends for one action sequence, in
training (life-loss terminals, clipped rewards) and in evaluation (neither)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rl_app.cluster.resources import plan_resources
from rl_app.config import load_experiment
from rl_app.config.schema import EnvSection
from rl_app.envs import make_env, make_native_vector_env, native_vector_env
from rl_app.rllib.config import describe_rllib_setup, vectorizes_natively

# Deterministic on both paths: no sticky actions, no random no-ops. FIRE at reset is left out
# here because the two paths press it differently (see rl_app.envs.atari); it is checked below.
BREAKOUT = {
    "id": "ALE/Breakout-v5",
    "config": {"frameskip": 1, "repeat_action_probability": 0.0},
    "wrappers": [{"atari": {"noop_max": 0, "fire_reset": False}}],
}


def section(**changes: Any) -> EnvSection:
    return EnvSection.model_validate({**BREAKOUT, **changes})


def test_the_atari_preset_alone_on_an_ale_id_steps_ale_pys_vector_env() -> None:
    assert native_vector_env(section()) == "ale-py's AtariVectorEnv"
    assert native_vector_env(EnvSection.model_validate({**BREAKOUT, "wrappers": ["atari"]})) is not None
    # Anything ale-py's vector env could not play as the Python path does keeps the Python path.
    assert native_vector_env(section(wrappers=["atari", {"time_limit": {"max_episode_steps": 100}}])) is None
    assert native_vector_env(section(config={"frameskip": 1, "mode": 0})) is None
    assert native_vector_env(section(config={"frameskip": 4})) is None  # the preset refuses it anyway
    assert native_vector_env(EnvSection.model_validate({"id": "ALE/Breakout-v5"})) is None
    pong = load_experiment("ppo_pong").config
    assert vectorizes_natively(pong)
    assert not vectorizes_natively(load_experiment("ppo_pong", ["env_runners.vectorize=sync"]).config)
    plan = plan_resources(pong, 2, 0)
    assert plan.num_env_runners == 0 and plan.env_threads == 2  # sampling on the driver: both cores
    assert describe_rllib_setup(pong, plan).endswith("; ale-py's AtariVectorEnv (2 threads a runner)")
    impala = load_experiment("impala_pong").config  # learns while it samples: a core for the learner
    assert plan_resources(impala, 2, 0).env_threads == 1


@pytest.mark.parametrize("evaluation", [False, True], ids=["training", "evaluation"])
@pytest.mark.parametrize("game", ["Breakout", "SpaceInvaders"])
def test_native_frames_rewards_and_episode_ends_equal_the_python_paths(game: str, evaluation: bool) -> None:
    """One fixed random action sequence through several games (lives lost, games over): every
    stacked observation, reward, terminated and truncated flag equal, bit for bit. After an episode
    ends the Python path resets (after a lost life in training: one NOOP step, the game going on);
    the native env takes the next step as that reset, whatever action it is given. After a lost
    life the frame stack is the one difference (see rl_app.envs.atari): the newest frame is
    compared. Space Invaders scores 5 to 30 an alien: training must clip, evaluation must not."""
    env = section(id=f"ALE/{game}-v5")
    python = make_env(env, evaluation=evaluation)
    native = make_native_vector_env(env, 1, evaluation=evaluation)
    try:
        assert native.single_observation_space == python.observation_space
        assert native.single_observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
        assert native.single_action_space == python.action_space
        expected, _ = python.reset(seed=0)
        observations, _ = native.reset(seed=0)
        np.testing.assert_array_equal(observations[0], expected)
        actions = np.random.default_rng(0).integers(0, python.action_space.n, 3000)
        ends, game_overs, lost_life, rewards = 0, 0, False, []
        ended = False
        for step, action in enumerate(actions.tolist()):
            observations, reward, terminated, truncated, infos = native.step(np.array([action]))
            if ended:
                expected, _ = python.reset()
                lost_life = python.unwrapped.ale.lives() > 0  # type: ignore[attr-defined]
                assert not terminated[0] and not truncated[0], step
            else:
                expected, expected_reward, *expected_ends, _ = python.step(action)
                assert reward.dtype == np.float32 and float(reward[0]) == expected_reward, step
                assert [bool(terminated[0]), bool(truncated[0])] == expected_ends, step
                rewards.append(expected_reward)
            if lost_life:
                np.testing.assert_array_equal(observations[0][..., -1], expected[..., -1], err_msg=str(step))
            else:
                np.testing.assert_array_equal(observations[0], expected, err_msg=str(step))
            ended = bool(terminated[0] or truncated[0]) and not ended
            if ended:
                ends += 1
                game_overs += int(infos["lives"][0] == 0)
                lost_life = False
            if game_overs >= 2 and not ended:
                break
        assert game_overs >= 2, "the sequence must reach the reset of a whole game twice"
        if evaluation:
            assert ends == game_overs  # the real game: an episode is a whole game
        else:
            assert ends > 2 * game_overs  # an episode per life
        assert sum(rewards) >= 3, "some points must be scored for the rewards to be compared"
        if game == "SpaceInvaders":
            assert (max(rewards) > 1) == evaluation  # clipped to the sign in training only
    finally:
        python.close()
        native.close()


def test_training_clips_rewards_and_evaluation_keeps_them() -> None:
    """The top rows of Breakout score 4 and 7 (where a ball goes after breaking through): the
    training env reports the sign, the evaluation env the score, on the same emulator states."""
    from rl_app.envs.factory import _native_atari_options

    training = _native_atari_options(section(), evaluation=False)
    evaluation = _native_atari_options(section(), evaluation=True)
    assert training is not None and evaluation is not None
    assert training["reward_clipping"] and training["life_loss_info"] and not training["episodic_life"]
    assert not evaluation["reward_clipping"] and not evaluation["life_loss_info"]
    assert {k: v for k, v in training.items() if k not in ("reward_clipping", "life_loss_info")} == {
        k: v for k, v in evaluation.items() if k not in ("reward_clipping", "life_loss_info")
    }
    # The shipped preset's options reach ale-py as the Python path applies them.
    shipped = _native_atari_options(load_experiment("ppo_pong").config.env, evaluation=False)
    assert shipped is not None
    assert {
        k: shipped[k]
        for k in ("game", "noop_max", "frameskip", "img_height", "stack_num", "repeat_action_probability")
    } == {
        "game": "pong",
        "noop_max": 30,
        "frameskip": 4,
        "img_height": 84,
        "stack_num": 4,
        "repeat_action_probability": 0.0,
    }
    # ALE's own default for v5 ids (sticky actions 0.25) holds where the experiment sets none.
    defaulted = _native_atari_options(section(config={"frameskip": 1}), evaluation=False)
    assert defaulted is not None and defaulted["repeat_action_probability"] == 0.25


def newest_frames_change(env: Any, steps: int, at_start: Any) -> bool:
    """Whether the newest frame differs from ``at_start``'s in ``steps`` NOOP steps."""
    vector = hasattr(env, "num_envs")
    for _ in range(steps):
        obs = env.step(np.array([0]) if vector else 0)[0]
        if not np.array_equal((obs[0] if vector else obs)[..., -1], at_start[..., -1]):
            return True
    return False


@pytest.mark.parametrize("fire_reset", [True, False])
def test_fire_after_reset_and_after_a_lost_life_launches_breakouts_ball(fire_reset: bool) -> None:
    """Breakout stands still until FIRE: with the preset's FIRE at reset the ball moves under a
    policy that only ever takes NOOP, at the start and, in training, after each lost life (the
    native env presses FIRE on the step the runners take as the next episode's reset); without
    it the screen stays as it is."""
    env = section(wrappers=[{"atari": {"noop_max": 0, "fire_reset": fire_reset}}])
    python = make_env(env)
    native = make_native_vector_env(env, 1)
    try:
        first, _ = python.reset(seed=0)
        assert newest_frames_change(python, 30, first) == fire_reset
        observations, _ = native.reset(seed=0)
        assert newest_frames_change(native, 30, observations[0]) == fire_reset
        if not fire_reset:
            return
        # Lose a life: NOOP until the ball is missed, then the reset step, then NOOP again.
        for _ in range(2000):
            observations, _, terminated, _, infos = native.step(np.array([0]))
            if terminated[0]:
                break
        assert terminated[0] and infos["lives"][0] > 0, "no life was lost"
        observations, _, terminated, _, _ = native.step(np.array([0]))  # the reset step: FIRE
        assert not terminated[0]
        assert newest_frames_change(native, 30, observations[0])
    finally:
        python.close()
        native.close()


class SeededRandomPolicy:
    """Uniformly random actions from a fixed seed: two envs given it play the same sequence."""

    def __init__(self, actions: int) -> None:
        self.actions, self.rng = actions, np.random.default_rng(0)

    def reset(self) -> None:
        pass

    def act(self, observation: Any) -> int:
        return int(self.rng.integers(self.actions))


def test_rl_app_evaluate_plays_the_whole_game_with_its_real_score() -> None:
    """``rl_app evaluate``'s episodes are the evaluation env's (a whole game of five lives, rewards
    as the game gives them), not the training env's (an episode per life)."""
    from rl_app.policy.evaluate import run_episodes

    env = section(id="ALE/SpaceInvaders-v5")
    (evaluated,) = run_episodes(SeededRandomPolicy(6), env, [(0, 0)])

    def play(evaluation: bool) -> tuple[float, int]:
        game, policy = make_env(env, evaluation=evaluation), SeededRandomPolicy(6)
        game.reset(seed=0)
        total, length, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = game.step(policy.act(None))
            total, length, done = total + float(reward), length + 1, terminated or truncated
        lives = game.unwrapped.ale.lives()  # type: ignore[attr-defined]
        game.close()
        assert (lives == 0) == evaluation  # a whole game, or the first life of one
        return total, length

    assert (evaluated.episode_return, evaluated.length) == play(evaluation=True)
    training_return, training_length = play(evaluation=False)
    assert evaluated.length > training_length
    assert evaluated.episode_return > 2 * training_return  # unclipped: 5 to 30 points an alien
