"""Experiment -> RLlib ``AlgorithmConfig``: the fluent setters, RLlib's own ``validate()``, its
errors as one line. When RLlib renames a knob, only this file changes."""

from __future__ import annotations

import hashlib
import importlib
import json
from typing import TYPE_CHECKING, Any

from rl_app.algorithms import AlgorithmSpec, algorithm_spec
from rl_app.cluster.resources import ResourcePlan
from rl_app.config import EnvSection, ExperimentConfig
from rl_app.errors import ConfigError, first_line

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from rl_app.envs.multi_agent import MultiAgentSetup
    from rl_app.rllib.accel import AccelerationPlan

RLLIB_ALGORITHMS = "ray.rllib.algorithms"


def _config_module(spec: AlgorithmSpec) -> str:
    return f"{RLLIB_ALGORITHMS}.{spec.rllib_config.partition(':')[0]}"


def algorithm_build_modules(experiment: ExperimentConfig) -> list[str]:
    """The slow imports of building the experiment's algorithm in this process, for
    ``ray_session(preload=...)``: the module of its RLlib ``AlgorithmConfig``, and
    torch._inductor, which RLlib's seeding (torch.use_deterministic_algorithms) imports on
    first use."""
    spec = algorithm_spec(experiment.algorithm)
    return [_config_module(spec), "torch._inductor"] if spec.backend == "rllib" else []


def _config_class(spec: AlgorithmSpec) -> type[AlgorithmConfig]:
    class_name = spec.rllib_config.partition(":")[2]
    config_class: type[AlgorithmConfig] = getattr(importlib.import_module(_config_module(spec)), class_name)
    return config_class


def registered_env(env: EnvSection, evaluation: bool = False, threads: int = 1) -> str:
    """Register the experiment's env with Tune under a name RLlib can use, and return that name.

    Every env reaches RLlib through :func:`rl_app.envs.make_env` (with the declared
    wrappers), as it reaches evaluation and export. The name includes the wrappers, so
    two experiments on one id with different wrappers never share a creator, and says
    whether it is the evaluation variant (no training-only wrappers) and how many threads a runner
    may step ale-py's vector env in (``threads``).
    """
    from ray.tune.registry import register_env

    from rl_app.envs import env_creator

    wrappers = json.dumps(env.model_dump(mode="json")["wrappers"], sort_keys=True)
    name = (
        f"rl_app:{env.id}"
        if env.wrappers is None
        else f"rl_app:{env.id}:{hashlib.sha1(wrappers.encode()).hexdigest()[:8]}"
    )
    if evaluation:
        name += ":evaluation"
    if threads != 1:
        name += f":{threads}-threads"
    register_env(name, env_creator(env, evaluation=evaluation, threads=threads))
    return name


def env_to_module_pieces(
    env: Any = None,
    spaces: Any = None,
    device: Any = None,
    *,
    flatten: bool = False,
    mean_std: bool = False,
    flattened_agents: list[str] | None = None,
) -> list[Any]:
    """RLlib's env-to-module connectors the experiment adds to RLlib's defaults, in this order:
    ``FlattenObservations`` for observations that are not a Box (see rl_app.envs.spaces), then
    ``MeanStdFilter``, observations normalised by running statistics that RLlib merges over the env
    runners every iteration and keeps in the checkpoint. ``flattened_agents``: several agents, those
    whose observations are flattened."""
    from ray.rllib.connectors.env_to_module import FlattenObservations, MeanStdFilter

    if flattened_agents is not None:
        return [FlattenObservations(multi_agent=True, agent_ids=flattened_agents)]
    return [FlattenObservations()] * flatten + [MeanStdFilter(multi_agent=False)] * mean_std


def env_to_module_connector(experiment: ExperimentConfig, agents: MultiAgentSetup | None = None) -> Any:
    """The ``env_to_module_connector`` of the experiment's config (None: RLlib's defaults alone);
    ``agents``: the multi-agent setup of a multi-agent experiment."""
    import functools

    import gymnasium as gym

    from rl_app.envs import observation_space

    if agents is not None:  # (no observation filter: refused for several agents)
        flattened = [
            agent
            for agent in agents.mapping.agents
            if not isinstance(agents.spaces[agents.mapping.policy_of(agent)][0], gym.spaces.Box)
        ]
        return functools.partial(env_to_module_pieces, flattened_agents=flattened) if flattened else None
    mean_std = experiment.env_runners.observation_filter == "MeanStdFilter"
    flatten = not isinstance(observation_space(experiment.env), gym.spaces.Box)
    if not (flatten or mean_std):
        return None
    return functools.partial(env_to_module_pieces, flatten=flatten, mean_std=mean_std)


# RLlib's algorithms whose default modules take model.use_lstm on the new API stack.
RECURRENT_ALGORITHMS = ("PPO", "APPO", "IMPALA")

OUR_MODEL_KEYS = {"ortho_init", "sac_critic"}  # model keys our catalogs read, not RLlib's DefaultModelConfig


def _catalog_class(experiment: ExperimentConfig, source: str, sac: bool, spaces: tuple[Any, Any]) -> Any:
    """Our catalog where the experiment's model needs one (``model.ortho_init``, SAC's critic),
    None where RLlib's default catalog builds it; ``sac``: the default module is RLlib's SAC's;
    ``spaces``: the module's (observation space, action space)."""
    from rl_app.algorithms import ALGORITHMS
    from rl_app.rllib.catalog import ConcatCriticSACCatalog, OrthoInitPPOCatalog, is_concat_critic_eligible

    model = experiment.model
    if model.use_lstm and experiment.algorithm not in RECURRENT_ALGORITHMS:
        takers = ", ".join(RECURRENT_ALGORITHMS)
        message = f"applies to {takers} here, not {experiment.algorithm}"
        raise ConfigError(source, message, key="model.use_lstm")
    if model.ortho_init and model.use_lstm:
        message = "initialises MLP encoders, not the LSTM of model.use_lstm"
        raise ConfigError(source, message, key="model.ortho_init")
    if model.ortho_init:
        if not algorithm_spec(experiment.algorithm).ortho_init:
            takers = ", ".join(name for name, spec in ALGORITHMS.items() if spec.ortho_init)
            message = f"applies to {takers}, not {experiment.algorithm}"
            raise ConfigError(source, message, key="model.ortho_init")
        return OrthoInitPPOCatalog
    if model.sac_critic is not None and not sac:
        raise ConfigError(source, f"applies to SAC, not {experiment.algorithm}", key="model.sac_critic")
    if not sac or model.sac_critic == "multi_stream":
        return None
    eligible = is_concat_critic_eligible(*spaces)
    if model.sac_critic == "concat" and not eligible:
        raise ConfigError(
            source,
            "concat needs a flat Box observation and a flat Box action space (allowed here: multi_stream)",
            key="model.sac_critic",
        )
    fusion_keys = ("fusionnet_hiddens", "fusionnet_activation")
    fusion = [key for key in fusion_keys if getattr(model, key) is not None]
    if eligible and fusion:
        raise ConfigError(
            source,
            "the fusion net belongs to RLlib's critic: set model.sac_critic: multi_stream to use it",
            key=f"model.{fusion[0]}",
        )
    return ConcatCriticSACCatalog if eligible else None


def _module_spec(
    experiment: ExperimentConfig,
    config: AlgorithmConfig,
    source: str,
    acceleration: AccelerationPlan,
    spaces: tuple[Any, Any] | None = None,
) -> Any:
    """RLlib's module spec where the experiment needs other than RLlib's default module: image
    observations (our module that takes them as the env makes them), our catalog, SAC's tanh-mode
    module; None otherwise. ``spaces``: the module's (observation space, action space), where they
    are not the env's (one policy of several agents)."""
    from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_app.algorithms import ALGORITHMS
    from rl_app.envs import action_space, observation_space
    from rl_app.envs.spaces import MASK_KEY, is_masked
    from rl_app.rllib.catalog import (
        ConcatCriticSACCatalog,
        ConcatCriticSACTorchRLModule,
        PlainConcatCriticSACTorchRLModule,
        TanhModeSACTorchRLModule,
    )
    from rl_app.rllib.masking import masked_module_class
    from rl_app.rllib.pixels import has_raw_inputs, image_module_class

    default_spec: Any = config.get_default_rl_module_spec()
    module_class = default_spec.module_class
    spaces = spaces or (observation_space(experiment.env), action_space(experiment.env))
    space = spaces[0]
    if has_raw_inputs(space):
        if not algorithm_spec(experiment.algorithm).image_inputs:
            *others, last = (name for name, spec in ALGORITHMS.items() if spec.image_inputs)
            takers = f"{', '.join(others)} or {last}"
            raise ConfigError(
                source,
                f"algorithm: {experiment.algorithm} has no image-input model here "
                f"(observations of {space.shape} {space.dtype}, not floats, train with {takers})",
            )
        module_class = image_module_class(default_spec.module_class)
    if is_masked(space):  # the mask itself was checked with the env (rl_app.envs.check_env)
        masked = masked_module_class(default_spec.module_class)
        if masked is None:
            message = f"masks the actions of PPO, APPO, IMPALA and DQN here, not {experiment.algorithm}'s"
            raise ConfigError(source, f"an observation with '{MASK_KEY}' {message}", key="env")
        module_class = masked
    sac = module_class is DefaultSACTorchRLModule
    catalog_class = _catalog_class(experiment, source, sac, spaces)
    if sac:
        if catalog_class is not ConcatCriticSACCatalog:
            module_class = TanhModeSACTorchRLModule
        elif acceleration.uses("module"):
            module_class = ConcatCriticSACTorchRLModule
        else:
            module_class = PlainConcatCriticSACTorchRLModule
    if module_class is default_spec.module_class and catalog_class is None:
        return None
    return RLModuleSpec(module_class=module_class, catalog_class=catalog_class)


def multi_agent_setup_of(experiment: ExperimentConfig, source: str) -> MultiAgentSetup | None:
    """The policies, their spaces and the mapping of a multi-agent experiment (None: one agent)."""
    from rl_app.envs.multi_agent import MappingError, multi_agent_section, multi_agent_setup

    section = multi_agent_section(experiment)
    if section is None:
        return None
    try:
        return multi_agent_setup(experiment.env, section)
    except MappingError as exc:
        raise ConfigError(source, str(exc), key="multi_agent") from None


def _multi_module_spec(
    experiment: ExperimentConfig,
    config: AlgorithmConfig,
    source: str,
    acceleration: AccelerationPlan,
    agents: MultiAgentSetup,
) -> Any:
    """One module spec per policy, each as :func:`_module_spec` gives it for the policy's spaces
    (RLlib infers the spaces themselves from the env and connectors, through the mapping)."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    specs = {}
    for policy, spaces in agents.spaces.items():
        spec = _module_spec(experiment, config, source, acceleration, spaces)
        specs[policy] = spec if spec is not None else RLModuleSpec()
    return MultiRLModuleSpec(rl_module_specs=specs)


def vectorizes_natively(experiment: ExperimentConfig) -> bool:
    """Whether the runners step the env's own vector env (``env_runners.vectorize``)."""
    from rl_app.envs import has_native_vector_env

    return experiment.env_runners.vectorize == "auto" and has_native_vector_env(experiment.env)


def env_threads(experiment: ExperimentConfig, plan: ResourcePlan) -> int:
    """The threads a runner steps its vector env in: the plan's share of the cores for ale-py's
    (the one vector env that runs threads), 1 for every other."""
    from rl_app.envs import native_vector_env
    from rl_app.envs.factory import ALE_VECTOR_ENV

    threaded = vectorizes_natively(experiment) and native_vector_env(experiment.env) == ALE_VECTOR_ENV
    return plan.env_threads if threaded else 1


def training_kwargs(experiment: ExperimentConfig) -> dict[str, Any]:
    """The experiment's training section as keyword arguments of ``.training()``."""
    kwargs = experiment.training.model_dump(exclude_none=True)
    kwargs.pop("critic_loss", None)  # rl_app's learner's, not RLlib's (see _critic_loss)
    if "replay_buffer" in kwargs:
        kwargs["replay_buffer_config"] = kwargs.pop("replay_buffer")
        kwargs["replay_buffer_config"].pop("implementation", None)
    if "actor_lr" in type(experiment.training).model_fields and "lr" not in kwargs:
        # Separate actor and critic rates (CQL, IQL): RLlib refuses a set `lr` beside them, and
        # CQL's config has one by default.
        kwargs["lr"] = None
    for key in ("lr", "epsilon"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = [list(point) for point in kwargs[key]]
    if isinstance(kwargs.get("n_step"), tuple):
        kwargs["n_step"] = tuple(kwargs["n_step"])
    return kwargs


def _critic_loss(
    experiment: ExperimentConfig, acceleration: Any, config: AlgorithmConfig, source: str
) -> None:
    """SAC's ``training.critic_loss`` for the learner: 'mse' is rl_app's SAC learner's (RLlib's has
    Huber only), for continuous actions, so it needs that learner to be the one that runs."""
    import gymnasium as gym

    from rl_app.envs import action_space
    from rl_app.rllib.accel import CRITIC_LOSS

    chosen = getattr(experiment.training, CRITIC_LOSS, None)
    if chosen != "mse":
        return
    key = f"training.{CRITIC_LOSS}"
    if not isinstance(action_space(experiment.env), gym.spaces.Box):
        raise ConfigError(source, "mse is for continuous (Box) actions; allowed here: huber", key=key)
    if not acceleration.uses("learner"):
        why = acceleration.off.get("learner") or acceleration.everything_off
        message = f"mse needs rl_app's SAC learner, which this run does not use ({why}); allowed: huber"
        raise ConfigError(source, message, key=key)
    config.learners(learner_config_dict={CRITIC_LOSS: chosen})


def dataset_location(location: str) -> str:
    """A recording's folder as Ray Data's readers take it: a URI as given, a path made absolute (its
    reading actors run in other processes)."""
    from pathlib import Path

    from rl_app.runs.storage import is_uri

    return location if is_uri(location) else str(Path(location).expanduser().resolve())


def evaluation_envs(episodes: int, num_runners: int, most: int = 64) -> int:
    """Vector-env width for evaluation: one episode per env where possible.

    RLlib's evaluation keeps the first N episodes to finish; with more envs than episodes
    (16 envs, 10 episodes) that is the N shortest, a return biased low. Envs that divide
    the episodes of each runner evenly keep every env's first episode instead.
    """
    per_runner = -(-episodes // max(1, num_runners))
    return max(n for n in range(1, min(per_runner, most) + 1) if per_runner % n == 0)


def algorithm_config(experiment: ExperimentConfig, plan: ResourcePlan, source: str) -> AlgorithmConfig:
    """An RLlib ``AlgorithmConfig`` for ``experiment``, validated by RLlib."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rl_app.envs import has_training_only_wrappers
    from rl_app.rllib.accel import apply_plan, plan_acceleration
    from rl_app.rllib.env_runner import env_runner_class
    from rl_app.rllib.results import EvaluationClock
    from rl_app.rllib.runners import PROBE_TIMEOUT_S

    spec = algorithm_spec(experiment.algorithm)
    acceleration = plan_acceleration(experiment, plan)
    runners = experiment.env_runners
    agents = multi_agent_setup_of(experiment, source)
    threads = env_threads(experiment, plan)
    config = (
        _config_class(spec)()
        .framework("torch")
        .environment(
            env=registered_env(experiment.env, threads=threads),
            env_config=dict(experiment.env.config),
        )
        .env_runners(
            env_runner_cls=env_runner_class(
                runners.restart_failed_envs,
                runners.max_env_failures,
                acceleration.uses("runner"),
                multi_agent=agents is not None,
            ),
            env_to_module_connector=env_to_module_connector(experiment, agents),
            num_env_runners=plan.num_env_runners,
            num_envs_per_env_runner=plan.num_envs_per_env_runner,
            rollout_fragment_length=runners.rollout_fragment_length,
            gym_env_vectorize_mode="vector_entry_point" if vectorizes_natively(experiment) else "sync",
        )
        .learners(
            num_learners=plan.num_learners,
            num_gpus_per_learner=plan.num_gpus_per_learner,
        )
        .training(**training_kwargs(experiment))
        .rl_module(
            model_config=DefaultModelConfig(
                **experiment.model.model_dump(exclude_none=True, exclude=OUR_MODEL_KEYS)
            )
        )
        # No Tune system-usage thread: the driver records CPU and memory itself
        # (console/telemetry.py), and stopping that thread waits out its 0.7 s poll.
        .debugging(seed=experiment.seed, log_sys_usage=False)
        .fault_tolerance(
            restart_failed_env_runners=True,
            max_num_env_runner_restarts=runners.max_restarts,
            # Failing envs are our runner's to handle (it counts them and knows when to stop).
            restart_failed_sub_environments=False,
            # Lost runners are pinged without waiting (rl_app.rllib.runners).
            env_runner_health_probe_timeout_s=PROBE_TIMEOUT_S,
        )
    )
    if not spec.asynchronous_sampling:
        # SAC's default also ends an iteration after at least 1 s, which puts iteration
        # boundaries (and so evaluation points and stop checks) at the mercy of wall time;
        # without it an iteration is a step count and a seeded run repeats itself.
        config.reporting(min_time_s_per_iteration=None)
    if spec.offline:
        offline = experiment.offline
        assert offline is not None  # the schema requires it of an offline algorithm
        updates = offline.updates_per_iteration or (5 if experiment.algorithm == "CQL" else 1)
        if experiment.algorithm == "CQL" and updates == 1:
            # CQL's training_step hands a single batch to the learner as if it were an iterator.
            raise ConfigError(
                source,
                "CQL (RLlib 2.60) trains only with more than 1 (default 5)",
                key="offline.updates_per_iteration",
            )
        from rl_app.envs import action_space, observation_space

        # Without evaluation RLlib makes no env to read the spaces from: they are given.
        config.environment(
            observation_space=observation_space(experiment.env), action_space=action_space(experiment.env)
        )
        config.offline_data(
            input_=dataset_location(offline.input),
            input_read_method="read_parquet",
            # Read by one Ray Data actor: the machine's other core, as the learner runs on the driver.
            dataset_num_iters_per_learner=updates,
            map_batches_kwargs={"concurrency": 1, "num_cpus": 1},
            iter_batches_kwargs={"prefetch_batches": 1},
        )
    apply_plan(acceleration, experiment.algorithm, config)
    _critic_loss(experiment, acceleration, config, source)
    if agents is not None:
        config.multi_agent(
            policies=set(agents.spaces),
            policy_mapping_fn=agents.mapping,
            policies_to_train=list(agents.trained),
        )
        config.rl_module(rl_module_spec=_multi_module_spec(experiment, config, source, acceleration, agents))
        if agents.self_play is not None:
            from rl_app.rllib.self_play import RefreshOpponent

            play = agents.self_play
            config.callbacks(
                on_train_result=RefreshOpponent(play.learner, play.opponent, play.refresh_return)
            )
    else:
        module_spec = _module_spec(experiment, config, source, acceleration)
        if module_spec is not None:
            config.rl_module(rl_module_spec=module_spec)
    evaluation = experiment.evaluation
    clock = EvaluationClock()
    config.callbacks(on_evaluate_start=clock.start, on_evaluate_end=clock.end)
    if evaluation.interval:
        evaluation_env = (
            {"env": registered_env(experiment.env, evaluation=True, threads=threads)}
            if has_training_only_wrappers(experiment.env)
            else {}
        )
        config.evaluation(
            evaluation_interval=evaluation.interval,
            evaluation_duration=evaluation.episodes,
            evaluation_duration_unit="episodes",
            evaluation_num_env_runners=evaluation.num_env_runners,
            evaluation_config={
                "explore": evaluation.explore,
                "num_envs_per_env_runner": evaluation_envs(evaluation.episodes, evaluation.num_env_runners),
                **evaluation_env,
            },
        )
    try:
        config.validate()
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(source, f"RLlib rejected the config: {first_line(exc)}") from None
    return config


def describe_rllib_setup(experiment: ExperimentConfig, plan: ResourcePlan) -> str:
    """The Resources line's word on RLlib: which of rl_app's parts run (and why not the others),
    and whether the runners step the env's own vector env."""
    from rl_app.envs import native_vector_env
    from rl_app.envs.factory import ALE_VECTOR_ENV
    from rl_app.rllib.accel import plan_acceleration

    text = plan_acceleration(experiment, plan).describe()
    if experiment.offline is not None:
        text += f"; learns from {experiment.offline.input} through Ray Data, the env only evaluates"
    if not vectorizes_natively(experiment):
        return text
    vector_env = native_vector_env(experiment.env)
    if vector_env == ALE_VECTOR_ENV:
        vector_env += f" ({plan.env_threads} thread{'s' if plan.env_threads != 1 else ''} a runner)"
    return f"{text}; {vector_env}"


def resolved_settings(
    experiment: ExperimentConfig, config: AlgorithmConfig, plan: ResourcePlan
) -> dict[str, Any]:
    """The experiment with every unset training/model value filled in from RLlib's config, and the
    acceleration plan it runs with."""
    from rl_app.rllib.accel import CRITIC_LOSS, plan_acceleration

    resolved = experiment.model_dump(mode="json", by_alias=True, exclude={"extends"})
    resolved["acceleration_plan"] = plan_acceleration(experiment, plan).as_dict()
    training = {}
    for name, info in type(experiment.training).model_fields.items():
        rllib_name = "replay_buffer_config" if name == "replay_buffer" else name
        training[info.alias or name] = _plain(getattr(config, rllib_name, None))
    if CRITIC_LOSS in training:  # in the learner's settings, RLlib's Huber where not set
        training[CRITIC_LOSS] = config.learner_config_dict.get(CRITIC_LOSS, "huber")
    if isinstance(training.get("replay_buffer"), dict):  # ours, not RLlib's
        chosen = getattr(experiment.training, "replay_buffer", None)
        training["replay_buffer"]["implementation"] = chosen.implementation if chosen else "auto"
    resolved["training"] = training
    model_config = config.model_config
    resolved["model"] = {
        name: _plain(model_config.get(name)) for name in resolved["model"] if name not in OUR_MODEL_KEYS
    }
    resolved["model"]["ortho_init"] = bool(experiment.model.ortho_init)
    from rl_app.envs.multi_agent import PolicyMapping

    mapping = config.policy_mapping_fn
    if isinstance(mapping, PolicyMapping):  # several agents: who acts with which policy
        play = mapping.self_play
        resolved["multi_agent"] = {
            **(resolved.get("multi_agent") or {}),
            "agents": {
                agent: f"{play[0]} or {play[1]}, in turn" if play else mapping.policy_of(agent)
                for agent in mapping.agents
            },
            "train": sorted(config.policies_to_train or config.policies),
        }
    from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule

    from rl_app.rllib.catalog import ConcatCriticSACCatalog

    module_class = getattr(config.rl_module_spec, "module_class", None)
    if isinstance(module_class, type) and issubclass(module_class, DefaultSACTorchRLModule):
        concat = config.rl_module_spec.catalog_class is ConcatCriticSACCatalog
        resolved["model"]["sac_critic"] = "concat" if concat else "multi_stream"
    schedule = replay_schedule(experiment, config)
    if schedule is not None:
        resolved["replay_schedule"] = schedule
    return resolved


def replay_schedule(experiment: ExperimentConfig, config: AlgorithmConfig) -> str | None:
    """How often a DQN or SAC run updates, as their training step rounds go: the updates (and
    their rows) per round of sampled env steps. RLlib's round is ``rollout_fragment_length`` steps
    of each env of each runner, and ``auto`` is ``n_step``'s largest, so multi-step returns also
    mean fewer updates per env step; said here because nothing else in the YAML shows it."""
    if experiment.algorithm not in ("DQN", "SAC"):  # the two that sample and replay (never offline)
        return None
    from rl_app.rllib.accel.adapter import round_weights

    store_weight, train_weight = round_weights(config)
    per_round = config.get_rollout_fragment_length() * config.num_envs_per_env_runner
    steps = store_weight * per_round * max(config.num_env_runners, 1)
    updates = f"{train_weight} update{'s' if train_weight != 1 else ''}"
    every = "env step" if steps == 1 else f"{steps:,} env steps"
    return f"{updates} of {config.total_train_batch_size} rows per {every}"


def _plain(value: Any) -> Any:
    """A YAML-friendly copy of an RLlib config value."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def trial_resources(config: AlgorithmConfig) -> Any:
    """What one sweep trial of ``config`` asks Tune for: RLlib sizes the placement group (the
    trial process, its env runner and learner actors)."""
    algo_class: Any = config.algo_class
    return algo_class.default_resource_request(config)
