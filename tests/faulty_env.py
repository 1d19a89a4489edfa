"""A CartPole that crashes on purpose, for the sweep failure tests (importable by Ray workers)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import gymnasium


def _in_a_ray_actor() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:
        return False


class CrashingCartPole(gymnasium.Wrapper):
    """``crash``: 'never', 'once' (the first env to pass ``after_steps``, across retries) or 'always'
    (every step from ``after_steps`` on: a recreated env fails again ``after_steps`` steps later);
    ``fail_reset``: every reset raises; 'all_but_first': every instance but the first made (the
    one rl_app checks the env with) fails at ``after_steps``;
    'kill_runner_once': the first env in a Ray actor to reach ``after_steps`` SIGKILLs its process
    (an env runner's, or in a sweep without remote runners the trial's own)."""

    def __init__(
        self, crash: str = "never", after_steps: int = 300, marker_dir: str = "", fail_reset: bool = False
    ) -> None:
        super().__init__(gymnasium.make("CartPole-v1"))
        self.crash, self.after_steps, self.marker_dir = crash, after_steps, marker_dir
        self.fail_reset = fail_reset
        self.steps = 0
        self.spared = crash == "all_but_first" and self._claim("spared")

    def reset(self, **kwargs: Any) -> Any:
        if self.fail_reset:
            raise OSError("deliberate reset failure: the simulator is gone")
        return self.env.reset(**kwargs)

    def _claim(self, marker: str) -> bool:
        try:  # O_EXCL: exactly one env, in any process, ever creates the marker
            os.close(os.open(Path(self.marker_dir) / marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    def _claim_the_one_crash(self) -> bool:
        return self._claim("crashed")

    def step(self, action: Any) -> Any:
        self.steps += 1
        killing = self.crash == "kill_runner_once" and self.steps >= self.after_steps and _in_a_ray_actor()
        if killing and self._claim("killed"):
            os.kill(os.getpid(), signal.SIGKILL)  # the env runner's whole worker process dies
        if self.steps >= self.after_steps and (
            self.crash == "always"
            or (self.crash == "all_but_first" and not self.spared)
            or (self.crash == "once" and self._claim_the_one_crash())
        ):
            raise RuntimeError(f"deliberate crash ({self.crash}) for the failure test")
        return self.env.step(action)
