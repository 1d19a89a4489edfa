"""The standard Atari preprocessing as one declared wrapper, ``atari``.

What DQN's and every later Atari paper's agents see, as in RL Zoo's ``AtariWrapper`` and RLlib's
``wrap_atari_for_new_api_stack``: up to 30 no-ops after reset, the action repeated on 4 frames
(max-pooled over the last two), 84x84 grayscale, FIRE after reset where the game needs it, and 4
frames stacked on the last axis (channels-last, as RLlib's CNN encoder reads them), zeros before
the first. The frames stay uint8; the model scales them (:mod:`rl_app.rllib.pixels`).

Two parts are for training only: the episode ends on the loss of a life (the game itself goes
on) and rewards are clipped to their sign. Evaluation, ``rl_app evaluate`` and videos play the
real game and report its real score.

The runners step the same preprocessing in ale-py's ``AtariVectorEnv`` (:func:`make_vector_env`):
the emulators, frame skip, resize and stack in C++ threads, EnvPool's design, one call per vector
step. Each step's frames equal the Python path's bit for bit (tests/test_atari_native.py). They
differ at the edges of episodes: at reset ale-py presses FIRE for one frame among its no-ops (0 to
noop_max - 1 frames; the Python path takes 1 to noop_max, then presses FIRE and action 2, a skipped
step each); after a lost life it presses FIRE for one skipped step (the Python path NOOP, FIRE and
action 2), and its frame stack runs on rather than restarting from zeros.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def quiet_ale() -> None:
    """Register the ALE ids and keep its banner and notes (printed from C++ at every env made)
    off the console; its errors still reach it."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def _ale(env: gym.Env) -> Any:
    return env.unwrapped.ale  # type: ignore[attr-defined]


class EpisodicLife(gym.Wrapper):
    """End the episode when a life is lost, without resetting the game: the next ``reset()``
    takes a no-op step from where the game is, unless the game really ended."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = _ale(self.env).lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, float(reward), terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = _ale(self.env).lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after reset, for games that stand still until it is pressed (Breakout)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        for action in (1, 2):  # FIRE, then the next action as the usual wrapper does
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class StackFrames(gym.ObservationWrapper):
    """The last ``frames`` frames on the last axis: (H, W, 1) -> (H, W, frames), same dtype."""

    def __init__(self, env: gym.Env, frames: int) -> None:
        super().__init__(env)
        space: Any = env.observation_space
        assert isinstance(space, gym.spaces.Box) and space.shape[-1] == 1, space
        dtype: Any = space.dtype
        self.stack = np.zeros((*space.shape[:-1], frames), dtype=dtype)
        self.observation_space = gym.spaces.Box(
            np.repeat(space.low, frames, axis=-1), np.repeat(space.high, frames, axis=-1), dtype=dtype
        )

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.stack[...] = 0  # as ale-py's vector env and SB3's VecFrameStack start a stack
        return self.observation(obs), info

    def observation(self, observation: Any) -> Any:
        self.stack[..., :-1] = self.stack[..., 1:].copy()
        self.stack[..., -1:] = observation
        # A copy: the episode keeps every observation, which must not change afterwards.
        return self.stack.copy()


def atari(
    env: gym.Env,
    *,
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    frame_stack: int = 4,
    terminal_on_life_loss: bool = True,
    clip_reward: bool = True,
    fire_reset: bool = True,
    evaluation: bool = False,
) -> gym.Env:
    """Wrap an ALE env (made with ``frameskip: 1``) in the standard preprocessing.

    ``evaluation=True`` (set by the env factory for evaluation, ``rl_app evaluate`` and video)
    leaves out the two training-only parts: the life-loss terminal and the reward clipping.
    """
    if not hasattr(env.unwrapped, "ale"):
        raise ValueError(f"the 'atari' wrapper needs an ALE env (ALE/<Game>-v5), not {env.unwrapped}")
    if getattr(env.unwrapped, "_frameskip", 1) != 1:
        raise ValueError("the 'atari' wrapper skips frames itself: set env.config.frameskip: 1")
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        grayscale_newaxis=True,
        scale_obs=False,
    )
    if terminal_on_life_loss and not evaluation:
        env = EpisodicLife(env)
    if fire_reset and "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]
        env = FireReset(env)
    if clip_reward and not evaluation:
        env = gym.wrappers.TransformReward(env, lambda reward: float(np.sign(float(reward))))
    return StackFrames(env, frame_stack)


# The factory passes evaluation=True to this wrapper outside training.
atari.takes_evaluation_flag = True  # type: ignore[attr-defined]


# The ALE env's own options that ale-py's vector env takes under the same names; an experiment
# setting any other (mode, difficulty, obs_type) keeps the Python path.
NATIVE_ENV_OPTIONS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")


def native_options(
    env_id: str, env_config: dict[str, Any], preset: dict[str, Any], *, evaluation: bool
) -> dict[str, Any] | None:
    """``AtariVectorEnv``'s keyword arguments for ``env_id`` with ``env_config`` under the ``atari``
    preset's ``preset`` arguments, or None where it cannot play that env as the Python path would.

    The life-loss terminal becomes ``life_loss_info``: terminated is reported and the game goes on,
    as :class:`EpisodicLife` does. (ale-py's ``episodic_life`` would restart the game at every lost
    life, so an agent would never see its later lives.)
    """
    spec = gym.envs.registry.get(env_id)
    if spec is None or "game" not in spec.kwargs:
        return None
    options = {**spec.kwargs, **env_config}
    if options.pop("frameskip", None) != 1 or set(options) - {"game", *NATIVE_ENV_OPTIONS}:
        return None
    defaults = _defaults(atari)
    if set(preset) - set(defaults) or "evaluation" in preset:
        return None
    settings = {**defaults, **preset}
    training = not evaluation
    return {
        "game": options.pop("game"),
        **options,
        "noop_max": settings["noop_max"],
        "frameskip": settings["frame_skip"],
        "img_height": settings["screen_size"],
        "img_width": settings["screen_size"],
        "stack_num": settings["frame_stack"],
        "grayscale": True,
        "maxpool": True,
        "use_fire_reset": settings["fire_reset"],
        "episodic_life": False,
        "life_loss_info": settings["terminal_on_life_loss"] and training,
        "reward_clipping": settings["clip_reward"] and training,
    }


def _defaults(function: Any) -> dict[str, Any]:
    import inspect

    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


class NativeAtari(gym.vector.VectorWrapper):
    """ale-py's vector env as the runners take the Python path's: frames channels-last, float
    rewards, and a lost life ended as :class:`EpisodicLife` ends it.

    - Frames (envs, stack, H, W) become (envs, H, W, stack), one contiguous array a step (the
      runners stack a call's steps, which a transposed view would make slower).
    - A life-loss terminal (``life_loss_info``) leaves ale-py's game running: its next step is an
      ordinary one, where Gymnasium's vector envs (and so the runners) take the step after a
      terminal as the next episode's reset and drop its action and reward. That step presses
      ``reset_action`` instead of the policy's action: FIRE in games that wait for it (the Python
      path's reset after a lost life presses NOOP, FIRE, then action 2, a skipped step each), NOOP
      otherwise. Should that step end the game, the env is reset there, so the runners see the
      reset they expect.
    """

    def __init__(self, env: Any, reset_action: int) -> None:
        super().__init__(env)
        stack, height, width = env.single_observation_space.shape
        self.single_observation_space = gym.spaces.Box(0, 255, (height, width, stack), np.uint8)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, env.num_envs)
        self.reset_action = reset_action
        self._lost_life = np.zeros(env.num_envs, dtype=bool)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        observations, infos = self.env.reset(**kwargs)
        self._lost_life[:] = False
        return _channels_last(observations), infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        lost_life = self._lost_life
        if lost_life.any():
            actions = np.where(lost_life, self.reset_action, actions)
        observations, rewards, terminated, truncated, infos = self.env.step(actions)
        game_ended = lost_life & (terminated | truncated)
        if game_ended.any():
            fresh, _ = self.env.reset(options={"reset_mask": game_ended})
            observations = np.where(game_ended[:, None, None, None], fresh, observations)
            terminated, truncated = terminated & ~game_ended, truncated & ~game_ended
        self._lost_life = terminated & (infos["lives"] > 0) & ~lost_life
        return _channels_last(observations), rewards.astype(np.float32), terminated, truncated, infos


def _channels_last(observations: Any) -> Any:
    return np.ascontiguousarray(observations.transpose(0, 2, 3, 1))


def make_vector_env(num_envs: int, options: dict[str, Any], threads: int) -> Any:
    """``num_envs`` ALE envs stepped together by ale-py in ``threads`` C++ threads
    (``options`` from :func:`native_options`), as :class:`NativeAtari`."""
    from ale_py.vector_env import AtariVectorEnv

    quiet_ale()
    from ale_py import Action

    env = AtariVectorEnv(num_envs=num_envs, num_threads=max(1, threads), **options)
    actions = list(env.ale.get_action_set())
    fire = options["use_fire_reset"] and Action.FIRE in actions
    return NativeAtari(env, reset_action=actions.index(Action.FIRE) if fire else 0)
