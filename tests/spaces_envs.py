"""Envs whose observations are not a Box (tests/test_spaces.py)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class DictGoal(gym.Env[dict[str, Any], int]):
    """Each step shows a goal (Discrete(3)), a noise vector and a MultiDiscrete pair; the reward is
    1 for naming the goal. 16 steps an episode: a policy that reads the Dict learns it at once."""

    observation_space = gym.spaces.Dict(
        {
            "noise": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            "goal": gym.spaces.Discrete(3),
            "pair": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiDiscrete([2, 3]))),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def _observe(self) -> dict[str, Any]:
        self.goal = int(self.np_random.integers(3))
        return {
            "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32),
            "goal": self.goal,
            "pair": (int(self.np_random.integers(2)), self.np_random.integers(0, [2, 3]).astype(np.int64)),
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.steps = 0
        return self._observe(), {}

    def step(self, action: int) -> Any:
        reward = float(action == self.goal)
        self.steps += 1
        return self._observe(), reward, False, self.steps >= 16, {}


class GraphObservations(DictGoal):
    observation_space = gym.spaces.Dict(  # type: ignore[assignment]
        {"goal": gym.spaces.Discrete(3), "map": gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), None)}
    )


class CountsFromOne(DictGoal):
    observation_space = gym.spaces.Discrete(4, start=1)  # type: ignore[assignment]


class MaskedGoal(gym.Env[dict[str, Any], int]):
    """Five actions, of which a random two to four are allowed each step (``action_mask``); the
    reward is 1 for the allowed action the observation points at, -100 for a masked one (so an
    episode's return is negative if and only if it took one), 0 otherwise. 20 steps an episode."""

    observation_space = gym.spaces.Dict(
        {
            "action_mask": gym.spaces.MultiBinary(5),
            "observations": gym.spaces.Box(0.0, 1.0, shape=(5,), dtype=np.float32),
        }
    )
    action_space = gym.spaces.Discrete(5)

    def _observe(self) -> dict[str, Any]:
        allowed = self.np_random.permutation(5)[: self.np_random.integers(2, 5)]
        self.mask = np.zeros(5, dtype=np.int8)
        self.mask[allowed] = 1
        self.goal = int(allowed[0])
        return {"action_mask": self.mask.copy(), "observations": np.eye(5, dtype=np.float32)[self.goal]}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.steps, self.masked_actions = 0, 0
        return self._observe(), {}

    def step(self, action: int) -> Any:
        allowed = bool(self.mask[action])
        self.masked_actions += not allowed
        reward = (1.0 if action == self.goal else 0.0) if allowed else -100.0
        self.steps += 1
        info = {"masked_actions": self.masked_actions}
        return self._observe(), reward, False, self.steps >= 20, info


class WrongMaskSize(MaskedGoal):
    observation_space = gym.spaces.Dict(  # type: ignore[assignment]
        {
            "action_mask": gym.spaces.MultiBinary(4),
            "observations": gym.spaces.Box(0.0, 1.0, shape=(5,), dtype=np.float32),
        }
    )
