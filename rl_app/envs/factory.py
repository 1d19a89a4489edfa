"""Make an experiment's env: the id with its config, then the declared wrappers in order."""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rl_app.config.schema import EnvSection
from rl_app.envs.spaces import flattened_description, spaces_problem
from rl_app.envs.wrappers import TRAINING_ONLY, import_class, wrapper_class
from rl_app.errors import error_detail

# Env families that register their Gymnasium ids on import, by id prefix: the module to import and
# the function (if any) to call then (to register the ids, or to quiet a banner).
ENV_NAMESPACES: dict[str, tuple[str, str | None]] = {
    "ALE/": ("rl_app.envs.atari", "quiet_ale"),
    "MinAtar/": ("minatar.gym", "register_envs"),
}


def _register_namespace(env_id: str) -> None:
    import gymnasium

    for prefix, (module_name, register) in ENV_NAMESPACES.items():
        if env_id.startswith(prefix) and env_id not in gymnasium.envs.registry:
            try:
                module = importlib.import_module(module_name)
                if register is not None:
                    getattr(module, register)()
            except ImportError as exc:
                package = "ale-py" if module_name.startswith("rl_app") else module_name.split(".")[0]
                raise ValueError(f"'{env_id}' needs the {package} package ({exc})") from None


def _log_mujoco_warning(message: str) -> None:
    logging.getLogger("mujoco").warning(message.strip())


def _route_library_warnings(env_id: str) -> None:
    """MuJoCo prints its warnings (one per HalfCheetah made, about Gymnasium's XML) from C; send
    them to the log instead, where library messages go (rl_app.log in a run folder)."""
    import gymnasium

    spec = gymnasium.envs.registry.get(env_id)
    if spec is not None and "mujoco" in str(spec.entry_point):
        import mujoco

        mujoco.set_mju_user_warning(_log_mujoco_warning)


def check_env_id(env_id: str) -> None:
    """Raise ValueError unless ``env_id`` names a Gymnasium env or an importable class."""
    if ":" in env_id:
        import_class(env_id)
        return
    import gymnasium

    from rl_app.envs.multi_agent import pettingzoo_module

    _register_namespace(env_id)

    known = list(gymnasium.envs.registry)
    if env_id not in known and pettingzoo_module(env_id) is None:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"unknown env id '{env_id}'; {hint or 'see gymnasium.envs.registry'}"
            " (or use 'package.module:Class', or a PettingZoo env's module: 'mpe2.simple_spread_v3')"
        )


def make_env(
    env: EnvSection,
    *,
    render_mode: str | None = None,
    config: Mapping[str, Any] | None = None,
    evaluation: bool = False,
) -> Any:
    """One env of ``env``: ``config`` (default: the section's) as kwargs, then its wrappers.

    RLlib's env runners, evaluation, video recording and export all come here, so a
    wrapper declared in the experiment applies to each of them in the same way, except that
    ``evaluation=True`` leaves out the training-only parts (reward clipping, life-loss
    terminals), so evaluation reports the env's real return.
    """
    kwargs = dict(env.config if config is None else config)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if ":" in env.id:
        instance = import_class(env.id)(**kwargs)
    else:
        import gymnasium

        _register_namespace(env.id)
        _route_library_warnings(env.id)
        instance = gymnasium.make(env.id, **kwargs)
    for wrapper in env.wrappers or ():
        if evaluation and wrapper.name in TRAINING_ONLY:
            continue
        wrap = wrapper_class(wrapper.name)
        extra = {"evaluation": True} if evaluation and getattr(wrap, "takes_evaluation_flag", False) else {}
        instance = wrap(instance, **wrapper.kwargs, **extra)
    return instance


# How the start names ale-py's vector env (with the threads it steps in).
ALE_VECTOR_ENV = "ale-py's AtariVectorEnv"


def _native_atari_options(env: EnvSection, evaluation: bool) -> dict[str, Any] | None:
    """ale-py's vector env options for an ALE id whose one wrapper is the ``atari`` preset."""
    if not env.id.startswith("ALE/") or not env.wrappers or len(env.wrappers) != 1:
        return None
    (wrapper,) = env.wrappers
    if wrapper.name != "atari":
        return None
    from rl_app.envs.atari import native_options

    _register_namespace(env.id)
    return native_options(env.id, dict(env.config), dict(wrapper.kwargs), evaluation=evaluation)


def native_vector_env(env: EnvSection) -> str | None:
    """The vectorized implementation of its own that ``env`` has, named as the start prints it, or
    None (the runners then step Gymnasium's SyncVectorEnv of single envs): ale-py's
    ``AtariVectorEnv`` for an ALE id under the ``atari`` preset alone, or the env's
    ``vector_entry_point`` (CartPole's numpy vector env) for an id without wrappers."""
    if ":" in env.id:
        return None
    if _native_atari_options(env, evaluation=False) is not None:
        return ALE_VECTOR_ENV
    if env.wrappers or env.id.startswith("ALE/"):
        # ALE's registered vector entry point preprocesses its frames (84x84 grayscale, stacked),
        # which the single env it stands for does not.
        return None
    import gymnasium

    _register_namespace(env.id)
    spec = gymnasium.envs.registry.get(env.id)
    return f"{env.id}'s own vector env" if spec is not None and spec.vector_entry_point is not None else None


def has_native_vector_env(env: EnvSection) -> bool:
    """Whether ``env`` has a vectorized implementation of its own (see :func:`native_vector_env`)."""
    return native_vector_env(env) is not None


def make_native_vector_env(
    env: EnvSection,
    num_envs: int,
    config: Mapping[str, Any] | None = None,
    *,
    evaluation: bool = False,
    threads: int = 1,
) -> Any:
    """``num_envs`` copies of ``env`` as its own vector env (see :func:`native_vector_env`);
    ``evaluation`` leaves out the training-only parts as :func:`make_env` does, ``threads`` is how
    many threads ale-py's vector env steps its emulators in."""
    kwargs = dict(env.config if config is None else config)
    atari_options = _native_atari_options(env.model_copy(update={"config": kwargs}), evaluation)
    if atari_options is not None:
        from rl_app.envs.atari import make_vector_env

        return make_vector_env(num_envs, atari_options, threads)
    import gymnasium

    return gymnasium.make_vec(env.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)


def _create(env_data: dict[str, Any], evaluation: bool, threads: int, env_config: Mapping[str, Any]) -> Any:
    from rl_app.envs.multi_agent import is_multi_agent_env, make_multi_agent_env

    env, config = EnvSection.model_validate(env_data), dict(env_config)
    if is_multi_agent_env(env.id):
        return make_multi_agent_env(env, config=config)
    num_envs = config.pop("num_envs", None)  # RLlib asks for a whole vector env (vector_entry_point mode)
    if num_envs is not None:
        return make_native_vector_env(env, num_envs, config, evaluation=evaluation, threads=threads)
    return make_env(env, config=config, evaluation=evaluation)


def env_creator(
    env: EnvSection, evaluation: bool = False, threads: int = 1
) -> Callable[[Mapping[str, Any]], Any]:
    """An env creator in RLlib's form (``creator(env_config) -> env``) that calls :func:`make_env`,
    or, given ``num_envs`` in the config, :func:`make_native_vector_env` (in ``threads`` threads
    where it steps them in threads).

    It holds the section as plain data, so it pickles to remote env runners.
    """
    return functools.partial(_create, env.model_dump(mode="json"), evaluation, threads)


def has_training_only_wrappers(env: EnvSection) -> bool:
    """Whether ``env`` differs between training and evaluation (see :func:`make_env`)."""
    return any(
        w.name in TRAINING_ONLY or getattr(wrapper_class(w.name), "takes_evaluation_flag", False)
        for w in env.wrappers or ()
    )


def check_env(env: EnvSection) -> None:
    """Build the env once, reset it and take one step: ValueError naming the cause if any part
    fails (the constructor raises, a space rl_app cannot train on, reset or step returning what
    the spaces do not allow). Runs before Ray starts or anything is written."""
    import numpy as np

    try:
        instance = make_env(env)
    except Exception as exc:
        raise ValueError(f"cannot be created: {type(exc).__name__}: {error_detail(exc)}") from None
    try:
        problem = spaces_problem(instance.observation_space, instance.action_space)
        if problem:
            raise ValueError(problem)
        try:
            obs, _ = instance.reset(seed=0)
        except Exception as exc:
            raise ValueError(f"reset() raised {type(exc).__name__}: {error_detail(exc)}") from None
        _check_observation("reset()", obs, instance.observation_space)
        instance.action_space.seed(0)
        try:
            result = instance.step(instance.action_space.sample())
        except Exception as exc:
            raise ValueError(f"step() raised {type(exc).__name__}: {error_detail(exc)}") from None
        if not isinstance(result, tuple) or len(result) != 5:
            raise ValueError("step() must return (observation, reward, terminated, truncated, info)")
        _check_observation("step()", result[0], instance.observation_space)
        if not isinstance(result[1], int | float | np.number) or isinstance(result[1], bool):
            raise ValueError(
                f"step() returned a reward of type {type(result[1]).__name__} (expected a number)"
            )
    finally:
        with contextlib.suppress(Exception):  # closing is best effort: the check has said what it found
            instance.close()


def _check_observation(where: str, obs: Any, space: Any) -> None:
    if not space.contains(obs):
        shape = getattr(obs, "shape", None)
        dtype = getattr(obs, "dtype", type(obs).__name__)
        raise ValueError(
            f"{where} returned an observation (shape {shape}, dtype {dtype}) "
            f"outside its observation space {space}"
        )


@functools.cache
def _spaces(env_json: str) -> tuple[Any, Any]:
    instance = make_env(EnvSection.model_validate_json(env_json))
    try:
        return instance.observation_space, instance.action_space
    finally:
        with contextlib.suppress(Exception):
            instance.close()


def observation_space(env: EnvSection) -> Any:
    """The observation space of ``env`` (made once per process and section)."""
    return _spaces(env.model_dump_json())[0]


def action_space(env: EnvSection) -> Any:
    """The action space of ``env`` (made once per process and section)."""
    return _spaces(env.model_dump_json())[1]


def flattened_observation_space(env: EnvSection) -> dict[str, Any] | None:
    """The description (rl_app.envs.spaces.describe) of ``env``'s observation space where RLlib
    flattens it for the model; None for a Box, which the model takes as it is."""
    return flattened_description(observation_space(env))
