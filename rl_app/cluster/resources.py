"""How many env runners and which learner device, from the cores and GPUs available; and how a
sweep's trials share them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rl_app.algorithms import algorithm_spec
from rl_app.config import ExperimentConfig
from rl_app.errors import UserError


@dataclass(frozen=True)
class ResourcePlan:
    num_cpus: int
    num_gpus: float  # a fraction when sweep trials share a GPU
    num_env_runners: int
    num_envs_per_env_runner: int
    num_learners: int
    num_gpus_per_learner: float
    # Threads each runner may step a threaded vector env in (ale-py's): its share of the cores.
    env_threads: int = 1

    @property
    def learner_device(self) -> str:
        return "gpu" if self.num_gpus_per_learner else "cpu"

    def describe(self) -> str:
        runners = f"{self.num_env_runners} env runner{'s' if self.num_env_runners != 1 else ''}"
        if self.num_env_runners == 0:
            runners = "sampling on the driver (0 env runners)"
        learners = f"learner on {self.learner_device.upper()}"
        if self.num_learners > 1:
            learners = f"{self.num_learners} learners on {self.learner_device.upper()} (torch DDP)"
        elif self.num_learners == 1:
            learners = f"1 remote learner on {self.learner_device.upper()}"
        return (
            f"{self.num_cpus} CPU{'s' if self.num_cpus != 1 else ''}, {self.num_gpus:g} GPU"
            f"{'s' if self.num_gpus != 1 else ''}: {runners} x {self.num_envs_per_env_runner} "
            f"envs, {learners}"
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


def evaluation_runners(experiment: ExperimentConfig) -> int:
    """Env runners the experiment keeps for evaluation alone (none when it never evaluates)."""
    evaluation = experiment.evaluation
    return evaluation.num_env_runners if evaluation.interval else 0


def plan_resources(experiment: ExperimentConfig, num_cpus: int, num_gpus: float) -> ResourcePlan:
    """Spread env runners over the cores, minus the ones reserved for driver and learner.

    'auto' never gives a synchronous algorithm (PPO, DQN, SAC) a single remote runner:
    with one, sampling and learning still take turns, so it samples on the driver.

    The learner takes a GPU when one is available unless ``learners.device`` says cpu
    (a fraction of one when ``num_gpus`` < 1: sweep trials sharing a GPU);
    ``device: gpu`` without a GPU is an error.
    """
    runners = experiment.env_runners
    eval_runners = evaluation_runners(experiment)
    if algorithm_spec(experiment.algorithm).offline:
        # It samples nothing: the cores go to Ray Data reading and batching the recorded data.
        num_env_runners = 0
    elif runners.num_env_runners == "auto":
        num_env_runners = max(0, num_cpus - runners.reserved_cpus - eval_runners)
        if num_env_runners == 1 and not algorithm_spec(experiment.algorithm).asynchronous_sampling:
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
    # A synchronous algorithm samples while its learner waits, so the runners share every core; an
    # asynchronous one learns meanwhile, on a core of its own.
    sampling_cpus = num_cpus - (1 if algorithm_spec(experiment.algorithm).asynchronous_sampling else 0)
    return ResourcePlan(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        num_env_runners=num_env_runners,
        num_envs_per_env_runner=runners.num_envs_per_env_runner,
        num_learners=num_learners,
        num_gpus_per_learner=min(1.0, num_gpus) if use_gpu else 0,
        env_threads=max(1, min(runners.num_envs_per_env_runner, sampling_cpus // max(1, num_env_runners))),
    )


@dataclass(frozen=True)
class TrialResources:
    """How a sweep shares the cluster: trials at a time, and each trial's own resource plan."""

    concurrent: int
    cpus_per_trial: int
    gpus_per_trial: float
    plan: ResourcePlan
    requested: int | None = None  # max_concurrent_trials when it asked for more than fits

    def describe(self, num_trials: int) -> str:
        capped = f" (max_concurrent_trials {self.requested} capped to fit)" if self.requested else ""
        return (
            f"{num_trials} trials, {self.concurrent} at a time{capped}; each trial gets "
            f"{self.plan.describe()}"
        )


def plan_trial_resources(
    experiment: ExperimentConfig, num_trials: int, num_cpus: int, num_gpus: int
) -> TrialResources:
    """Fit as many concurrent trials as the CPUs allow, then give each its share.

    The rule: a trial needs ``reserved_cpus`` (at least 1, for its learner and sampling
    in-process) plus its fixed env, evaluation and learner actors. Concurrency is
    ``min(max_concurrent_trials, trials, CPUs // that)``; with ``num_env_runners: auto``
    each trial then gets ``CPUs // concurrency`` cores and uses the spare ones as env
    runners. GPUs are split evenly (fractions of one) between concurrent trials.
    """
    runners, learners, sweep = experiment.env_runners, experiment.learners, experiment.sweep
    assert sweep is not None
    eval_runners = evaluation_runners(experiment)
    fixed = 0 if runners.num_env_runners == "auto" else runners.num_env_runners
    minimum = max(1, runners.reserved_cpus) + eval_runners + fixed + learners.num_learners
    if minimum > num_cpus:
        raise UserError(f"one trial needs {minimum} CPUs but the cluster has {num_cpus}")
    fits = num_cpus // minimum
    wanted = fits if sweep.max_concurrent_trials == "auto" else sweep.max_concurrent_trials
    concurrent = max(1, min(wanted, fits, num_trials))
    cpus = num_cpus // concurrent if runners.num_env_runners == "auto" else minimum
    use_gpu = learners.device != "cpu" and num_gpus > 0
    gpus = min(1.0, num_gpus / concurrent) if use_gpu else 0.0
    return TrialResources(
        concurrent=concurrent,
        cpus_per_trial=cpus,
        gpus_per_trial=gpus,
        plan=plan_resources(experiment, cpus, gpus),
        requested=wanted if wanted > fits and sweep.max_concurrent_trials != "auto" else None,
    )
