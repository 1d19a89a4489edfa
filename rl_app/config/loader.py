"""Find, read and validate experiment files; apply ``--set`` overrides."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rl_app.config.errors import describe_validation_error
from rl_app.errors import ConfigError, UserError

EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class LoadedExperiment:
    """A validated experiment and where it came from."""

    name: str
    path: Path
    config: Any  # rl_app.config.schema.Experiment[...]
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
    return sorted(p.stem for p in directory.glob("*.yaml"))


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
    if not path.is_file():
        close = difflib.get_close_matches(name, available, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(f"unknown experiment '{name}'; {hint}(available: {listing})")
    return path


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping with the safe loader; errors name the file and line."""
    source = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, f"cannot read file ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
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


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``update`` over ``base``, merging nested mappings."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(display_path(path), "must be an experiment name", key="extends")
    parent_path = experiment_path(parent, path.parent)
    if parent_path.resolve() in seen or parent_path.resolve() == path.resolve():
        raise ConfigError(display_path(path), f"circular extends via '{parent}'", key="extends")
    base = _read_with_extends(parent_path, (*seen, path.resolve()))
    return deep_merge(base, data)


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``training.lr=0.001`` into a dotted key and a YAML-typed value."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not OVERRIDE_KEY.match(key):
        raise ConfigError(f"--set {text}", "must be KEY=VALUE with a dotted key, e.g. training.lr=3e-4")
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {text}", "value is not valid YAML") from None
    return key, _yaml11_number(value)


def _yaml11_number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; users mean a number."""
    if isinstance(value, str):
        try:
            return float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            return value
    return value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``training.lr``-style ``key`` in ``data`` in place, creating sections as needed."""
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.get(part)
        if part == "env" and isinstance(child, str):
            child = {"id": child}
        if child is None:
            child = {}
        if not isinstance(child, dict):
            raise ValueError(f"'{part}' is not a section")
        node[part] = child = dict(child)
        node = child
    node[leaf] = value


def with_values(data: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with each dotted key of ``values`` set."""
    data = deep_merge({}, data)
    for key, value in values.items():
        set_dotted(data, key, value)
    return data


def apply_overrides(data: dict[str, Any], overrides: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``data`` with each ``KEY=VALUE`` override set."""
    data = deep_merge({}, data)
    for text in overrides:
        key, value = parse_override(text)
        try:
            set_dotted(data, key, value)
        except ValueError as exc:
            raise ConfigError(f"--set {text}", str(exc)) from None
    return data


def validate_experiment(data: dict[str, Any], source: str, overrides: tuple[str, ...] = ()) -> Any:
    """Validate a raw experiment mapping against the schema of its algorithm."""
    from pydantic import BaseModel, ValidationError

    from rl_app.algorithms import ALGORITHMS
    from rl_app.config.schema import Experiment

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
    model: type[BaseModel] = Experiment[ALGORITHMS[algorithm].training]  # type: ignore[misc,assignment]
    try:
        experiment = model.model_validate({"training": {}, **data})
    except ValidationError as exc:
        key, message = describe_validation_error(exc, model)
        raise ConfigError(_source_of(key, source, overrides), message, key=key) from None
    if getattr(experiment, "sweep", None) is not None:
        from rl_app.config.sweep import check_sweep

        check_sweep(data, experiment, lambda key: _source_of(key, source, overrides))
    return experiment


def _source_of(key: str, source: str, overrides: tuple[str, ...]) -> str:
    for text in reversed(overrides):
        override_key = text.partition("=")[0].strip()
        if key == override_key or key.startswith(override_key + "."):
            return f"--set {text}"
    return source


def load_experiment(name: str, overrides: tuple[str, ...] | list[str] = ()) -> LoadedExperiment:
    """Load experiment ``name`` from the experiments folder, apply overrides, validate."""
    overrides = tuple(overrides)
    path = experiment_path(name)
    data = apply_overrides(_read_with_extends(path), overrides)
    config = validate_experiment(data, display_path(path), overrides)
    return LoadedExperiment(name=path.stem, path=path, config=config, overrides=overrides)
