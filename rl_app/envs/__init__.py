"""The one env factory: every env rl_app runs (training, evaluation, video, export) is made here.

An env is a Gymnasium id or a 'package.module:Class' path, with its ``config:`` as keyword
arguments, wrapped in the wrappers the experiment declares, in order.

The names below load on first use, so a server importing ``rl_app.envs.spaces`` alone imports
neither the factory nor the experiment schema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_app.envs.factory import (
        action_space,
        check_env,
        check_env_id,
        env_creator,
        flattened_observation_space,
        has_native_vector_env,
        has_training_only_wrappers,
        make_env,
        make_native_vector_env,
        native_vector_env,
        observation_space,
    )
    from rl_app.envs.wrappers import WRAPPERS, check_wrapper

_SOURCES = {
    "action_space": "factory",
    "check_env": "factory",
    "check_env_id": "factory",
    "env_creator": "factory",
    "flattened_observation_space": "factory",
    "has_native_vector_env": "factory",
    "has_training_only_wrappers": "factory",
    "make_env": "factory",
    "make_native_vector_env": "factory",
    "native_vector_env": "factory",
    "observation_space": "factory",
    "WRAPPERS": "wrappers",
    "check_wrapper": "wrappers",
}

__all__ = [
    "WRAPPERS",
    "action_space",
    "check_env",
    "check_env_id",
    "check_wrapper",
    "env_creator",
    "flattened_observation_space",
    "has_native_vector_env",
    "has_training_only_wrappers",
    "make_env",
    "make_native_vector_env",
    "native_vector_env",
    "observation_space",
]


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'rl_app.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rl_app.envs.{_SOURCES[name]}"), name)
