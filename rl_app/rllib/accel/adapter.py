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
from typing import Any

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
}  # fmt: skip

# (module, class): private attributes its instances carry, as the class's source assigns them.
PRIVATE_ATTRIBUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner"): (
        "_env_to_module", "_module_to_env", "_time_after_sampling", "_weights_seq_no",
        "_env_runner_state_server", "_ongoing_episodes", "_needs_initial_reset", "_cached_to_module",
        "_done_episodes_for_metrics", "_ongoing_episodes_for_metrics",
    ),
    ("ray.rllib.env.env_runner", "EnvRunner"): ("_seed", "_metrics_num_env_steps_sampled"),
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
    ("ray.rllib.utils.minibatch_utils", "MiniBatchCyclicIterator"): (
        "_batch", "_minibatch_size", "_num_epochs", "_shuffle_batch_per_epoch", "_num_total_minibatches",
    ),
    ("ray.rllib.env.single_agent_episode", "SingleAgentEpisode"): (
        "_start_time", "_last_step_time", "_last_added_observation", "_last_added_infos", "_custom_data",
        "_action_space", "_observation_space",
    ),
    ("ray.rllib.env.utils.infinite_lookback_buffer", "InfiniteLookbackBuffer"): ("_space", "_space_struct"),
}  # fmt: skip

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
    (reading the source takes ~0.3 s: the fence test runs it, not every start)."""
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
        for method, parameters in methods.items():
            found = getattr(cls, method, None)
            if found is None:
                return f"{name}.{method} is gone"
            if parameters and tuple(inspect.signature(found).parameters) != parameters:
                return f"{name}.{method} takes {tuple(inspect.signature(found).parameters)} now"
    for (module, qualname), keywords in PRIVATE_KEYWORDS.items():
        try:
            accepted = inspect.signature(_resolve(module, qualname)).parameters
        except (ImportError, AttributeError):
            return f"{module}.{qualname} is gone"
        missing = [keyword for keyword in keywords if keyword not in accepted]
        if missing:
            return f"{qualname} takes no {missing[0]}"
    return None
