"""Validate an experiment mapping against its algorithm's schema; errors name the file or override."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from rl_app.config.errors import describe_validation_error
from rl_app.config.schema import Experiment, ExperimentConfig
from rl_app.errors import ConfigError


def validate_schema(data: dict[str, Any], source: str, overrides: tuple[str, ...] = ()) -> ExperimentConfig:
    """Validate a raw experiment mapping against the schema of its algorithm (sweep checks aside)."""
    from rl_app.algorithms import ALGORITHMS  # the registry names each algorithm's section of our schema

    algorithm = data.get("algorithm")
    if algorithm is None:
        raise ConfigError(source, "required key is missing", key="algorithm")
    if algorithm not in ALGORITHMS:
        close = difflib.get_close_matches(str(algorithm).upper(), list(ALGORITHMS), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(
            source,
            f"unknown algorithm '{algorithm}'; {hint}(allowed: {', '.join(ALGORITHMS)})",
            key="algorithm",
        )
    model: type[ExperimentConfig] = Experiment[ALGORITHMS[algorithm].training]  # type: ignore[misc,assignment]
    try:
        experiment = model.model_validate({"training": {}, **data})
    except ValidationError as exc:
        key, message = describe_validation_error(exc, model)
        raise ConfigError(source_of(key, source, overrides), message, key=key) from None
    offline = ALGORITHMS[algorithm].offline
    if offline and experiment.offline is None:
        raise ConfigError(
            source,
            f"{algorithm} learns from recorded data: set offline.input to a folder that "
            "'rl_app record RUN --out DIR' wrote (or its storage URI)",
            key="offline.input",
        )
    if not offline and experiment.offline is not None:
        offline_ones = ", ".join(name for name, spec in ALGORITHMS.items() if spec.offline)
        raise ConfigError(
            source, f"applies only to the offline algorithms ({offline_ones}), not {algorithm}", key="offline"
        )
    return experiment


def source_of(key: str, source: str, overrides: tuple[str, ...]) -> str:
    """Where ``key`` was set: the last ``--set`` override of it (or of a section above it), else the file."""
    for text in reversed(overrides):
        override_key = text.partition("=")[0].strip()
        if key == override_key or key.startswith(override_key + "."):
            return f"--set {text}"
    return source
