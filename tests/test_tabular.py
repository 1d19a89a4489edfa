"""The tabular Q-learning baseline: discretization, learning (CartPole's classic bar, FrozenLake
without bins), checkpoints and resume, and evaluate/export through the same commands as RLlib's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import replayed_returns

from rl_app.config import load_experiment
from rl_app.config.schema import QLearningTraining
from rl_app.runs.checkpoints import list_checkpoints, read_info
from rl_app.tabular.qlearning import Discretizer, epsilon_at, greedy_actions, load_q_table
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

FROZEN_LAKE = """\
algorithm: QLearning
env: {id: FrozenLake-v1, config: {is_slippery: false}}
training: {lr: 0.5, gamma: 0.95, epsilon: [[0, 1.0], [10000, 0.05]], num_envs: 8, steps_per_iteration: 2000}
stop: {timesteps: 30000, return: 1.0}
evaluation: {interval: 1, episodes: 10}
checkpoint: {every: 1, keep: 2}
seed: 3
"""


def test_discretizer_cuts_each_dimension_into_its_bins_and_clips_outside_values() -> None:
    space = gym.spaces.Box(-np.inf, np.inf, shape=(2,))
    training = QLearningTraining(bins=[4, 3], low=[-1.0, 0.0], high=[1.0, 3.0])
    discretizer = Discretizer.for_space(space, training, "test")
    obs = np.array([[-1.0, 0.0], [-0.49, 0.5], [0.99, 2.99], [-50.0, 50.0], [0.0, 1.0]])
    # Row = cell of dimension 0 + 4 * cell of dimension 1.
    assert discretizer.index(obs).tolist() == [0, 1, 3 + 4 * 2, 0 + 4 * 2, 2 + 4 * 1]
    assert discretizer.num_states == 12
    assert Discretizer.for_space(gym.spaces.Discrete(16), QLearningTraining(), "test").index(
        [5, 15]
    ).tolist() == [
        5,
        15,
    ]


def test_epsilon_follows_its_schedule_linearly() -> None:
    schedule = [(0, 1.0), (100, 0.1)]
    assert [epsilon_at(schedule, t) for t in (0, 50, 100, 10_000)] == pytest.approx([1.0, 0.55, 0.1, 0.1])


def test_qlearning_cartpole_reaches_the_classic_bar_over_100_episodes(
    shipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = load_experiment("qlearning_cartpole").config
    assert experiment.evaluation.episodes == 100 and experiment.stop.return_ == 195
    summary = train("qlearning_cartpole", runs_root=tmp_path)
    with capsys.disabled():
        print(
            f"\nqlearning_cartpole: mean return {summary.best_eval_return:.1f} over 100 greedy episodes "
            f"after {summary.timesteps:,} steps, {summary.elapsed_s:.1f} s"
        )
    assert summary.status == "finished" and summary.best_eval_return >= 195
    assert summary.timesteps <= experiment.stop.timesteps


def test_frozen_lake_needs_no_bins_and_resume_continues_the_table(experiments: Path, tmp_path: Path) -> None:
    (experiments / "lake.yaml").write_text(FROZEN_LAKE)
    first = train("lake", ["stop.iterations=2", "stop.return=null"], runs_root=tmp_path)
    table_before, _ = load_q_table(list_checkpoints(first.run_dir)[-1])
    assert first.iterations == 2 and np.count_nonzero(table_before) > 0

    resumed = train(None, ["stop.iterations=null"], resume=str(first.run_dir), runs_root=tmp_path)

    assert resumed.run_dir == first.run_dir and resumed.status == "finished"
    assert resumed.best_eval_return == 1.0  # the 4x4 lake's goal, reached by the greedy policy
    last = list_checkpoints(first.run_dir)[-1]
    assert read_info(last).iteration == resumed.iterations > 2
    progress = (first.run_dir / "progress.csv").read_text().splitlines()[1:]
    assert [int(line.split(",")[0]) for line in progress] == list(range(1, resumed.iterations + 1))


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_evaluate_and_export_take_a_tabular_checkpoint(experiments: Path, tmp_path: Path, fmt: str) -> None:
    from rl_app.policy.evaluate import evaluate
    from rl_app.policy.export import export_policy

    (experiments / "cart.yaml").write_text((REPO / "experiments" / "qlearning_cartpole.yaml").read_text())
    run = train("cart", ["stop.iterations=1", "evaluation.interval=0"], runs_root=tmp_path)
    checkpoint = list_checkpoints(run.run_dir)[-1]
    q_table, discretizer = load_q_table(checkpoint)
    report = evaluate(str(run.run_dir), episodes=3, seed=1000)
    returns = [episode["episode_return"] for episode in report["per_episode"]]
    # The same greedy actions on the same seeds, replayed with gymnasium alone.
    assert returns == replayed_returns(
        "CartPole-v1", [1000, 1001, 1002], lambda obs: q_table[discretizer.index(obs)].argmax(axis=-1)
    )

    target = export_policy(str(run.run_dir), fmt, tmp_path / "export")
    spec = json.loads((tmp_path / "export" / "policy.json").read_text())
    assert spec["algorithm"] == "QLearning" and spec["action_space"]["n"] == 2
    obs = np.random.default_rng(0).uniform(-3, 3, size=(256, 4)).astype(np.float32)  # some beyond the bounds
    if fmt == "onnx":
        import onnxruntime as ort

        exported = ort.InferenceSession(str(target)).run(None, {"obs": obs})[0]
    else:
        import torch

        exported = torch.jit.load(str(target))(torch.as_tensor(obs)).numpy()
    np.testing.assert_array_equal(exported, greedy_actions(q_table, discretizer, obs))
    assert os.path.getsize(target) > q_table.size * 4  # the table is in the file
