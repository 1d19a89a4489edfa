"""The only module that talks to RLlib's config API.

It maps a validated experiment onto ``AlgorithmConfig``'s fluent setters, runs
RLlib's own ``validate()`` and turns its errors into one-line messages. When RLlib
renames a knob, only this file changes.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_app.algorithms import ALGORITHMS, AlgorithmSpec
from rl_app.errors import ConfigError, first_line
from rl_app.resources import ResourcePlan


def algorithm_spec(experiment: Any) -> AlgorithmSpec:
    return ALGORITHMS[experiment.algorithm]


def algorithm_build_modules(experiment: Any) -> list[str]:
    """The slow imports of building the experiment's algorithm in this process, for
    ``ray_session(preload=...)``: the module of its RLlib ``AlgorithmConfig``, and
    torch._inductor, which RLlib's seeding (torch.use_deterministic_algorithms) imports on
    first use (~0.8 s here)."""
    return [algorithm_spec(experiment).config_class.partition(":")[0], "torch._inductor"]


def _config_class(spec: AlgorithmSpec) -> type:
    module_name, _, class_name = spec.config_class.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def training_kwargs(experiment: Any) -> dict[str, Any]:
    """The experiment's training section as keyword arguments of ``.training()``."""
    kwargs = experiment.training.model_dump(exclude_none=True)
    if "replay_buffer" in kwargs:
        kwargs["replay_buffer_config"] = kwargs.pop("replay_buffer")
    for key in ("lr", "epsilon"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = [list(point) for point in kwargs[key]]
    if isinstance(kwargs.get("n_step"), tuple):
        kwargs["n_step"] = tuple(kwargs["n_step"])
    return kwargs


def _env_name(env_id: str) -> str:
    """Gymnasium ids pass straight to RLlib; 'module:Class' ids are registered with Tune."""
    if ":" not in env_id:
        return env_id
    from ray.tune.registry import register_env

    from rl_app.envs import make_env_creator

    register_env(env_id, make_env_creator(env_id))
    return env_id


def evaluation_envs(episodes: int, num_runners: int, most: int = 64) -> int:
    """Vector-env width for evaluation: one episode per env where possible.

    RLlib's evaluation keeps the first N episodes to finish; with more envs than episodes
    (16 envs, 10 episodes) that is the N shortest, a return biased low. Envs that divide
    the episodes of each runner evenly keep every env's first episode instead.
    """
    per_runner = -(-episodes // max(1, num_runners))
    return max(n for n in range(1, min(per_runner, most) + 1) if per_runner % n == 0)


def build_algorithm_config(experiment: Any, plan: ResourcePlan, source: str) -> Any:
    """An RLlib ``AlgorithmConfig`` for ``experiment``, validated by RLlib."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    spec = algorithm_spec(experiment)
    runners = experiment.env_runners
    config = (
        _config_class(spec)()
        .framework("torch")
        .environment(env=_env_name(experiment.env.id), env_config=dict(experiment.env.config))
        .env_runners(
            num_env_runners=plan.num_env_runners,
            num_envs_per_env_runner=plan.num_envs_per_env_runner,
            rollout_fragment_length=runners.rollout_fragment_length,
        )
        .learners(
            num_learners=plan.num_learners,
            num_gpus_per_learner=plan.num_gpus_per_learner,
        )
        .training(**training_kwargs(experiment))
        .rl_module(model_config=DefaultModelConfig(**experiment.model.model_dump(exclude_none=True)))
        .debugging(seed=experiment.seed)
    )
    if not spec.asynchronous_sampling:
        # SAC's default also ends an iteration after at least 1 s, which puts iteration
        # boundaries (and so evaluation points and stop checks) at the mercy of wall time;
        # without it an iteration is a step count and a seeded run repeats itself.
        config.reporting(min_time_s_per_iteration=None)
    evaluation = experiment.evaluation
    if evaluation.interval:
        config.evaluation(
            evaluation_interval=evaluation.interval,
            evaluation_duration=evaluation.episodes,
            evaluation_duration_unit="episodes",
            evaluation_num_env_runners=evaluation.num_env_runners,
            evaluation_config={
                "explore": evaluation.explore,
                "num_envs_per_env_runner": evaluation_envs(evaluation.episodes, evaluation.num_env_runners),
            },
        )
        config.callbacks(on_evaluate_end=vary_evaluation_starts)
    try:
        config.validate()
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(source, f"RLlib rejected the config: {first_line(exc)}") from None
    return config


def vary_evaluation_starts(algorithm: Any, **_: Any) -> None:
    """After each evaluation, let the eval envs' own (seeded) RNG pick the next start states.

    RLlib's env runner resets its envs with its fixed seed every time it is asked for a
    number of episodes, so otherwise every evaluation replays the same start states and
    "best evaluation return" ranks checkpoints on those few alone. The first evaluation
    is still seeded, so a seeded run stays reproducible.
    """
    algorithm.eval_env_runner_group.foreach_env_runner(_unseed_resets, local_env_runner=True)


def _unseed_resets(runner: Any) -> None:
    runner._seed = None  # private, but the only switch: RLlib reads it at each reset


def build_algorithm(config: Any) -> Any:
    """``config.build_algo()``, with the replay buffer's sampling seeded too.

    RLlib seeds env runners and learners from ``config.seed`` but creates its episode
    replay buffers with ``np.random.default_rng(None)``, so without this a DQN or SAC
    run samples different minibatches (and n-steps) every time it is started.
    """
    import numpy as np

    algo = config.build_algo()
    buffer = getattr(algo, "local_replay_buffer", None)
    if buffer is not None and config.seed is not None and hasattr(buffer, "rng"):
        buffer.rng = np.random.default_rng(config.seed)
    return algo


def resolved_settings(experiment: Any, config: Any) -> dict[str, Any]:
    """The experiment with every unset training/model value filled in from RLlib's config."""
    resolved = experiment.model_dump(mode="json", by_alias=True, exclude={"extends"})
    training = {}
    for name, info in type(experiment.training).model_fields.items():
        rllib_name = "replay_buffer_config" if name == "replay_buffer" else name
        training[info.alias or name] = _plain(getattr(config, rllib_name, None))
    resolved["training"] = training
    model_config = config.model_config
    resolved["model"] = {name: _plain(model_config.get(name)) for name in resolved["model"]}
    return resolved


def _plain(value: Any) -> Any:
    """A YAML-friendly copy of an RLlib config value."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
