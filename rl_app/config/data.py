"""Experiment data as plain mappings: merging, dotted keys and ``--set`` overrides (no validation)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from rl_app.config.yaml_safe import RefusedYAML, safe_load_experiment
from rl_app.errors import ConfigError

OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``update`` over ``base``, merging nested mappings."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``training.lr=0.001`` into a dotted key and a YAML-typed value."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not OVERRIDE_KEY.match(key):
        raise ConfigError(f"--set {text}", "must be KEY=VALUE with a dotted key, e.g. training.lr=3e-4")
    try:
        value = safe_load_experiment(value_text) if value_text.strip() else None
    except RefusedYAML as exc:
        raise ConfigError(f"--set {text}", str(exc)) from None
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
