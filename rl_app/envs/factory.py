"""Make an experiment's env: the id with its config, then the declared wrappers in order."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from typing import Any

from rl_app.config.schema import EnvSection
from rl_app.envs.wrappers import import_class, wrapper_class


def check_env_id(env_id: str) -> None:
    """Raise ValueError unless ``env_id`` names a Gymnasium env or an importable class."""
    if ":" in env_id:
        import_class(env_id)
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


def make_env(
    env: EnvSection, *, render_mode: str | None = None, config: Mapping[str, Any] | None = None
) -> Any:
    """One env of ``env``: ``config`` (default: the section's) as kwargs, then its wrappers.

    RLlib's env runners, evaluation, video recording and export all come here, so a
    wrapper declared in the experiment applies to each of them in the same way.
    """
    kwargs = dict(env.config if config is None else config)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if ":" in env.id:
        instance = import_class(env.id)(**kwargs)
    else:
        import gymnasium

        instance = gymnasium.make(env.id, **kwargs)
    for wrapper in env.wrappers or ():
        instance = wrapper_class(wrapper.name)(instance, **wrapper.kwargs)
    return instance


def _create(env_data: dict[str, Any], env_config: Mapping[str, Any]) -> Any:
    return make_env(EnvSection.model_validate(env_data), config=env_config)


def env_creator(env: EnvSection) -> Callable[[Mapping[str, Any]], Any]:
    """An env creator in RLlib's form (``creator(env_config) -> env``) that calls :func:`make_env`.

    It holds the section as plain data, so it pickles to remote env runners.
    """
    return functools.partial(_create, env.model_dump(mode="json"))
