"""The standard Atari preprocessing as one declared wrapper, ``atari``.

What DQN's and every later Atari paper's agents see, as in RL Zoo's ``AtariWrapper`` and RLlib's
``wrap_atari_for_new_api_stack``: up to 30 no-ops after reset, the action repeated on 4 frames
(max-pooled over the last two), 84x84 grayscale, FIRE after reset where the game needs it, and 4
frames stacked on the last axis (channels-last, as RLlib's CNN encoder reads them). The frames
stay uint8; the model scales them (:mod:`rl_app.rllib.pixels`).

Two parts are for training only: the episode ends on the loss of a life (the game itself goes
on) and rewards are clipped to their sign. Evaluation, ``rl_app evaluate`` and videos play the
real game and report its real score.
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
        self.stack[...] = obs
        return self.stack.copy(), info

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
    if "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]
        env = FireReset(env)
    if clip_reward and not evaluation:
        env = gym.wrappers.TransformReward(env, lambda reward: float(np.sign(float(reward))))
    return StackFrames(env, frame_stack)


# The factory passes evaluation=True to this wrapper outside training.
atari.takes_evaluation_flag = True  # type: ignore[attr-defined]
