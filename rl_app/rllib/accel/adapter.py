"""Every private RLlib name rl_app's faster parts use, in one file, checked.

RLlib offers no public hook for what these parts replace, so they read and override a few dozen
of its private names (``_sample``, ``_ongoing_episodes``, ``_uncompiled_update``, ...). The rest
of rl_app reaches them only through the names below, so that an upgrade of Ray means reading one
file: :func:`adapter_problem` checks at the first plan that each private method and keyword still
exists where RLlib 2.60 has it, with the parameters rl_app relies on; if one does not, the plan
turns every part off with one line saying which, and the run uses RLlib's own classes.
tests/test_fence.py checks the private attributes too, and holds a hash of the source of every
RLlib function the parts copy, naming the copy to re-read when one changes.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from typing import Any, cast

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights
from ray.rllib.algorithms.sac.sac_catalog import SACCatalog
from ray.rllib.algorithms.sac.sac_learner import QF_LOSS_KEY, QF_PREDS, QF_TWIN_LOSS_KEY, QF_TWIN_PREDS
from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
from ray.rllib.connectors.env_to_module import MeanStdFilter
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.models.torch.encoder import TorchMLPEncoder
from ray.rllib.core.models.torch.heads import TorchFreeLogStdMLPHead
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

# (module, class): the private methods rl_app overrides or calls, with the parameters it relies on.
PRIVATE_METHODS: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner"): {
        "_sample": ("self", "num_timesteps", "num_episodes", "explore", "random_actions", "force_reset"),
        "_increase_sampled_metrics": ("self", "num_steps", "num_episodes_completed"),
        "_log_episode_metrics": ("self", "length", "ret", "sec"),
    },
    ("ray.rllib.env.env_runner", "EnvRunner"): {
        "_try_env_step": ("self", "actions"),
        "_try_env_reset": ("self", "seed", "options"),
        "_reset_envs_and_episodes": ("self", "explore"),
        "_log_env_steps": ("self", "metric", "num_steps"),
    },
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner"): {
        "_uncompiled_update": ("self", "batch", "kwargs"),
        "_compute_off_policyness": ("self", "batch"),
        "_get_clip_function": (),
        "_update": ("self", "batch"),
        "_get_optimizer_lr": ("optimizer",),
        "_set_optimizer_lr": ("optimizer", "lr"),
    },
    ("ray.rllib.core.learner.learner", "Learner"): {
        "_create_iterator_if_necessary": (
            "self", "training_data", "num_total_minibatches", "num_epochs", "minibatch_size",
            "shuffle_batch_per_epoch", "kwargs",
        ),
        "_log_metrics": ("self", "batch"),
        "_log_steps_trained_metrics": ("self", "batch"),
    },
    ("ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module", "DefaultSACTorchRLModule"): {
        "_forward_train_continuous": ("self", "batch"),
        "_forward_inference": ("self", "batch"),
        "_forward_exploration": ("self", "batch", "kwargs"),
        "_forward_train": ("self", "batch"),
    },
    ("ray.rllib.algorithms.sac.sac_catalog", "SACCatalog"): {
        "_build_qf_encoder_continuous": ("self", "framework"),
    },
    ("ray.rllib.core.models.torch.encoder", "TorchMLPEncoder"): {
        "_forward": ("self", "inputs", "kwargs"),
    },
    # FilterEachObservation makes the connector's filters where it has none yet.
    ("ray.rllib.connectors.env_to_module.mean_std_filter", "MeanStdFilter"): {
        "_init_new_filters": ("self",),
    },
    # ForwardHooks (action masking) overrides the forward passes RLlib's PPO-family modules run.
    ("ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module", "DefaultPPOTorchRLModule"): {
        "_forward": ("self", "batch", "kwargs"),
        "_forward_train": ("self", "batch", "kwargs"),
    },
}  # fmt: skip

# (module, class): private attributes its instances carry, as the class's source assigns them.
PRIVATE_ATTRIBUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner"): (
        "_env_to_module", "_module_to_env", "_time_after_sampling", "_weights_seq_no",
        "_env_runner_state_server", "_ongoing_episodes", "_needs_initial_reset", "_cached_to_module",
        "_done_episodes_for_metrics", "_ongoing_episodes_for_metrics",
    ),
    ("ray.rllib.env.env_runner", "EnvRunner"): ("_seed", "_metrics_num_env_steps_sampled"),
    ("ray.rllib.env.multi_agent_env_runner", "MultiAgentEnvRunner"): ("_needs_initial_reset",),
    ("ray.rllib.core.learner.learner", "Learner"): (
        "_params", "_module_optimizers", "_device", "_weights_seq_no", "_optimizer_lr_schedules",
        "_named_optimizers", "_optimizer_parameters", "_metrics_learner_inner_update",
        "_metrics_all_modules_num_env_steps_trained", "_metrics_all_modules_num_module_steps_trained",
    ),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner"): (
        "_grad_scalers", "_lr_scheduler_classes",
    ),
    ("ray.rllib.algorithms.sac.torch.sac_torch_learner", "SACTorchLearner"): ("_temp_losses",),
    ("ray.rllib.core.rl_module.multi_rl_module", "MultiRLModule"): ("_rl_modules",),
    ("ray.rllib.core.models.catalog", "Catalog"): ("_encoder_config",),
    ("ray.rllib.connectors.env_to_module.mean_std_filter", "MeanStdFilter"): ("_filters", "_update_stats"),
    ("ray.rllib.utils.minibatch_utils", "MiniBatchCyclicIterator"): (
        "_batch", "_minibatch_size", "_num_epochs", "_shuffle_batch_per_epoch", "_num_total_minibatches",
    ),
    ("ray.rllib.env.single_agent_episode", "SingleAgentEpisode"): (
        "_start_time", "_last_step_time", "_last_added_observation", "_last_added_infos", "_custom_data",
        "_action_space", "_observation_space",
    ),
    ("ray.rllib.env.utils.infinite_lookback_buffer", "InfiniteLookbackBuffer"): ("_space", "_space_struct"),
    # Not underscored, yet only the head's forward pass reads them (BatchFreeLogStdHead).
    ("ray.rllib.core.models.torch.heads", "TorchFreeLogStdMLPHead"): (
        "net", "log_std", "clip_log_std", "log_std_clip_param_const",
    ),
    # Not underscored either: the network each encoder's and head's forward pass calls (inner_net).
    ("ray.rllib.core.models.torch.encoder", "TorchMLPEncoder"): ("net",),
    ("ray.rllib.core.models.torch.encoder", "TorchCNNEncoder"): ("net",),
    ("ray.rllib.core.models.torch.heads", "TorchMLPHead"): ("net",),
}  # fmt: skip

# (module, class): methods a class must leave to its bases, because rl_app's learners replace the
# base's with their own and call the one below it (after_gradient_based_update_below_dqn).
NOT_OVERRIDDEN: dict[tuple[str, str], tuple[str, ...]] = {
    ("ray.rllib.algorithms.dqn.torch.dqn_torch_learner", "DQNTorchLearner"): ("after_gradient_based_update",),
    ("ray.rllib.algorithms.sac.sac_learner", "SACLearner"): ("after_gradient_based_update",),
    ("ray.rllib.algorithms.sac.torch.sac_torch_learner", "SACTorchLearner"): ("after_gradient_based_update",),
}

# (module, function): private keyword arguments rl_app passes.
PRIVATE_KEYWORDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("ray.rllib.execution.rollout_ops", "synchronous_parallel_sample"): (
        "_uses_new_env_runners",
        "_return_metrics",
    ),
    ("ray.rllib.core.learner.learner", "Learner.update"): ("_no_metrics_reduce",),
}


def _resolve(module: str, qualname: str) -> Any:
    import importlib

    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _class_source(cls: type) -> str:
    """The source of ``cls`` and every RLlib class above it (attributes are set in any of them)."""
    sources = []
    for base in cls.__mro__:
        if base.__module__.startswith("ray."):
            try:
                sources.append(inspect.getsource(base))
            except (OSError, TypeError):
                continue
    return "\n".join(sources)


def missing_attributes() -> list[str]:
    """The private attributes of :data:`PRIVATE_ATTRIBUTES` their classes' source no longer sets
    (reading the sources is slow: the fence test runs it, not every start)."""
    missing = []
    for (module, name), attributes in PRIVATE_ATTRIBUTES.items():
        try:
            source = _class_source(_resolve(module, name))
        except (ImportError, AttributeError):
            missing.append(f"{module}.{name}")
            continue
        missing += [f"{name}.{a}" for a in attributes if f".{a}" not in source and f'"{a}"' not in source]
    return missing


@functools.cache
def adapter_problem() -> str | None:
    """The first private method or keyword that is not where RLlib 2.60 has it, or whose
    parameters changed (None: all are as they were)."""
    for (module, name), methods in PRIVATE_METHODS.items():
        try:
            cls = _resolve(module, name)
        except (ImportError, AttributeError):
            return f"{module}.{name} is gone"
        for method, expected in methods.items():
            found = getattr(cls, method, None)
            if found is None:
                return f"{name}.{method} is gone"
            # Ray adds a _ray_trace_ctx parameter to the methods of a class it made an actor of.
            taken = tuple(p for p in inspect.signature(found).parameters if p != "_ray_trace_ctx")
            if expected and taken != expected:
                return f"{name}.{method} takes {taken} now"
    for (module, name), inherited in NOT_OVERRIDDEN.items():
        try:
            cls = _resolve(module, name)
        except (ImportError, AttributeError):
            return f"{module}.{name} is gone"
        for method in inherited:
            if method in vars(cls):
                return f"{name} has its own {method} now"
    for (module, qualname), keywords in PRIVATE_KEYWORDS.items():
        try:
            accepted = inspect.signature(_resolve(module, qualname)).parameters
        except (ImportError, AttributeError):
            return f"{module}.{qualname} is gone"
        missing = [keyword for keyword in keywords if keyword not in accepted]
        if missing:
            return f"{qualname} takes no {missing[0]}"
    return None


# ---------------------------------------------------------------------------------------------
class ResetSeed:
    """The seed an env runner resets its envs with at its next initial reset, which RLlib 2.60's
    runners (single- and multi-agent alike) keep privately."""

    _seed: int | None
    _needs_initial_reset: bool

    @property
    def seed_of_next_reset(self) -> int | None:
        """The seed RLlib resets the envs with after ``needs_initial_reset`` (None: their own RNGs)."""
        return self._seed

    @seed_of_next_reset.setter
    def seed_of_next_reset(self, seed: int | None) -> None:
        self._seed = seed

    @property
    def needs_initial_reset(self) -> bool:
        return bool(self._needs_initial_reset)

    @needs_initial_reset.setter
    def needs_initial_reset(self, value: bool) -> None:
        self._needs_initial_reset = value


class MultiAgentRunnerInternals(ResetSeed, MultiAgentEnvRunner):
    """RLlib's multi-agent runner with its reset seed under public names."""


# Env runners: RLlib 2.60's SingleAgentEnvRunner, its episodes and lookback buffers.


class EnvRunnerInternals(ResetSeed, SingleAgentEnvRunner):
    """RLlib's runner with the private names rl_app's runners use under public ones. The hooks
    RLlib calls (``_sample``, ``_try_env_step``, ``_try_env_reset``) forward to
    :meth:`sample_steps`, :meth:`try_env_step` and :meth:`try_env_reset`, which subclasses override
    and which, not overridden, are RLlib's."""

    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        return self.sample_steps(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )

    def sample_steps(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        """RLlib's sampling of ``sample()``: timesteps (episode chunks) or whole episodes."""
        return super()._sample(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )

    def _try_env_step(self, actions: Any) -> Any:
        return self.try_env_step(actions)

    def try_env_step(self, actions: Any) -> Any:
        """RLlib's env step (ENV_STEP_FAILURE, or an error, when the vector env raised)."""
        return super()._try_env_step(actions)

    def _try_env_reset(self, *, seed: Any = None, options: Any = None) -> Any:
        return self.try_env_reset(seed=seed, options=options)

    def try_env_reset(self, *, seed: Any = None, options: Any = None) -> Any:
        return super()._try_env_reset(seed=seed, options=options)

    @property
    def ongoing_episodes(self) -> list[Any]:
        return self._ongoing_episodes

    @ongoing_episodes.setter
    def ongoing_episodes(self, episodes: list[Any]) -> None:
        self._ongoing_episodes = episodes

    @property
    def weights_seq_no(self) -> int:
        return self._weights_seq_no

    @weights_seq_no.setter
    def weights_seq_no(self, value: int) -> None:
        self._weights_seq_no = value

    @property
    def time_after_sampling(self) -> float | None:
        return self._time_after_sampling

    @time_after_sampling.setter
    def time_after_sampling(self, value: float) -> None:
        cast(Any, self)._time_after_sampling = value  # RLlib declares it None-typed

    def forget_cached_connector_output(self) -> None:
        """RLlib's timestep sampling keeps the env-to-module output of its last step; another
        sampler's steps make it stale."""
        self._cached_to_module = None

    def keep_done_for_metrics(self, episodes: list[Any]) -> None:
        """Hand the episodes that ended to ``get_metrics()``, as RLlib's ``_sample`` does."""
        self._done_episodes_for_metrics.extend(episodes)

    def keep_chunk_for_metrics(self, episode: Any) -> None:
        """Hand this call's chunk of a running episode to ``get_metrics()`` (summed, under its id,
        with the episode's other chunks when it ends), as RLlib's ``_sample`` does."""
        self._ongoing_episodes_for_metrics[episode.id_].append(episode)

    def has_state_server(self) -> bool:
        return self._env_runner_state_server is not None

    def observation_filter(self) -> Any:
        """The env-to-module pipeline's MeanStdFilter connector as :class:`FilterEachObservation`
        (None without one)."""
        for connector in cast(Any, self._env_to_module).connectors:
            if isinstance(connector, MeanStdFilter):
                return FilterEachObservation(connector, cast(Any, self._env_to_module).observation_space)
        return None

    def connector_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The class names of the env-to-module and module-to-env connector pipelines."""
        return (
            tuple(type(c).__name__ for c in cast(Any, self._env_to_module).connectors),
            tuple(type(c).__name__ for c in cast(Any, self._module_to_env).connectors),
        )

    def reset_envs_and_episodes(self, explore: bool) -> None:
        """RLlib's reset of every env (seeded after ``needs_initial_reset``; episode callbacks)."""
        self._reset_envs_and_episodes(explore=explore)

    def log_sampled(self, num_steps: int, num_episodes_completed: int) -> None:
        """What RLlib's ``_sample`` logs of a call: its Prometheus counter and step/episode counts."""
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=num_steps)
        self._increase_sampled_metrics(num_steps, num_episodes_completed)

    def log_episode_metrics(self, length: int, episode_return: Any, seconds: float) -> None:
        self._log_episode_metrics(length, episode_return, seconds)


def forward_exploration(module: Any, batch: dict[str, Any], t: int) -> dict[str, Any]:
    """What ``module.forward_exploration`` computes, without its switch to eval mode and back."""
    return module._forward_exploration(batch, t=t)


def forward_inference(module: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """What ``module.forward_inference`` computes, without its switch to eval mode and back."""
    return module._forward_inference(batch)


def forward_train(module: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """What ``module.forward_train`` computes, without its switch to train mode."""
    return module._forward_train(batch)


class ForwardHooks:
    """Mixin for an RLlib module: ``before_forward(batch) -> (batch, context)`` and
    ``after_forward(outputs, context) -> outputs`` around every forward pass RLlib runs (inference,
    exploration and training, which RLlib's module-to-env path and learners call by their private
    names, rl_app's learner included)."""

    def before_forward(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return batch, None

    def after_forward(self, outputs: dict[str, Any], context: Any) -> dict[str, Any]:
        return outputs

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        inner, context = self.before_forward(batch)
        return self.after_forward(super()._forward(inner, **kwargs), context)  # type: ignore[misc]

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        inner, context = self.before_forward(batch)
        return self.after_forward(super()._forward_train(inner, **kwargs), context)  # type: ignore[misc]


def episode_start_time(episode: Any) -> float | None:
    return episode._start_time


def mark_episode_steps(
    episode: Any, last_step_time: float, last_observation: Any = None, last_infos: Any = None
) -> None:
    """Leave ``episode``'s bookkeeping as ``add_env_reset``/``add_env_step`` would: the last step's
    time (and the start's, for a first step), observation and infos."""
    if last_infos is not None:
        episode._last_added_observation, episode._last_added_infos = last_observation, last_infos
    episode._last_step_time = last_step_time
    if episode._start_time is None:
        episode._start_time = last_step_time


def mark_episode_reset(episode: Any, reset_time: float, last_step_time: float | None = None) -> None:
    """The start (and last step) time RLlib's runner stamps on an episode."""
    episode._start_time = reset_time
    if last_step_time is not None:
        episode._last_step_time = last_step_time


class FilterEachObservation:
    """RLlib's MeanStdFilter connector applied to a vector step's observations as the connector
    applies it to each episode's newest one: its own filter object, one observation at a time in env
    order (the running statistics take them in that order), updating its statistics unless the
    connector says not to. The statistics stay the connector's: RLlib merges them over the runners
    and keeps them in checkpoints as before."""

    def __init__(self, connector: MeanStdFilter, observation_space: Any) -> None:
        self._connector = connector
        self.observation_space = observation_space  # what the connector sets on each episode

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        connector = cast(Any, self._connector)
        if connector._filters is None:
            connector._init_new_filters()
        normalize, update = connector._filters[None], connector._update_stats
        return np.stack([normalize(observation, update=update) for observation in observations])


class EpisodeFactory:
    """Makes the episodes of arrays that RLlib's ``SingleAgentEpisode(..., len_lookback_buffer=0)``
    makes, with the same attributes, without the constructor's per-episode work: each of its
    buffers derives its space's structure again, and it checks lengths these arrays have by
    construction (half of a wide runner's sampling time). Where RLlib's classes have other
    attributes than the ones this knows (another Ray), the constructor makes them.
    tests/test_sampling.py compares every attribute with the constructor's."""

    # RLlib 2.60's episode slots (OWN: a new object for each episode; SHARED: the template's value)
    # and buffer attributes.
    OWN = ("id_", "observations", "infos", "actions", "rewards", "extra_model_outputs", "_custom_data")
    SHARED = (
        "agent_id", "is_terminated", "is_truncated", "module_id", "multi_agent_episode_id", "t", "t_started",
        "_action_space", "_last_added_observation", "_last_added_infos", "_last_step_time",
        "_observation_space", "_start_time",
    )  # fmt: skip
    BUFFER = ("data", "lookback", "finalized", "_space", "_space_struct")

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        self._spaces: dict[str, Any] = {"observation_space": observation_space, "action_space": action_space}
        template = SingleAgentEpisode(**self._spaces)
        self.fits = sorted(SingleAgentEpisode.__slots__) == sorted(self.OWN + self.SHARED) and sorted(
            vars(template.observations)
        ) == sorted(self.BUFFER)
        self._shared = [(name, getattr(template, name)) for name in self.SHARED] if self.fits else []
        self._observations = _buffer_fields(template.observations)
        self._actions = _buffer_fields(template.actions)
        self._rewards = _buffer_fields(template.rewards)
        self._infos = _buffer_fields(template.infos)
        self._plain = _buffer_fields(InfiniteLookbackBuffer())

    def empty(self) -> Any:
        """A new episode with nothing added yet (RLlib's constructor: its buffers are lists)."""
        return SingleAgentEpisode(**self._spaces)

    def make(
        self,
        observations: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        infos: list[dict[str, Any]],
        extra_model_outputs: dict[str, np.ndarray],
        terminated: bool,
        truncated: bool,
    ) -> Any:
        """An episode of ``len(rewards)`` steps; the arrays become its buffers' data (not copied)."""
        if not self.fits:
            columns: dict[str, Any] = {"observations": observations, "actions": actions, "rewards": rewards}
            return SingleAgentEpisode(
                **columns,
                **self._spaces,
                infos=infos,
                extra_model_outputs=extra_model_outputs,
                terminated=terminated,
                truncated=truncated,
                len_lookback_buffer=0,
            )
        episode = object.__new__(SingleAgentEpisode)
        for name, value in self._shared:
            setattr(episode, name, value)
        episode.id_ = uuid.uuid4().hex
        episode.observations = _buffer(self._observations, observations)
        episode.infos = _buffer(self._infos, infos)
        episode.actions = _buffer(self._actions, actions)
        episode.rewards = _buffer(self._rewards, rewards)
        episode.extra_model_outputs = {
            key: _buffer(self._plain, value) for key, value in extra_model_outputs.items()
        }
        episode._custom_data = {}
        episode.is_terminated, episode.is_truncated = terminated, truncated
        episode.t = len(rewards)
        return episode


def _buffer_fields(empty: InfiniteLookbackBuffer) -> dict[str, Any]:
    """An empty buffer's attributes but its data (its space and that space's structure)."""
    return {key: value for key, value in vars(empty).items() if key not in ("data", "finalized")}


def _buffer(fields: dict[str, Any], data: Any) -> InfiniteLookbackBuffer:
    """``InfiniteLookbackBuffer(data, lookback=0, space)`` with the space's structure already derived."""
    buffer = object.__new__(InfiniteLookbackBuffer)
    buffer.__dict__ = {**fields, "data": data, "finalized": not isinstance(data, list)}
    return buffer


# ---------------------------------------------------------------------------------------------
# Learners: RLlib 2.60's Learner and TorchLearner, its minibatch iterator.


class LearnerInternals:
    """Mixed in before one of RLlib's torch learner classes: the private hooks RLlib calls forward
    to public methods that subclasses override (and that, not overridden, are RLlib's), and the
    learner's private state is read under public names."""

    _params: dict[Any, Any]
    _module_optimizers: dict[str, list[str]]
    _grad_scalers: Any
    _lr_scheduler_classes: Any
    _device: Any
    _weights_seq_no: int
    _optimizer_lr_schedules: dict[Any, Any]
    _named_optimizers: dict[str, Any]
    _optimizer_parameters: dict[Any, Any]
    _metrics_learner_inner_update: Any
    _metrics_all_modules_num_env_steps_trained: Any
    _metrics_all_modules_num_module_steps_trained: Any

    def _uncompiled_update(self, batch: dict[Any, Any], **kwargs: Any) -> Any:
        return self.update_step(batch, **kwargs)

    def update_step(self, batch: dict[Any, Any], **kwargs: Any) -> Any:
        """RLlib's gradient step on one minibatch: forward, losses, gradients, optimizer steps."""
        return super()._uncompiled_update(batch, **kwargs)  # type: ignore[misc]

    def _get_clip_function(self) -> Any:
        return self.clip_function()

    def clip_function(self) -> Any:
        """The function RLlib clips each optimizer's gradients with."""
        return super()._get_clip_function()  # type: ignore[misc]

    def _compute_off_policyness(self, batch: Any) -> None:
        self.compute_off_policyness(batch)

    def compute_off_policyness(self, batch: Any) -> None:
        super()._compute_off_policyness(batch)  # type: ignore[misc]

    def _create_iterator_if_necessary(self, **kwargs: Any) -> Any:
        return self.minibatch_iterator(**kwargs)

    def minibatch_iterator(self, **kwargs: Any) -> Any:
        """RLlib's iterator over an update's minibatches."""
        return super()._create_iterator_if_necessary(**kwargs)  # type: ignore[misc]

    def _log_metrics(self, batch: Any) -> None:
        self.log_minibatch_counters(batch)

    def log_minibatch_counters(self, batch: Any) -> None:
        """RLlib's Prometheus step counters for one minibatch."""
        super()._log_metrics(batch)  # type: ignore[misc]

    def _log_steps_trained_metrics(self, batch: Any) -> None:
        self.log_minibatch_steps(batch)

    def log_minibatch_steps(self, batch: Any) -> None:
        """RLlib's step counts of one minibatch, in the learner's metrics."""
        super()._log_steps_trained_metrics(batch)  # type: ignore[misc]

    def gradient_update(self, batch: dict[Any, Any]) -> Any:
        """RLlib's ``_update``: one gradient step, (fwd_out, losses, metrics)."""
        return cast(Any, self)._update(batch)

    @property
    def params_by_id(self) -> dict[Any, Any]:
        return self._params

    @property
    def optimizer_names_by_module(self) -> dict[str, list[str]]:
        return self._module_optimizers

    def uses_grad_scaler_or_torch_lr_scheduler(self) -> bool:
        """Mixed precision or a torch LR scheduler: RLlib's own path handles those."""
        return self._grad_scalers is not None or self._lr_scheduler_classes is not None

    def uses_grad_scaler(self) -> bool:
        return self._grad_scalers is not None

    def uses_lr_schedule(self) -> bool:
        """A learning-rate schedule of RLlib's or torch's."""
        scheduled = any(schedule.use_schedule for schedule in self._optimizer_lr_schedules.values())
        return scheduled or self._lr_scheduler_classes is not None

    @property
    def learner_device(self) -> Any:
        return self._device

    @property
    def learner_weights_seq_no(self) -> int:
        return self._weights_seq_no

    @learner_weights_seq_no.setter
    def learner_weights_seq_no(self, value: int) -> None:
        self._weights_seq_no = value

    def reset_scheduled_rates(self) -> None:
        """Each optimizer's rate set from its schedule, as ``after_gradient_based_update`` does."""
        for optimizer, schedule in self._optimizer_lr_schedules.items():
            TorchLearner._set_optimizer_lr(optimizer, lr=schedule.get_current_value())

    def optimizer_rate(self, optimizer_name: str) -> float:
        return float(TorchLearner._get_optimizer_lr(self._named_optimizers[optimizer_name]))

    @property
    def inner_update_timer(self) -> Any:
        """RLlib's Prometheus histogram around ``_update``."""
        return self._metrics_learner_inner_update

    def count_steps_trained(self, env_steps: int, module_steps: int) -> None:
        """RLlib's Prometheus counters of steps trained (positive increments only)."""
        self._metrics_all_modules_num_env_steps_trained.inc(value=env_steps)
        self._metrics_all_modules_num_module_steps_trained.inc(value=module_steps)

    def zero_all_gradients(self) -> None:
        for optimizer in self._optimizer_parameters:
            optimizer.zero_grad(set_to_none=True)

    def forget_per_optimizer_losses(self) -> None:
        """SAC's learner keeps each optimizer's loss for its per-optimizer backwards."""
        cast(Any, self)._temp_losses.clear()


def squared_critic_losses(
    learner: Any, module_id: str, config: Any, batch: Any, fwd_out: Any
) -> torch.Tensor:
    """The total loss of RLlib's SAC for continuous actions, after its ``compute_loss_for_module``,
    with each critic's Huber loss (delta 1) replaced by half its squared TD error, the SAC paper's,
    SB3's and CleanRL's: RLlib's Bellman target (copied from ``_compute_loss_for_module_continuous``),
    its importance weights, and the per-optimizer losses and metrics under RLlib's keys."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.learner import POLICY_LOSS_KEY

    losses = learner._temp_losses
    alpha = torch.exp(learner.curr_log_alpha[module_id])
    q_target_next = fwd_out["q_target_next"] - alpha.detach() * fwd_out["logp_next_resampled"]
    q_next_masked = (1.0 - batch[Columns.TERMINATEDS].float()) * q_target_next
    target = (batch[Columns.REWARDS] + (config.gamma ** batch["n_step"]) * q_next_masked).detach()
    critics = [(QF_PREDS, QF_LOSS_KEY)] + ([(QF_TWIN_PREDS, QF_TWIN_LOSS_KEY)] if config.twin_q else [])
    for predictions, key in critics:
        loss = torch.mean(batch["weights"] * 0.5 * torch.square(fwd_out[predictions] - target))
        losses[(module_id, key)] = loss
        learner.metrics.log_value(key=(module_id, key), value=loss, window=1)
    # RLlib's sum, in its order.
    total = losses[(module_id, POLICY_LOSS_KEY)] + losses[(module_id, QF_LOSS_KEY)]
    total = total + losses[(module_id, "alpha_loss")]
    return total + losses[(module_id, QF_TWIN_LOSS_KEY)] if config.twin_q else total


def after_gradient_based_update_below_dqn(learner: Any, timesteps: dict[str, Any]) -> None:
    """``TorchLearner.after_gradient_based_update``: what DQN's learner does after an update, less
    its target-network update (rl_app's learners average the targets themselves).
    :func:`adapter_problem` checks no class between them and DQN's learner adds to it."""
    TorchLearner.after_gradient_based_update(learner, timesteps=timesteps)


def cyclic_iterator_settings(cyclic: Any) -> dict[str, Any] | None:
    """What RLlib's ``MiniBatchCyclicIterator`` keeps of its arguments (None: another layout)."""
    names = ("_batch", "_minibatch_size", "_num_epochs", "_shuffle_batch_per_epoch", "_num_total_minibatches")
    if not all(hasattr(cyclic, name) for name in names):
        return None
    return {name.lstrip("_"): getattr(cyclic, name) for name in names}


def has_sequence_slices(sample_batch: Any) -> bool:
    return bool(sample_batch._slice_seq_lens_in_B)


def weights_seq_no_of(learner_or_runner: Any) -> int:
    """The weights' sequence number a learner or env runner keeps (RLlib's ``_weights_seq_no``)."""
    return int(learner_or_runner._weights_seq_no)


def set_weights_seq_no(runner: Any, value: int) -> None:
    """What RLlib's ``set_state`` does with the sequence number of the weights it loads."""
    runner._weights_seq_no = value


# ---------------------------------------------------------------------------------------------
# Training steps and replay: RLlib 2.60's private keywords and buffer state.


# The key of the largest priority in the state of RLlib's PrioritizedEpisodeReplayBuffer.
RLLIB_BUFFER_MAX_PRIORITY = "_max_priority"


def round_weights(config: Any) -> tuple[int, int]:
    """RLlib 2.60's DQN and SAC round from their config (``calculate_rr_weights``, set by
    ``training_intensity``): how many sampling calls, then how many updates."""
    store_weight, train_weight = calculate_rr_weights(config)
    return int(store_weight), int(train_weight)


def sample_from_runners(env_runner_group: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    """``synchronous_parallel_sample`` as RLlib's own training steps call it on the new API stack:
    (episodes, the runners' metrics)."""
    return cast(
        tuple[list[Any], list[Any]],
        synchronous_parallel_sample(
            worker_set=env_runner_group, _uses_new_env_runners=True, _return_metrics=True, **kwargs
        ),
    )


def update_without_reducing_metrics(learner: Any, **kwargs: Any) -> Any:
    """``Learner.update`` leaving its metrics unreduced, for a caller that reduces once at the end."""
    return learner.update(_no_metrics_reduce=True, **kwargs)


# ---------------------------------------------------------------------------------------------
# Models: RLlib 2.60's SAC module and catalog, its MLP encoder, catalogs' encoder config, its free
# log-std head.


class SACModuleInternals(DefaultSACTorchRLModule):
    """RLlib's SAC module whose continuous-action training pass RLlib calls through
    :meth:`train_pass_continuous` (not overridden: RLlib's)."""

    def _forward_train_continuous(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self.train_pass_continuous(batch)

    def train_pass_continuous(self, batch: dict[str, Any]) -> dict[str, Any]:
        return super()._forward_train_continuous(batch)


class SACCatalogInternals(SACCatalog):
    """RLlib's SAC catalog whose continuous critic encoder comes from :meth:`build_critic_encoder`."""

    def _build_qf_encoder_continuous(self, framework: str) -> Any:
        return self.build_critic_encoder(framework)

    def build_critic_encoder(self, framework: str) -> Any:
        return super()._build_qf_encoder_continuous(framework)


class MLPEncoderInternals(TorchMLPEncoder):
    """RLlib's torch MLP encoder whose forward pass is :meth:`encode`."""

    def _forward(self, inputs: dict, **kwargs: Any) -> dict:  # type: ignore[override]
        return self.encode(inputs, **kwargs)

    def encode(self, inputs: dict, **kwargs: Any) -> dict:
        return super()._forward(inputs, **kwargs)


def inner_net(part: Any) -> Any:
    """The network an RLlib torch encoder's or head's forward pass calls (its ``net``)."""
    return part.net


def set_inner_net(part: Any, net: torch.nn.Module) -> None:
    part.net = net


def clips_log_std(head: Any) -> bool:
    """Whether an RLlib head clips the log std it outputs (only the log-std heads have the flag)."""
    return bool(getattr(head, "clip_log_std", False))


def encoder_config_of(catalog: Any) -> Any:
    """The encoder config a catalog builds its encoder(s) from (RLlib's ``_encoder_config``)."""
    return catalog._encoder_config


class BatchFreeLogStdHead(torch.nn.Module):
    """RLlib's free log-std head (``model.free_log_std``) with the log-std broadcast to the batch by
    ``expand``. RLlib's head repeats it ``len(mean)`` times, which tracing records as the example
    batch's size: an exported file would then take batches of that size only."""

    def __init__(self, head: TorchFreeLogStdMLPHead) -> None:
        super().__init__()
        self.head = head

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        head = self.head
        mean, log_std = head.net(inputs), head.log_std
        if head.clip_log_std:
            bound = head.log_std_clip_param_const
            log_std = torch.clamp(log_std, -bound, bound)
        return torch.cat([mean, log_std.unsqueeze(0).expand(mean.shape[0], -1)], dim=1)
