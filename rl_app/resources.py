"""How many env runners and which learner device, from the cores and GPUs available."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ResourcePlan:
    num_cpus: int
    num_gpus: float  # a fraction when sweep trials share a GPU
    num_env_runners: int
    num_envs_per_env_runner: int
    num_learners: int
    num_gpus_per_learner: float

    @property
    def learner_device(self) -> str:
        return "gpu" if self.num_gpus_per_learner else "cpu"

    def describe(self) -> str:
        runners = f"{self.num_env_runners} env runner{'s' if self.num_env_runners != 1 else ''}"
        if self.num_env_runners == 0:
            runners = "sampling on the driver (0 env runners)"
        return (
            f"{self.num_cpus} CPU{'s' if self.num_cpus != 1 else ''}, {self.num_gpus:g} GPU"
            f"{'s' if self.num_gpus != 1 else ''}: {runners} x {self.num_envs_per_env_runner} "
            f"envs, learner on {self.learner_device.upper()}"
        )


def local_cpu_count() -> int:
    """Cores this process may use (respects affinity masks and cgroup-pinned CPUs)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_gpu_count() -> int:
    """GPUs torch can see; 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_resources(experiment: Any, num_cpus: int, num_gpus: float) -> ResourcePlan:
    """Spread env runners over the cores, minus the ones reserved for driver and learner.

    'auto' never gives a synchronous algorithm (PPO, DQN, SAC) a single remote runner:
    with one, sampling and learning still take turns, so it samples on the driver.

    The learner takes a GPU when one is available unless ``learners.device`` says cpu
    (a fraction of one when ``num_gpus`` < 1: sweep trials sharing a GPU);
    ``device: gpu`` without a GPU is an error.
    """
    from rl_app.algorithms import ALGORITHMS
    from rl_app.errors import UserError

    runners = experiment.env_runners
    evaluation = experiment.evaluation
    eval_runners = evaluation.num_env_runners if evaluation.interval else 0
    if runners.num_env_runners == "auto":
        num_env_runners = max(0, num_cpus - runners.reserved_cpus - eval_runners)
        if num_env_runners == 1 and not ALGORITHMS[experiment.algorithm].asynchronous_sampling:
            # A synchronous algorithm waits for its one runner, then the runner waits for
            # the learner: same steps/s as sampling on the driver, plus an actor to start.
            num_env_runners = 0
    else:
        num_env_runners = runners.num_env_runners
    # Each remote actor holds one CPU; asking for more than exist makes Ray wait forever.
    needed = num_env_runners + eval_runners + experiment.learners.num_learners
    if needed > num_cpus:
        raise UserError(
            f"{num_env_runners} env runners + {eval_runners} evaluation runners + "
            f"{experiment.learners.num_learners} learners needs {needed} CPUs, but {num_cpus} are available "
            "(lower env_runners.num_env_runners or use 'auto')"
        )

    device = experiment.learners.device
    if device == "gpu" and num_gpus == 0:
        raise UserError("learners.device is 'gpu' but no GPU is visible (use 'auto' or 'cpu')")
    use_gpu = device == "gpu" or (device == "auto" and num_gpus > 0)
    num_learners = experiment.learners.num_learners
    if use_gpu and num_learners > num_gpus:
        raise UserError(f"learners.num_learners={num_learners} needs that many GPUs ({num_gpus} visible)")
    return ResourcePlan(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        num_env_runners=num_env_runners,
        num_envs_per_env_runner=runners.num_envs_per_env_runner,
        num_learners=num_learners,
        num_gpus_per_learner=min(1.0, num_gpus) if use_gpu else 0,
    )
