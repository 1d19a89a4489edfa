"""Env wrappers an experiment can name under ``env.wrappers``.

A wrapper is a short name from :data:`WRAPPERS` or any 'package.module:Class' whose
constructor takes the env first and the entry's kwargs after it (every
``gymnasium.wrappers`` class does). A wrapper with a ``takes_evaluation_flag`` attribute (the
``atari`` preset) is told when it wraps an env for evaluation, so it can leave out what is for
training only.
"""

from __future__ import annotations

import importlib
from typing import Any

# Short names for Gymnasium's wrappers and rl_app's own; each entry is 'module:Class'.
WRAPPERS: dict[str, str] = {
    "time_limit": "gymnasium.wrappers:TimeLimit",
    "clip_reward": "gymnasium.wrappers:ClipReward",
    "frame_stack": "gymnasium.wrappers:FrameStackObservation",
    "flatten_observation": "gymnasium.wrappers:FlattenObservation",
    "atari": "rl_app.envs.atari:atari",
    "observation_indices": "rl_app.envs.observations:ObservationIndices",
}

# Training-only wrappers: evaluation, `rl_app evaluate` and videos report the env's own reward.
TRAINING_ONLY = frozenset({"clip_reward"})


def import_class(path: str) -> Any:
    """The class at 'package.module:Class'; ValueError naming what is missing."""
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module '{module_name}' ({exc})") from None
    if not hasattr(module, class_name):
        raise ValueError(f"module '{module_name}' has no class '{class_name}'")
    return getattr(module, class_name)


def wrapper_class(name: str) -> Any:
    """The class of wrapper ``name`` (a short name or 'package.module:Class')."""
    if name in WRAPPERS:
        return import_class(WRAPPERS[name])
    if ":" not in name:
        raise ValueError(
            f"unknown wrapper '{name}' (allowed: {', '.join(WRAPPERS)}, or 'package.module:Class')"
        )
    return import_class(name)


def check_wrapper(name: str) -> None:
    """Raise ValueError unless ``name`` is a known wrapper or an importable class."""
    wrapper_class(name)
