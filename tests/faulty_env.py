"""A CartPole that crashes on purpose, for the sweep failure tests (importable by Ray workers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium


class CrashingCartPole(gymnasium.Wrapper):
    """``crash``: 'never', 'once' (the first env to pass ``after_steps``, across retries) or 'always'."""

    def __init__(self, crash: str = "never", after_steps: int = 300, marker_dir: str = "") -> None:
        super().__init__(gymnasium.make("CartPole-v1"))
        self.crash, self.after_steps, self.marker_dir = crash, after_steps, marker_dir
        self.steps = 0

    def _claim_the_one_crash(self) -> bool:
        try:  # O_EXCL: exactly one env, in any process, ever creates the marker
            os.close(os.open(Path(self.marker_dir) / "crashed", os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps >= self.after_steps and (
            self.crash == "always" or (self.crash == "once" and self._claim_the_one_crash())
        ):
            raise RuntimeError(f"deliberate crash ({self.crash}) for the failure test")
        return self.env.step(action)
