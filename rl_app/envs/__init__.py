"""Environment ids: Gymnasium-registered names or 'package.module:Class' paths."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any


def check_env_id(env_id: str) -> None:
    """Raise ValueError unless ``env_id`` names a Gymnasium env or an importable class."""
    if ":" in env_id:
        module_name, _, class_name = env_id.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import module '{module_name}' ({exc})") from None
        if not hasattr(module, class_name):
            raise ValueError(f"module '{module_name}' has no class '{class_name}'")
        return
    import gymnasium

    known = list(gymnasium.envs.registry)
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"unknown env id '{env_id}'; {hint or 'see gymnasium.envs.registry'}"
            " (or use 'package.module:Class')"
        )


def make_env_creator(env_id: str) -> Callable[[dict[str, Any]], Any]:
    """An RLlib env creator for a 'package.module:Class' id."""
    module_name, _, class_name = env_id.partition(":")
    env_class = getattr(importlib.import_module(module_name), class_name)
    return lambda env_config: env_class(**dict(env_config))


def make_env(env_id: str, env_config: dict[str, Any], render_mode: str | None = None) -> Any:
    """A single env outside RLlib (evaluation, video, serving)."""
    kwargs = dict(env_config)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if ":" in env_id:
        return make_env_creator(env_id)(kwargs)
    import gymnasium

    return gymnasium.make(env_id, **kwargs)
