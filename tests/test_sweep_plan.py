"""How a sweep is planned, before Ray starts: trial counts, the per-trial resources rule, Tune objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_app.cluster.resources import plan_trial_resources
from rl_app.config import load_experiment
from rl_app.sweep.space import count_trials, tune_domain

BASE = """\
algorithm: PPO
env: CartPole-v1
stop: {{timesteps: 1000}}
{extra}
sweep:
  space:
    training.lr: {{loguniform: [1.0e-4, 1.0e-3]}}
    training.num_epochs: {{grid: [1, 2, 3]}}
{sweep}
"""


def experiment(folder: Path, sweep: str = "", extra: str = "") -> object:
    (folder / "s.yaml").write_text(BASE.format(sweep=sweep, extra=extra))
    return load_experiment("s").config


def test_trial_count_is_samples_times_grid_points(experiments: Path) -> None:
    assert count_trials(experiment(experiments).sweep) == 8 * 3  # default 8 samples
    assert count_trials(experiment(experiments, "  num_samples: 2").sweep) == 6
    only_grid = BASE.format(sweep="  search: grid", extra="").replace(
        "{loguniform: [1.0e-4, 1.0e-3]}", "{grid: [0.1]}"
    )
    (experiments / "g.yaml").write_text(only_grid)
    assert count_trials(load_experiment("g").config.sweep) == 3  # grid search: one pass


@pytest.mark.parametrize(
    ("cpus", "gpus", "extra", "sweep", "concurrent", "runners", "gpu_share"),
    [
        (2, 0, "", "", 2, 0, 0.0),  # this machine: two trials, each samples in its own process
        (16, 0, "", "  num_samples: 1", 3, 4, 0.0),  # 3 trials on 16 cores: 5 each, 4 of them env runners
        (16, 0, "", "  max_concurrent_trials: 4", 4, 3, 0.0),
        (8, 0, "env_runners: {num_env_runners: 2}", "", 2, 2, 0.0),  # fixed runners: 3 CPUs a trial
        (8, 1, "", "  max_concurrent_trials: 4", 4, 0, 0.25),  # one GPU shared by 4 trials
        (8, 1, "learners: {device: cpu}", "  max_concurrent_trials: 4", 4, 0, 0.0),
        (12, 0, "", "  max_concurrent_trials: 4", 4, 2, 0.0),
    ],
)
def test_resources_rule(
    experiments: Path,
    cpus: int,
    gpus: int,
    extra: str,
    sweep: str,
    concurrent: int,
    runners: int,
    gpu_share: float,
) -> None:
    config = experiment(experiments, sweep, extra)
    plan = plan_trial_resources(config, count_trials(config.sweep), cpus, gpus)
    assert plan.concurrent == concurrent
    assert plan.plan.num_env_runners == runners
    assert plan.plan.num_gpus_per_learner == pytest.approx(gpu_share)
    assert plan.concurrent * plan.cpus_per_trial <= cpus
    assert f"{concurrent} at a time" in plan.describe(count_trials(config.sweep))


def test_asking_for_more_concurrent_trials_than_fit_is_capped_and_said(experiments: Path) -> None:
    config = experiment(experiments, "  max_concurrent_trials: 5")
    plan = plan_trial_resources(config, 24, 2, 0)
    assert plan.concurrent == 2
    assert "max_concurrent_trials 5 capped to fit" in plan.describe(24)


def test_space_entries_become_tune_domains(experiments: Path) -> None:
    from ray.tune.search.sample import Categorical, Float, Integer

    (experiments / "d.yaml").write_text(
        BASE.format(extra="", sweep="")
        + "    training.clip_param: {quniform: [0.1, 0.3, 0.05]}\n"
        + "    training.minibatch_size: {randint: [32, 257]}\n"
        + "    training.entropy_coeff: {choice: [0.0, 0.01]}\n"
    )
    space = load_experiment("d").config.sweep.space
    lr = tune_domain(space["training.lr"])
    assert isinstance(lr, Float) and (lr.lower, lr.upper) == (1e-4, 1e-3)
    assert type(lr.get_sampler()).__name__ == "_LogUniform"
    assert tune_domain(space["training.num_epochs"]) == {"grid_search": [1, 2, 3]}
    clip = tune_domain(space["training.clip_param"])
    assert isinstance(clip, Float) and clip.get_sampler().q == 0.05
    batch = tune_domain(space["training.minibatch_size"])
    assert isinstance(batch, Integer) and (batch.lower, batch.upper) == (32, 257)
    assert isinstance(tune_domain(space["training.entropy_coeff"]), Categorical)
