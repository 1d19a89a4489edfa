"""What the benchmarks share: an experiment's algorithm built the way ``rl_app train`` builds it."""

from __future__ import annotations

from typing import Any


def build_experiment_algo(experiment: str, overrides: list[str], cpus: int, gpus: int) -> Any:
    """The RLlib Algorithm for ``experiment`` with ``overrides``, resources planned for cpus/gpus."""
    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.rllib.algorithm import build_experiment

    loaded = load_experiment(experiment, overrides)
    plan = plan_resources(loaded.config, cpus, gpus)
    return build_experiment(loaded.config, plan, loaded.source)
