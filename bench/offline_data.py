"""The recordings the offline experiments learn from, made here rather than committed (make offline-data).

Each dataset is its behaviour policy trained with rl_app (a run under data/behaviour_runs/) and then
played with `rl_app record`; one that is already there is kept. The experiments name the folders:
bc_cartpole reads data/cartpole_expert, iql_pendulum data/pendulum_mixed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RL_APP = [sys.executable, "-m", "rl_app"]


@dataclass(frozen=True)
class Dataset:
    experiment: str  # trains the behaviour policy
    episodes: int
    epsilon: float  # share of random actions while recording
    overrides: list[str] = field(default_factory=list)


DATASETS = {
    # A solved ppo_cartpole (deterministic return 500), played as it is: expert data.
    "cartpole_expert": Dataset("ppo_cartpole", episodes=40, epsilon=0.0),
    # SAC stopped at 6,000 steps, part way up (returns around -700), and a random action 30 % of
    # the time: data of mixed quality, which an offline learner should improve on. The SAC settings
    # are those sac_pendulum had when bench/results/offline-2026-12-07-0235 was recorded: RL Zoo's,
    # shipped since, swing Pendulum up within 6,000 steps.
    "pendulum_mixed": Dataset(
        "sac_pendulum",
        episodes=100,
        epsilon=0.3,
        overrides=[
            "stop.timesteps=6000",
            "stop.return=null",
            "training.actor_lr=0.0002",
            "training.critic_lr=0.0008",
            "training.alpha_lr=0.0009",
            "training.initial_alpha=1.001",
            "training.n_step=[2,5]",
            "training.replay_buffer.capacity=100000",
            "training.replay_buffer.alpha=1.0",
            "training.replay_buffer.beta=0.0",
            "training.num_steps_sampled_before_learning_starts=256",
        ],
    ),
}


def make(name: str, data_dir: Path) -> Path:
    """Train the behaviour policy of dataset ``name`` and record it into ``data_dir/name``."""
    spec, out = DATASETS[name], data_dir / name
    if (out / "manifest.json").is_file():
        print(f"{out}: already recorded (delete it to record again)")
        return out
    runs = data_dir / "behaviour_runs"
    sets = [arg for override in spec.overrides for arg in ("--set", override)]
    subprocess.run([*RL_APP, "train", spec.experiment, *sets, "--runs-dir", str(runs)], check=True)
    run = sorted((runs / spec.experiment).iterdir())[-1]
    subprocess.run(
        [*RL_APP, "record", str(run), "--out", str(out), "--episodes", str(spec.episodes),
         "--epsilon", str(spec.epsilon), "--runs-dir", str(runs)],
        check=True,
    )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", choices=[*DATASETS, []], help="default: all")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    args = parser.parse_args()
    for name in args.names or DATASETS:
        make(name, args.data_dir)


if __name__ == "__main__":
    main()
