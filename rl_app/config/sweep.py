"""Checks of a ``sweep:`` section that need the rest of the experiment.

Every value a search space can produce is validated by the same schema as the
experiment itself: the bounds of a range and every listed value are substituted
into the experiment and validated, so ``training.lr: {uniform: [0, 0.1]}`` fails
before any trial starts, with the schema's own message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_app.config.data import with_values
from rl_app.config.schema import ExperimentConfig
from rl_app.config.validate import validate_schema
from rl_app.errors import ConfigError

SWEEPABLE_PREFIXES = ("training.", "model.", "env.config.")
SWEEPABLE = "training.*, model.*, env.config.*, seed"
OPTUNA_CATEGORY_TYPES = (bool, int, float, str, type(None))


def is_sweepable(key: str) -> bool:
    """Resources, stop rules and storage belong to the sweep, not to a trial's sampled values."""
    return key == "seed" or key.startswith(SWEEPABLE_PREFIXES)


def trial_data(data: dict[str, Any]) -> dict[str, Any]:
    """The experiment a trial runs: the sweep section dropped, the sweep's stop rule in place."""
    trial = {k: v for k, v in data.items() if k != "sweep"}
    sweep_stop = (data.get("sweep") or {}).get("stop")
    if sweep_stop:
        trial["stop"] = sweep_stop
    return trial


def metric_name(experiment: ExperimentConfig) -> str:
    """The sweep's metric: as set, else eval_return when evaluation is on, else return."""
    assert experiment.sweep is not None
    return str(experiment.sweep.metric or ("eval_return" if experiment.evaluation.interval else "return"))


def asha_max_t(experiment: ExperimentConfig) -> int | None:
    """ASHA's longest trial: ``max_t``, else the trial stop rule in the scheduler's time unit."""
    sweep = experiment.sweep
    assert sweep is not None
    stop = sweep.stop or experiment.stop
    fallback = stop.timesteps if sweep.scheduler.time_attr == "timesteps" else stop.iterations
    return sweep.scheduler.max_t or fallback


def check_sweep(data: dict[str, Any], experiment: ExperimentConfig, source_of: Callable[[str], str]) -> None:
    """Raise ConfigError naming ``sweep.<key>`` for anything the sweep cannot run."""
    sweep = experiment.sweep
    assert sweep is not None
    source = source_of("sweep")
    base = trial_data(data)
    for key, entry in sweep.space.items():
        where = f"sweep.space.{key}"
        if not is_sweepable(key):
            raise ConfigError(source, f"cannot be swept (allowed: {SWEEPABLE})", key=where)
        for value in entry.candidates():
            try:
                validate_schema(with_values(base, {key: value}), source)
            except ConfigError as exc:
                detail = f"{exc.key}: {exc.message}" if exc.key else exc.message
                raise ConfigError(
                    source, f"{entry.kind} value {value!r} is invalid: {detail}", key=where
                ) from None
        if sweep.search == "grid" and entry.kind != "grid":
            raise ConfigError(
                source, f"search 'grid' needs every entry to be grid (got {entry.kind})", key=where
            )
        if sweep.search == "optuna":
            if entry.kind == "grid":
                raise ConfigError(source, "search 'optuna' cannot take grid entries (use choice)", key=where)
            if entry.kind == "choice" and not all(isinstance(v, OPTUNA_CATEGORY_TYPES) for v in entry.args):
                raise ConfigError(
                    source, "optuna chooses only among numbers, strings and booleans", key=where
                )
        if sweep.scheduler.type == "pbt":
            if not key.startswith("training."):
                raise ConfigError(
                    source,
                    "PBT restores checkpoints into mutated trials, so it can mutate only training.* keys",
                    key=where,
                )
            if entry.kind == "grid":
                raise ConfigError(source, "PBT mutates sampled values; use choice, not grid", key=where)

    if metric_name(experiment) == "eval_return" and not experiment.evaluation.interval:
        raise ConfigError(source, "eval_return needs evaluation.interval > 0", key="sweep.metric")
    scheduler = sweep.scheduler
    if scheduler.type == "asha" and asha_max_t(experiment) is None:
        raise ConfigError(
            source,
            f"ASHA needs max_t, or stop.{scheduler.time_attr} in the trial stop rule",
            key="sweep.scheduler.max_t",
        )
