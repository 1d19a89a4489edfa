"""Where `rl_app train`'s fixed cost goes: one ppo_cartpole iteration, each phase timed in-process.

python bench/startup_profile.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RL_APP_EXPERIMENTS_DIR", str(Path(__file__).resolve().parents[1] / "experiments"))


def main() -> None:
    phases: list[tuple[str, float]] = []
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases.append((name, now - mark))
        mark = now

    import ray

    from rl_app.config import load_experiment
    from rl_app.resources import plan_resources
    from rl_app.rllib_adapter import build_algorithm_config

    lap("imports (ray, rl_app)")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    lap("ray.init")
    loaded = load_experiment("ppo_cartpole")
    config = build_algorithm_config(loaded.config, plan_resources(loaded.config, os.cpu_count() or 1, 0), "")
    lap("RLlib config + validate (imports RLlib)")
    algo = config.build_algo()
    lap("build_algo (env runner actors, learner)")
    algo.train()
    lap("one training iteration")
    with tempfile.TemporaryDirectory() as folder:
        algo.save_to_path(folder)
    lap("checkpoint")
    algo.stop()
    lap("algo.stop")
    ray.shutdown()
    lap("ray.shutdown")
    total = sum(seconds for _, seconds in phases)
    for name, seconds in phases:
        print(f"{name:42s} {seconds:6.2f} s  {seconds / total:4.0%}")
    print(f"{'total':42s} {total:6.2f} s")


if __name__ == "__main__":
    main()
