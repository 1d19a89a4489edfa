"""Where `rl_app train`'s fixed cost goes: one ppo_cartpole iteration, each phase timed in-process
(the same Ray start, resource plan and RLlib config as `rl_app train`).

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

    from rl_app.cluster.resources import plan_resources
    from rl_app.cluster.session import ray_session
    from rl_app.config import load_experiment
    from rl_app.rllib.config import algorithm_build_modules, algorithm_config

    lap("imports (ray, rl_app)")
    loaded = load_experiment("ppo_cartpole")
    session = ray_session(preload=algorithm_build_modules(loaded.config))
    cluster = session.__enter__()
    from rl_app.rllib.algorithm import build_algorithm  # as rl_app train: RLlib imports once Ray starts

    lap("Ray start, torch + RLlib imported meanwhile")
    plan = plan_resources(loaded.config, cluster.num_cpus, cluster.num_gpus)
    config = algorithm_config(loaded.config, plan, "")
    lap("RLlib config + validate")
    algo = build_algorithm(config)
    lap("build_algo (env runner actors, learner)")
    algo.train()
    lap("one training iteration")
    with tempfile.TemporaryDirectory() as folder:
        algo.save_to_path(folder)
    lap("checkpoint")
    algo.stop()
    lap("algo.stop")
    session.__exit__(None, None, None)
    lap("ray.shutdown")
    assert not ray.is_initialized()
    total = sum(seconds for _, seconds in phases)
    for name, seconds in phases:
        print(f"{name:42s} {seconds:6.2f} s  {seconds / total:4.0%}")
    print(f"{'total':42s} {total:6.2f} s")


if __name__ == "__main__":
    main()
