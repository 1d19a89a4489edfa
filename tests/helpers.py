"""What several test modules share: a tiny PPO budget and a small local Ray with extra env vars."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rl_app.cluster.session import shutdown_ray

# ppo_cartpole overrides that make an iteration take well under a second.
SMALL_PPO = [
    "training.train_batch_size_per_learner=400",
    "training.minibatch_size=100",
    "training.num_epochs=1",
    "evaluation.interval=0",
]


# One tiny run per algorithm: what the policy-tool and serving tests train (2 iterations each).
TINY_RUNS = {
    "ppo_cartpole": ["training.train_batch_size_per_learner=400", "training.minibatch_size=100"],
    "dqn_cartpole": [],
    "sac_pendulum": [],
}


@contextmanager
def local_ray(env: dict[str, str] | None = None) -> Iterator[None]:
    """A 2-CPU local Ray, always shut down; ``env`` is set first, so its workers inherit it."""
    import ray

    previous = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        shutdown_ray(local=True)
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def rllib_policy(checkpoint: Path) -> Callable[[np.ndarray], np.ndarray]:
    """What RLlib's own env-runner pipeline picks, deterministically, for a batch of observations."""
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    module = RLModule.from_checkpoint(str(checkpoint / "learner_group/learner/rl_module/default_policy"))

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module.forward_inference({"obs": torch.as_tensor(obs)})
            if "actions" in out:
                return out["actions"].numpy()
            dist = module.get_inference_action_dist_cls().from_logits(out["action_dist_inputs"])
            actions = dist.to_deterministic().sample().numpy()
        return unsquash_action(actions, module.action_space) if actions.dtype.kind == "f" else actions

    return act


def rllib_actions(checkpoint: Path, obs: np.ndarray) -> np.ndarray:
    return rllib_policy(checkpoint)(obs)


def replayed_returns(
    env_id: str, seeds: Sequence[int], act: Callable[[np.ndarray], np.ndarray]
) -> list[float]:
    """Each seed's episode return with ``act`` (a batch of one observation in, its action out)
    choosing every action, replayed with gymnasium alone: what ``rl_app evaluate`` must report for
    the same policy and seeds."""
    import gymnasium as gym

    returns = []
    for seed in seeds:
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs[None])[0])
            total += float(reward)
            done = terminated or truncated
        env.close()
        returns.append(total)
    return returns


def unfused(learner_class: type) -> type:
    """Our ``learner_class`` with RLlib's plain Adam kept (the fused one can round differently)."""
    return type(f"Unfused{learner_class.__name__}", (learner_class,), {"fused_adam": False})


def random_recording(env_id: str, folder: Path, steps: int = 600) -> Path:
    """Transitions of random actions in RLlib's columns, written directly (as any logger could)."""
    import gymnasium as gym
    import pyarrow as pa
    import pyarrow.parquet as pq

    env = gym.make(env_id)
    env.action_space.seed(0)
    rows: dict[str, list] = {
        k: [] for k in ("eps_id", "t", "obs", "actions", "rewards", "new_obs", "terminateds", "truncateds")
    }
    obs, _ = env.reset(seed=0)
    episode, t = 0, 0
    for _ in range(steps):
        action = env.action_space.sample()
        new_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(
            rows,
            (str(episode), t, np.asarray(obs).tolist(), np.asarray(action).tolist(), float(reward),
             np.asarray(new_obs).tolist(), terminated, truncated),
            strict=True,
        ):  # fmt: skip
            rows[key].append(value)
        obs, t = new_obs, t + 1
        if terminated or truncated:
            obs, _ = env.reset()
            episode, t = episode + 1, 0
    folder.mkdir(parents=True)
    pq.write_table(pa.table(rows), folder / "part-0.parquet")
    return folder
