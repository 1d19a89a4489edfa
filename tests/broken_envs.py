"""Envs that are wrong in the ways a user's own env can be (bad-input tests)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class _Base(gym.Env[Any, Any]):
    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action: Any) -> Any:
        return np.zeros(4, dtype=np.float32), 0.0, False, False, {}


class RaisesInConstructor(_Base):
    def __init__(self, level: int = 1) -> None:
        raise RuntimeError(f"no such level: {level}")


class TextObservations(_Base):
    observation_space = gym.spaces.Text(8)  # type: ignore[assignment]


class WrongShape(_Base):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return np.zeros(5, dtype=np.float32), {}


class StringReward(_Base):
    def step(self, action: Any) -> Any:
        return np.zeros(4, dtype=np.float32), "1", False, False, {}


class FourTuple(_Base):
    def step(self, action: Any) -> Any:
        return np.zeros(4, dtype=np.float32), 0.0, False, {}


class SignalsItself(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that sends its own process SIGTERM from inside ``step()`` (the signal's worst moment)."""

    def __init__(self, after_steps: int = 600) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.after_steps, self.steps = after_steps, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.after_steps:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
        return self.env.step(action)
