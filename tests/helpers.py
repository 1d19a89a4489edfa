"""What several test modules share: a tiny PPO budget and a small local Ray with extra env vars."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# ppo_cartpole overrides that make an iteration take well under a second.
SMALL_PPO = [
    "training.train_batch_size_per_learner=400",
    "training.minibatch_size=100",
    "training.num_epochs=1",
    "evaluation.interval=0",
]


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
        ray.shutdown()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
