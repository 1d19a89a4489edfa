"""Catch: the example custom environment (``env: rl_app.envs.catch:Catch``).

A ball falls from a random column of a ``width`` x ``height`` board; the agent moves a
paddle along the bottom row (left, stay, right) and scores +1 for a catch, -1 for a miss.
An episode is ``balls`` balls, so returns run from ``-balls`` to ``+balls``; a random
policy scores about ``-0.6 * balls`` on the default board. Small, fast (numpy only), and
it needs credit assignment over ``height`` steps, which makes it a real test of a learner.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Catch(gym.Env[np.ndarray, np.int64]):
    """Observation: ball column, ball row and paddle column, each scaled to [0, 1]."""

    metadata = {"render_modes": ("rgb_array",), "render_fps": 10}  # noqa: RUF012 (gymnasium's attribute)

    def __init__(
        self, width: int = 7, height: int = 7, balls: int = 5, render_mode: str | None = None
    ) -> None:
        if width < 3 or height < 2 or balls < 1:
            raise ValueError(
                f"Catch needs width >= 3, height >= 2, balls >= 1 (got {width}, {height}, {balls})"
            )
        self.width, self.height, self.balls = width, height, balls
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self._ball = np.zeros(2, dtype=np.int64)  # column, row
        self._paddle = 0
        self._left = 0

    def _observation(self) -> np.ndarray:
        scale = np.array([self.width - 1, self.height - 1, self.width - 1], dtype=np.float32)
        return np.array([self._ball[0], self._ball[1], self._paddle], dtype=np.float32) / scale

    def _drop(self) -> None:
        self._ball = np.array([self.np_random.integers(self.width), 0])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._paddle = self.width // 2
        self._left = self.balls
        self._drop()
        return self._observation(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._paddle = int(np.clip(self._paddle + int(action) - 1, 0, self.width - 1))
        self._ball[1] += 1
        reward = 0.0
        if self._ball[1] == self.height - 1:
            reward = 1.0 if self._ball[0] == self._paddle else -1.0
            self._left -= 1
            if self._left:
                self._drop()
        return self._observation(), reward, self._left == 0, False, {}

    def render(self) -> Any:
        """The board as an RGB image: the ball white, the paddle green, 16 pixels a cell."""
        board = np.zeros((self.height, self.width, 3), dtype=np.uint8)
        board[self.height - 1, self._paddle] = (60, 200, 90)
        board[min(self._ball[1], self.height - 1), self._ball[0]] = (255, 255, 255)
        return np.kron(board, np.ones((16, 16, 1), dtype=np.uint8))
