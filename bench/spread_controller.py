"""A hand-written reference for MPE2's simple_spread (three agents, three landmarks): at the start,
each agent is assigned a landmark (the assignment with the least total distance), then steers to it,
braking against its own velocity. It shares what no trained agent here is given, the assignment,
so it marks roughly how far a coordinated team gets in 25 steps.

    python bench/spread_controller.py [EPISODES] [SEED]
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import numpy as np

# simple_spread's discrete actions: 0 no move, 1 left, 2 right, 3 down, 4 up. Its observation:
# own velocity (2), own position (2), the landmarks relative to the agent (3 x 2), then the others.
VELOCITY, LANDMARKS = slice(0, 2), slice(4, 10)


def _action(observation: np.ndarray, landmark: int) -> int:
    offset = observation[LANDMARKS].reshape(3, 2)[landmark]
    wanted = 2.0 * offset - 0.8 * observation[VELOCITY]
    if np.abs(wanted).max() < 0.05:
        return 0
    if abs(wanted[0]) > abs(wanted[1]):
        return 2 if wanted[0] > 0 else 1
    return 4 if wanted[1] > 0 else 3


def controller_returns(episodes: int, seed: int) -> dict[str, Any]:
    """The controller's return (the sum over the agents) in ``episodes`` episodes reset with seeds
    ``seed``, ``seed + 1``, ... (as ``rl_app evaluate --seed`` resets them)."""
    from mpe2 import simple_spread_v3
    from scipy.optimize import linear_sum_assignment

    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)
    returns = []
    for episode_seed in range(seed, seed + episodes):
        observations, _ = env.reset(seed=episode_seed)
        agents = list(env.agents)
        distances = np.array(
            [np.linalg.norm(observations[a][LANDMARKS].reshape(3, 2), axis=1) for a in agents]
        )
        rows, columns = linear_sum_assignment(distances)
        landmark = {agents[r]: int(c) for r, c in zip(rows, columns, strict=True)}
        total = 0.0
        while env.agents:
            actions = {a: _action(observations[a], landmark[a]) for a in env.agents}
            observations, rewards, _, _, _ = env.step(actions)
            total += float(sum(rewards.values()))
        returns.append(total)
    return {"mean": statistics.fmean(returns), "median": statistics.median(returns), "episodes": episodes}


if __name__ == "__main__":
    episodes, seed = (int(a) for a in [*sys.argv[1:], "100", "50000"][:2])
    print(controller_returns(episodes, seed))
