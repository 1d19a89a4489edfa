"""Learner throughput: train-batch samples/s through RLlib's learner update, CPU vs GPU.

    python bench/learner.py [--updates N] [--experiments ppo_cartpole sac_pendulum ppo_pong]

For PPO (ppo_cartpole; ppo_pong, the CNN, when named: one update = num_epochs passes over the
train batch, GAE included) and SAC (sac_pendulum: one update = one replay-sampled train batch), the
update is timed alone: sampling and replay sampling happen between timings. On a
machine with CUDA the same updates run on the GPU too and the GPU/CPU ratio is
printed; without one the GPU column says so. Samples/s are medians over the updates with bootstrap
95 % intervals. Writes bench/results/learner-<date>-<time>.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import date, datetime
from pathlib import Path
from typing import Any

from common import build_experiment_algo, write_results
from stats import interval_text, median_interval

from rl_app.cluster.session import shutdown_ray

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
os.environ.setdefault("RL_APP_EXPERIMENTS_DIR", str(REPO / "experiments"))


def _build(experiment: str, device: str) -> Any:
    import torch

    overrides = ["env_runners.num_env_runners=0", "evaluation.interval=0", f"learners.device={device}"]
    return build_experiment_algo(experiment, overrides, os.cpu_count() or 1, torch.cuda.device_count())


def _timesteps(algo: Any) -> dict[str, int]:
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    return {
        NUM_ENV_STEPS_SAMPLED_LIFETIME: int(
            algo.metrics.peek(("env_runners", NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        )
    }


def ppo_update_seconds(algo: Any, updates: int) -> tuple[int, list[float]]:
    config = algo.config
    batch = config.train_batch_size_per_learner
    seconds = []
    for _ in range(updates + 1):  # the first is a warm-up
        episodes = algo.env_runner.sample(num_timesteps=batch)
        began = time.perf_counter()
        algo.learner_group.update(
            episodes=episodes,
            timesteps=_timesteps(algo),
            num_epochs=config.num_epochs,
            minibatch_size=config.minibatch_size,
        )
        seconds.append(time.perf_counter() - began)
    return batch, seconds[1:]


def sac_update_seconds(algo: Any, updates: int) -> tuple[int, list[float]]:
    config = algo.config
    while (
        algo.local_replay_buffer.get_num_timesteps() < config.num_steps_sampled_before_learning_starts + 512
    ):
        algo.train()
    seconds = []
    for _ in range(updates + 1):
        update = _replay_update(algo)
        began = time.perf_counter()
        update()
        seconds.append(time.perf_counter() - began)
    return config.total_train_batch_size, seconds[1:]


def _replay_update(algo: Any) -> Any:
    """One replay batch drawn now, and the learner update on it to be timed: our array buffer's
    columns, or RLlib's episodes where the experiment replays through RLlib's buffer."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    config, buffer = algo.config, algo.local_replay_buffer
    size, beta = config.total_train_batch_size, config.replay_buffer_config.get("beta") or 0.0
    if hasattr(buffer, "sample_batch"):
        columns = buffer.sample_batch(size, n_step=config.n_step, gamma=config.gamma, beta=beta)
        batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=size)
        return lambda: algo.learner_group.update(batch=batch, timesteps=_timesteps(algo))
    episodes = buffer.sample(
        num_items=size, n_step=config.n_step, gamma=config.gamma, beta=beta, sample_episodes=True
    )
    return lambda: algo.learner_group.update(episodes=episodes, timesteps=_timesteps(algo))


CASES = {
    "ppo_cartpole": ppo_update_seconds,
    "sac_pendulum": sac_update_seconds,
    "ppo_pong": ppo_update_seconds,  # the CNN: 4,000 frames x 10 epochs per update, slow on a CPU
    "ppo_breakout": ppo_update_seconds,  # the same CNN: 1,024 frames x 4 epochs
}
DEFAULT_CASES = ["ppo_cartpole", "sac_pendulum"]


def measure(experiment: str, device: str, updates: int) -> dict[str, Any]:
    algo = _build(experiment, device)
    try:
        batch, seconds = CASES[experiment](algo, updates)
    finally:
        algo.stop()
    rates = median_interval([batch / each for each in seconds])
    return {
        "batch": batch,
        "updates": len(seconds),
        "median_update_s": statistics.median(seconds),
        "samples_per_s": rates["median"],
        "samples_per_s_interval": rates,
    }


def markdown(results: dict[str, Any], experiments: list[str]) -> str:
    gpu = results["gpu"]
    lines = [
        f"# Learner throughput, {results['date']} (torch {results['torch']}, GPU: {gpu or 'none visible'})",
        "",
        "Train-batch samples/s through one learner update, medians over the updates with bootstrap 95 % "
        "intervals.",
        "",
        "| experiment | batch | updates | CPU samples/s | GPU samples/s | GPU / CPU |",
        "|---|---|---|---|---|---|",
    ]
    for experiment in experiments:
        row = results[experiment]
        cpu = row["cpu"]
        gpu_cell = interval_text(row["gpu"]["samples_per_s_interval"], 0) if gpu else "-"
        ratio = f"{row['gpu_vs_cpu']:.2f}x" if gpu else "-"
        lines.append(
            f"| {experiment} | {cpu['batch']} | {cpu['updates']} | "
            f"{interval_text(cpu['samples_per_s_interval'], 0)} | {gpu_cell} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--experiments", nargs="+", default=DEFAULT_CASES, choices=sorted(CASES))
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    import torch

    gpu = torch.cuda.is_available()
    results: dict[str, Any] = {
        "date": date.today().isoformat(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
    }
    ray.init(
        num_cpus=os.cpu_count(),
        num_gpus=torch.cuda.device_count(),
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        for experiment in args.experiments:
            row = results[experiment] = {"cpu": measure(experiment, "cpu", args.updates)}
            if gpu:
                row["gpu"] = measure(experiment, "gpu", args.updates)
                row["gpu_vs_cpu"] = row["gpu"]["samples_per_s"] / row["cpu"]["samples_per_s"]
    finally:
        shutdown_ray(local=True)
    stamp = f"{datetime.now():%Y-%m-%d-%H%M}"
    write_results(f"learner-{stamp}", results, markdown(results, args.experiments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
