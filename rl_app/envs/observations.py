"""Observation wrappers of rl_app's own, for what Gymnasium's take only as code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np


class ObservationIndices(gym.ObservationWrapper[Any, Any, Any]):
    """Keep the entries ``indices`` of a flat Box observation: an env made partially observable,
    e.g. CartPole without its velocities (``indices: [0, 2]``), a task for a policy with memory."""

    def __init__(self, env: gym.Env[Any, Any], indices: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"observation_indices takes a flat Box observation, not {space}")
        size = space.shape[0]
        if not indices or any(not 0 <= i < size for i in indices):
            raise ValueError(f"observation_indices {list(indices)} must be within [0, {size - 1}]")
        self.indices = np.asarray(indices, dtype=np.int64)
        self.observation_space = gym.spaces.Box(
            space.low[self.indices],
            space.high[self.indices],
            dtype=space.dtype,  # type: ignore[arg-type]
        )

    def observation(self, observation: Any) -> Any:
        return np.asarray(observation)[self.indices]
