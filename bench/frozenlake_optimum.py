"""The best FrozenLake-v1 policy, by value iteration on the env's own transition table, played on the
episodes the benches evaluate on: the ceiling ppo_frozenlake's figures stand against.

    python bench/frozenlake_optimum.py

Writes bench/results/frozenlake-optimum-<date>.json and .md.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results

EPISODE_SETS = {
    "parity's (reset seeds 1000-1099)": range(1000, 1100),
    "10,000 episodes (reset seeds 0-9999)": range(10_000),
}


def best_policy(env: gym.Env) -> tuple[np.ndarray, float]:
    """Value iteration for the chance to reach the goal (undiscounted, no step limit)."""
    table = env.unwrapped.P  # type: ignore[attr-defined]
    states, actions = len(table), len(table[0])
    values = np.zeros(states)
    for _ in range(10_000):
        q = np.array(
            [
                [
                    sum(p * (r + (0.0 if done else values[s2])) for p, s2, r, done in table[s][a])
                    for a in range(actions)
                ]
                for s in range(states)
            ]
        )
        values = q.max(axis=1)
    return q.argmax(axis=1), float(values[0])


def success_rate(env: gym.Env, policy: np.ndarray, seeds: range) -> float:
    wins = 0.0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(policy[obs]))
            wins += float(reward)
            done = terminated or truncated
    return wins / len(seeds)


def main() -> None:
    env = gym.make("FrozenLake-v1")  # slippery 4x4, 100 steps an episode
    policy, without_limit = best_policy(env)
    rates = {name: success_rate(env, policy, seeds) for name, seeds in EPISODE_SETS.items()}
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    results = {"date": stamp, "success_without_step_limit": without_limit, "success": rates}
    lines = [
        f"# The best FrozenLake-v1 policy (slippery 4x4), {stamp}",
        "",
        "Value iteration on the env's transition table; the success rate of its greedy policy,",
        "100 steps an episode.",
        "",
        "| episodes | success rate |",
        "|---|---|",
        *(f"| {name} | {rate:.2f} |" for name, rate in rates.items()),
        f"| without the 100-step limit (the value of the start) | {without_limit:.3f} |",
    ]
    write_results(f"frozenlake-optimum-{stamp}", results, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
