"""Find, read and validate experiment files; apply ``--set`` overrides."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rl_app.config.data import apply_overrides, deep_merge
from rl_app.config.schema import ExperimentConfig
from rl_app.config.sweep import check_sweep
from rl_app.config.validate import source_of, validate_schema
from rl_app.config.yaml_safe import RefusedYAML, safe_load_experiment
from rl_app.errors import ConfigError, UserError

EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class LoadedExperiment:
    """A validated experiment and where it came from."""

    name: str
    path: Path
    config: ExperimentConfig
    overrides: tuple[str, ...] = field(default=())

    @property
    def source(self) -> str:
        return display_path(self.path)


def experiments_dir() -> Path:
    """Where named experiments live: $RL_APP_EXPERIMENTS_DIR, ./experiments, or the repo's."""
    configured = os.environ.get("RL_APP_EXPERIMENTS_DIR")
    if configured:
        return Path(configured)
    local = Path.cwd() / "experiments"
    if local.is_dir():
        return local
    return Path(__file__).resolve().parents[2] / "experiments"


def available_experiments(directory: Path | None = None) -> list[str]:
    """Names of the experiments in ``directory`` (default: :func:`experiments_dir`)."""
    directory = directory or experiments_dir()
    return sorted(p.stem for p in directory.glob("*.yaml") if p.is_file())


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def is_experiment_file(name: str) -> bool:
    """True when ``name`` is meant as a file path (``runs/sweep/x_best.yaml``), not a name."""
    return name.endswith((".yaml", ".yml"))


def experiment_path(name: str, directory: Path | None = None) -> Path:
    """The YAML file of experiment ``name`` (a name from the folder, or a path to a .yaml file)."""
    if directory is None and is_experiment_file(name):
        path = Path(name)
        if path.is_dir():
            raise UserError(f"experiment file '{name}' is a directory, not a YAML file")
        if not path.is_file():
            raise UserError(f"experiment file '{name}' does not exist")
        return path
    directory = directory or experiments_dir()
    available = available_experiments(directory)
    listing = ", ".join(available) or "none"
    if not EXPERIMENT_NAME.match(name) or ".." in name:
        raise UserError(
            f"experiment '{name}' must be a name from {display_path(directory)}/ "
            f"(available: {listing}) or the path of a .yaml file"
        )
    path = directory / f"{name}.yaml"
    if path.is_dir():
        raise UserError(
            f"'{display_path(path)}' is a directory, not an experiment file (experiment '{name}')"
        )
    if not path.is_file():
        close = difflib.get_close_matches(name, available, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(f"unknown experiment '{name}'; {hint}(available: {listing})")
    return path


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping with the safe loader; errors name the file and line."""
    source = display_path(path)
    if path.is_dir():
        raise ConfigError(source, "is a directory, not an experiment file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, f"cannot read file ({exc.strerror or exc})") from None
    try:
        data = safe_load_experiment(text)
    except RefusedYAML as exc:
        raise ConfigError(source, str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(source, f"YAML syntax error at {where}{problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, f"must be a mapping of keys to values (got {type(data).__name__})")
    return data


def read_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The experiment file at ``path`` merged over the experiments it ``extends:``."""
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(display_path(path), "must be an experiment name", key="extends")
    if not EXPERIMENT_NAME.match(parent) or ".." in parent:
        raise ConfigError(
            display_path(path),
            f"must name an experiment in {display_path(path.parent)}/ (got '{parent}'; "
            "extends cannot reach other folders)",
            key="extends",
        )
    parent_path = experiment_path(parent, path.parent)
    if parent_path.resolve() in seen or parent_path.resolve() == path.resolve():
        raise ConfigError(display_path(path), f"circular extends via '{parent}'", key="extends")
    base = read_with_extends(parent_path, (*seen, path.resolve()))
    return deep_merge(base, data)


def validate_experiment(
    data: dict[str, Any], source: str, overrides: tuple[str, ...] = ()
) -> ExperimentConfig:
    """Validate a raw experiment mapping: its algorithm's schema, then its sweep section."""
    experiment = validate_schema(data, source, overrides)
    if experiment.sweep is not None:
        check_sweep(data, experiment, lambda key: source_of(key, source, overrides))
    return experiment


def load_experiment(name: str, overrides: tuple[str, ...] | list[str] = ()) -> LoadedExperiment:
    """Load experiment ``name`` from the experiments folder, apply overrides, validate."""
    overrides = tuple(overrides)
    path = experiment_path(name)
    data = apply_overrides(read_with_extends(path), overrides)
    config = validate_experiment(data, display_path(path), overrides)
    return LoadedExperiment(name=path.stem, path=path, config=config, overrides=overrides)
