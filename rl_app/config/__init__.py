"""Experiment configuration: loading, schema, overrides. Imports neither Ray nor torch."""

from rl_app.config.loader import (
    LoadedExperiment,
    available_experiments,
    experiments_dir,
    load_experiment,
)
from rl_app.config.schema import Experiment

__all__ = [
    "Experiment",
    "LoadedExperiment",
    "available_experiments",
    "experiments_dir",
    "load_experiment",
]
