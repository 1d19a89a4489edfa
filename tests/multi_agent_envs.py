"""Users' own multi-agent envs (RLlib's ``MultiAgentEnv``), named as ``multi_agent_envs:Class``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv


class Meeting(MultiAgentEnv):
    """Two agents on a line of ``size`` cells, each seeing both positions; they earn 1 each (and the
    episode ends) when they stand on the same cell. Actions: 0 left, 1 stay, 2 right. A 'scout'
    sees one more number, the distance, when ``scout_sees_distance`` (so the two spaces differ)."""

    def __init__(self, size: int = 5, max_steps: int = 20, scout_sees_distance: bool = False) -> None:
        super().__init__()
        self.size, self.max_steps = size, max_steps
        self.agents = self.possible_agents = ["runner", "scout"]
        extra = 1 if scout_sees_distance else 0
        self.observation_spaces = {
            "runner": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
            "scout": gym.spaces.Box(0.0, 1.0, (2 + extra,), np.float32),
        }
        self.action_spaces = {agent: gym.spaces.Discrete(3) for agent in self.agents}
        self.positions = np.zeros(2, dtype=np.int64)
        self.steps = 0
        self.rng = np.random.default_rng()

    def _observations(self) -> dict[str, np.ndarray]:
        both = (self.positions / (self.size - 1)).astype(np.float32)
        scout = both
        if self.observation_spaces["scout"].shape[0] == 3:
            scout = np.append(both, np.float32(abs(both[0] - both[1])))
        return {"runner": both, "scout": scout}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.positions = np.array([0, self.size - 1])
        self.steps = 0
        return self._observations(), {}

    def step(self, actions: dict[str, int]) -> Any:
        for index, agent in enumerate(self.agents):
            self.positions[index] = np.clip(self.positions[index] + int(actions[agent]) - 1, 0, self.size - 1)
        self.steps += 1
        met = bool(self.positions[0] == self.positions[1])
        rewards = dict.fromkeys(self.agents, 1.0 if met else 0.0)
        done = {"__all__": met}
        truncated = {"__all__": not met and self.steps >= self.max_steps}
        return self._observations(), rewards, done, truncated, {}


class DifferentSpaces(Meeting):
    """:class:`Meeting` whose scout sees the distance too: its observation space differs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(scout_sees_distance=True, **kwargs)
