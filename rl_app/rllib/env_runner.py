"""Our env runner: RLlib's ``SingleAgentEnvRunner`` plus the reset seeding RLlib has no switch for.

Registered through ``config.env_runners(env_runner_cls=...)`` for training and evaluation.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.debug import update_global_seed_if_necessary


class RLAppEnvRunner(SingleAgentEnvRunner):
    """RLlib's runner, re-seedable at run time and drawing new evaluation starts each time.

    Workarounds for RLlib 2.60, which keeps the seed in the private ``_seed`` and reads it
    at every reset that follows a ``sample(num_episodes=...)``:
    - evaluation: RLlib would reset its eval envs with the same seed for every evaluation,
      so every evaluation would replay the same start states and "best evaluation return"
      would rank checkpoints on those few alone. After the first (seeded) evaluation the
      envs' own seeded RNGs pick the next starts, so a seeded run stays reproducible.
    - :meth:`reseed`: RLlib seeds a runner only when it is built; a restored run or sweep
      trial re-seeds its runners so the part after the checkpoint does not replay the
      episodes of the first part.
    """

    def reseed(self, seed: int | None) -> None:
        """Seed as RLlib's constructor does for ``config.seed = seed``; the next ``sample()`` resets
        every env with it."""
        if seed is not None:
            seed = int(seed + (self.worker_index or 0) + 1_000_000 * self.config.in_evaluation)
        self._seed = seed
        update_global_seed_if_necessary(framework=self.config.framework_str, seed=seed)
        self._needs_initial_reset = True

    @property
    def seed(self) -> int | None:
        """The seed of the next seeded reset (None: the envs' own RNGs go on)."""
        return self._seed

    def sample(self, **kwargs: Any) -> Any:
        episodes = super().sample(**kwargs)
        if self.config.in_evaluation:
            self._seed = None
        return episodes
