"""Experiment configuration: loading, schema, overrides. Imports neither Ray nor torch."""

from rl_app.config.loader import (
    LoadedExperiment,
    available_experiments,
    experiments_dir,
    load_experiment,
    validate_experiment,
)
from rl_app.config.schema import EnvSection, Experiment, ExperimentConfig

__all__ = [
    "EnvSection",
    "Experiment",
    "ExperimentConfig",
    "LoadedExperiment",
    "available_experiments",
    "experiments_dir",
    "load_experiment",
    "validate_experiment",
]
