"""Learner throughput: train-batch samples/s through RLlib's learner update, CPU vs GPU.

    python bench/learner.py [--updates N] [--experiments ppo_cartpole sac_pendulum ppo_pong]

For PPO (ppo_cartpole; ppo_pong, the CNN, when named: one update = num_epochs passes over the
train batch, GAE included) and SAC (sac_pendulum: one update = one replay-sampled train batch), the
update is timed alone: sampling and replay sampling happen between timings. On a
machine with CUDA the same updates run on the GPU too and the GPU/CPU ratio is
printed; without one the GPU column says so. Writes bench/results/learner-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from common import build_experiment_algo

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


def measure(experiment: str, device: str, updates: int) -> dict[str, float]:
    algo = _build(experiment, device)
    try:
        batch, seconds = CASES[experiment](algo, updates)
    finally:
        algo.stop()
    median = statistics.median(seconds)
    return {"batch": batch, "median_update_s": median, "samples_per_s": batch / median}


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
    print(f"learner throughput (torch {results['torch']}, GPU: {results['gpu'] or 'none visible'})")
    print(f"{'experiment':14s} {'batch':>6s} {'CPU samples/s':>14s} {'GPU samples/s':>14s} {'GPU/CPU':>8s}")
    for experiment in args.experiments:
        row = results[experiment]
        gpu_cell = f"{row['gpu']['samples_per_s']:14,.0f}" if gpu else f"{'-':>14s}"
        ratio = f"{row['gpu_vs_cpu']:7.2f}x" if gpu else f"{'-':>8s}"
        print(
            f"{experiment:14s} {row['cpu']['batch']:6d} "
            f"{row['cpu']['samples_per_s']:14,.0f} {gpu_cell} {ratio}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"learner-{results['date']}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
