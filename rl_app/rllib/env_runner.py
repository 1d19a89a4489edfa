"""Our env runners: RLlib's ``SingleAgentEnvRunner`` and ``MultiAgentEnvRunner`` plus the reset
seeding RLlib has no switch for (and, single-agent, the handling of failing envs).

Registered through ``config.env_runners(env_runner_cls=...)`` for training and evaluation.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.env.env_runner import ENV_STEP_FAILURE
from ray.rllib.utils.debug import update_global_seed_if_necessary

from rl_app.errors import EnvFailedError, error_detail
from rl_app.rllib.accel.adapter import EnvRunnerInternals, MultiAgentRunnerInternals


class _HandledEnvFailure(logging.Filter):
    """RLlib logs a failing env step as an error with its traceback. Our runner handles it (the env
    is recreated, the failure counted and said once per iteration), so it is a warning: in the
    run's rl_app.log, not on the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "Environment step failed" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


logging.getLogger("ray.rllib").addFilter(_HandledEnvFailure())  # RLlib 2.60 env_runner.py logs there


class _HandledRunnerCrash(logging.Filter):
    """RLlib logs each call to a crashed env runner as an error (with whatever exception is being
    handled at the time). The crash is ours to report: counted, said once per iteration, and past
    ``max_restarts`` the run stops with one line. So these are warnings, kept in rl_app.log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            record.levelno, record.levelname, record.exc_info = logging.WARNING, "WARNING", None
        return True


logging.getLogger("ray.rllib.utils.actor_manager").addFilter(_HandledRunnerCrash())


class SeedControl:
    """An RLlib runner, re-seedable at run time and drawing new evaluation starts each time.

    Workarounds for RLlib 2.60, which keeps the seed privately (``seed_of_next_reset``) and reads
    it at every reset that follows a ``sample(num_episodes=...)``:
    - evaluation: RLlib would reset its eval envs with the same seed for every evaluation,
      so every evaluation would replay the same start states and "best evaluation return"
      would rank checkpoints on those few alone. After the first (seeded) evaluation the
      envs' own seeded RNGs pick the next starts, so a seeded run stays reproducible.
    - :meth:`reseed`: RLlib seeds a runner only when it is built; a restored run or sweep
      trial re-seeds its runners so the part after the checkpoint does not replay the
      episodes of the first part.
    """

    worker_index: int
    config: Any
    seed_of_next_reset: int | None
    needs_initial_reset: bool

    def reseed(self, seed: int | None) -> None:
        """Seed as RLlib's constructor does for ``config.seed = seed``; the next ``sample()`` resets
        every env with it."""
        if seed is not None:
            seed = int(seed + (self.worker_index or 0) + 1_000_000 * self.config.in_evaluation)
        self.seed_of_next_reset = seed
        update_global_seed_if_necessary(framework=self.config.framework_str, seed=seed)
        self.needs_initial_reset = True

    @property
    def seed(self) -> int | None:
        """The seed of the next seeded reset (None: the envs' own RNGs go on)."""
        return self.seed_of_next_reset

    def sample(self, **kwargs: Any) -> Any:
        episodes = super().sample(**kwargs)  # type: ignore[misc]
        if self.config.in_evaluation:
            self.seed_of_next_reset = None
        return episodes


class RLAppMultiAgentEnvRunner(SeedControl, MultiAgentRunnerInternals):
    """RLlib's multi-agent runner, seeded as :class:`RLAppEnvRunner` is. A failing env is RLlib's
    to handle: the runner fails and is restarted (``env_runners.max_restarts``)."""


class RLAppEnvRunner(SeedControl, EnvRunnerInternals):
    """RLlib's single-agent runner, seeded as :class:`SeedControl` says, recreating failing envs."""

    # A failing env. RLlib 2.60's own restart (``restart_failed_sub_environments``) retries a
    # failing reset forever and drops the env's error; ours recreates the env the same way but
    # counts failures in a row and, past ``max_env_failures``, stops with the env's own error.
    restart_failed_envs: bool = True
    max_env_failures: int = 20
    _failures_in_a_row = 0

    def _env_failed(self, error: BaseException, where: str) -> None:
        self._failures_in_a_row += 1
        env = str(self.config.env).removeprefix("rl_app:")  # the id the experiment gave
        if not self.restart_failed_envs or self._failures_in_a_row > self.max_env_failures:
            times = f"{self._failures_in_a_row} times in a row" if self.restart_failed_envs else "once"
            raise EnvFailedError(
                f"env {env} failed in {where}() {times} ({type(error).__name__}: {error_detail(error)})"
            ) from None
        self.make_env()

    def try_env_step(self, actions: Any) -> Any:
        try:
            results = super().try_env_step(actions)  # RLlib counts the failure, then raises
        except RuntimeError as exc:
            self._env_failed(exc.__cause__ or exc, "step")
            return ENV_STEP_FAILURE  # RLlib drops the broken episodes and resets
        self._failures_in_a_row = 0
        return results

    def try_env_reset(self, *, seed: Any = None, options: Any = None) -> Any:
        while True:
            try:
                return super().try_env_reset(seed=seed, options=options)
            except Exception as exc:
                self._env_failed(exc, "reset")


def env_runner_class(
    restart_failed_envs: bool, max_env_failures: int, fast: bool = False, multi_agent: bool = False
) -> type[Any]:
    """:class:`RLAppEnvRunner` (or, with ``fast``, the batched runner built on it) with the
    experiment's env-failure limits (RLlib builds the runners from the class alone);
    :class:`RLAppMultiAgentEnvRunner` for several agents."""
    if multi_agent:
        return RLAppMultiAgentEnvRunner
    base: type[RLAppEnvRunner] = RLAppEnvRunner
    if fast:
        from rl_app.rllib.accel.runner import BatchedEnvRunner

        base = BatchedEnvRunner
    return type(
        base.__name__,
        (base,),
        {"restart_failed_envs": restart_failed_envs, "max_env_failures": max_env_failures},
    )
