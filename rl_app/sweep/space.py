"""A sweep's search space as Ray Tune objects, and how many trials it makes."""

from __future__ import annotations

import math
from typing import Any

from ray import tune

from rl_app.config.schema import SpaceEntry, SweepSection

DEFAULT_SAMPLES = 8


def num_samples(sweep: SweepSection) -> int:
    """Trials to sample: as set, else one pass of a grid search, else 8."""
    return int(sweep.num_samples or (1 if sweep.search == "grid" else DEFAULT_SAMPLES))


def count_trials(sweep: SweepSection) -> int:
    """Trials the sweep will run: samples x grid points (Tune's variant generator), or samples."""
    if sweep.search == "optuna":
        return num_samples(sweep)
    grid = math.prod(len(entry.args) for entry in sweep.space.values() if entry.kind == "grid")
    return num_samples(sweep) * grid


def tune_domain(entry: SpaceEntry) -> Any:
    """One space entry as a Ray Tune search-space object."""
    args = entry.args
    return {
        "choice": lambda: tune.choice(list(args)),
        "grid": lambda: tune.grid_search(list(args)),
        "uniform": lambda: tune.uniform(*args),
        "loguniform": lambda: tune.loguniform(*args),
        "randint": lambda: tune.randint(*args),
        "quniform": lambda: tune.quniform(*args),
    }[entry.kind]()
