"""Build, save, restore and warm-start an RLlib ``Algorithm`` through RLlib's public component names."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)

from rl_app.cluster.resources import ResourcePlan
from rl_app.config import ExperimentConfig
from rl_app.errors import error_detail, first_line
from rl_app.library_logs import native_lines_to_log
from rl_app.rllib.config import algorithm_config
from rl_app.rllib.env_runner import RLAppEnvRunner
from rl_app.rllib.replay import restore_replay_buffer, save_replay_buffer, seed_replay_buffer
from rl_app.runs.checkpoints import CheckpointError

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.rl_module.torch import TorchRLModule

# Where the trained policy lives inside an Algorithm's state and checkpoint folder.
MODULE_PATH = (COMPONENT_LEARNER_GROUP, COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID)


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    """``config.build_algo()``, with the replay buffer's sampling seeded too (see ``replay``)."""
    with native_lines_to_log():  # Ray's C++ line about each remote runner's config reference
        algo = config.build_algo()
    seed_replay_buffer(algo, config.seed)
    return algo


def build_experiment(experiment: ExperimentConfig, plan: ResourcePlan, source: str) -> Algorithm:
    """The RLlib ``Algorithm`` of ``experiment`` on the resources of ``plan``."""
    return build_algorithm(algorithm_config(experiment, plan, source))


def save_algorithm(algo: Algorithm, folder: Path, replay_buffer: bool) -> None:
    """RLlib's checkpoint of ``algo`` in ``folder``, plus its replay buffer when asked and present."""
    algo.save_to_path(str(folder.resolve()))
    if replay_buffer:
        save_replay_buffer(algo, folder)


def restore_algorithm(algo: Algorithm, checkpoint: Path) -> None:
    """Restore everything RLlib saved, and the replay buffer when there is one."""
    try:
        if algo.env_runner_group is None:
            # Offline algorithms have no training runners, to which RLlib 2.60's restore syncs the
            # weights anyway (an AttributeError): its components restored as Checkpointable does,
            # then the weights sent to the evaluation runners, the one place they are used.
            from ray.rllib.utils.checkpoints import Checkpointable

            Checkpointable.restore_from_path(algo, str(checkpoint.resolve()))
            if algo.eval_env_runner_group is not None:
                algo.eval_env_runner_group.sync_weights(
                    from_worker_or_learner_group=algo.learner_group, inference_only=True
                )
        else:
            algo.restore_from_path(str(checkpoint.resolve()))
    except Exception as exc:  # RLlib raises many kinds for damaged files
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is corrupt or truncated: {type(exc).__name__}: {error_detail(exc)}"
        ) from None
    restore_replay_buffer(algo, checkpoint)


def reseed_env_runners(algo: Algorithm, seed: int | None) -> None:
    """Re-seed every training and evaluation env runner as if the algorithm were built with ``seed``."""
    for group in (algo.env_runner_group, algo.eval_env_runner_group):
        if group is not None:
            group.foreach_env_runner(
                lambda runner: cast(RLAppEnvRunner, runner).reseed(seed), local_env_runner=True
            )


def load_module(checkpoint: Path, policy: str = DEFAULT_MODULE_ID) -> TorchRLModule:
    """The trained RLModule of ``checkpoint`` (``policy``: one of several agents' policies), read from
    disk once, on this process."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    path = (*MODULE_PATH[:-1], policy)
    module_dir = checkpoint.joinpath(*path)
    if not module_dir.is_dir():
        raise CheckpointError(f"checkpoint '{checkpoint}' has no policy module ({'/'.join(path)})")
    try:
        return cast("TorchRLModule", RLModule.from_checkpoint(str(module_dir.resolve())))
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is corrupt or truncated: {type(exc).__name__}: {error_detail(exc)}"
        ) from None


def warm_start(algo: Algorithm, checkpoint: Path) -> None:
    """Load the policy weights of ``checkpoint`` into ``algo`` (optimizer and counters start fresh).

    The module is read from disk once, here on the driver. RLlib's ``set_state``
    puts the weights into Ray's object store once and every remote env runner
    fetches them from there.
    """
    state: dict[str, Any] = load_module(checkpoint).get_state()
    for component in reversed(MODULE_PATH):
        state = {component: state}
    try:
        algo.set_state(state)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"cannot load '{checkpoint}' into this experiment's model (different model config?): "
            f"{first_line(exc)}"
        ) from None


def load_mean_std_filter(checkpoint: Path) -> tuple[Any, Any, float | None] | None:
    """(mean, std or None, clip) of the MeanStdFilter connector the checkpoint's env runner
    normalised observations with (RLlib writes each connector piece as a component folder of its
    pipeline's); None without one."""
    import pickle

    import numpy as np
    from ray.rllib.utils.filter import RunningStat

    state_file = checkpoint / "env_runner" / "env_to_module_connector" / "MeanStdFilter" / "state.pkl"
    if not state_file.is_file():
        return None
    with state_file.open("rb") as handle:
        agents = pickle.load(handle)
    if not agents:
        return None
    (agent_state,) = agents.values()
    (stats,) = [RunningStat.from_state(s) for s in agent_state["running_stats"]]
    mean = stats.mean if agent_state["de_mean_to_zero"] else np.zeros(stats.shape)
    std = stats.std if agent_state["de_std_to_one"] else None
    return mean, std, agent_state["clip_by_value"]
