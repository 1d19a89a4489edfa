"""Offline RL end to end: a trained policy recorded in RLlib's offline format, behaviour cloning from
it evaluated in the real env, and recordings refused when they do not fit the env."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import random_recording
from rich.console import Console

from rl_app.cli import main
from rl_app.policy.evaluate import evaluate
from rl_app.policy.record import MANIFEST, record
from rl_app.training.run import train

pytestmark = pytest.mark.ray

SHIPPED = Path(__file__).resolve().parents[1] / "experiments"


def quiet() -> Console:
    return Console(file=io.StringIO(), width=150)


@pytest.fixture(scope="module")
def solved_cartpole(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ppo_cartpole run trained as shipped (it stops at an evaluation return of 475 or more)."""
    runs = tmp_path_factory.mktemp("runs")
    summary = train(str(SHIPPED / "ppo_cartpole.yaml"), runs_root=runs, console=quiet())
    assert summary.status == "finished" and summary.best_eval_return >= 475
    return summary.run_dir


def test_record_writes_rllibs_columns_episode_by_episode(solved_cartpole: Path, tmp_path: Path) -> None:
    out = tmp_path / "expert"
    recording = record(str(solved_cartpole), out, episodes=5, seed=7, console=quiet())
    table = pq.read_table(out / "episodes.parquet").to_pylist()
    assert len(table) == recording.transitions == sum(1 for _ in table)
    episodes: dict[str, list[dict]] = {}
    for row in table:
        episodes.setdefault(row["eps_id"], []).append(row)
    assert len(episodes) == 5
    for rows, expected in zip(episodes.values(), recording.returns, strict=True):
        assert [row["t"] for row in rows] == list(range(len(rows)))
        assert sum(row["rewards"] for row in rows) == pytest.approx(expected)
        for before, after in itertools.pairwise(rows):  # one transition's next is the next's obs
            assert after["obs"] == pytest.approx(before["new_obs"])
        assert rows[-1]["terminateds"] or rows[-1]["truncateds"]
        assert not any(row["terminateds"] or row["truncateds"] for row in rows[:-1])
        assert all(len(row["obs"]) == 4 and row["actions"] in (0, 1) for row in rows)
    # The policy's own deterministic episodes: the same returns as `rl_app evaluate` on those seeds.
    report = evaluate(str(solved_cartpole), episodes=5, seed=7, console=quiet())
    assert recording.returns == [e["episode_return"] for e in report["per_episode"]]
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["env"]["id"] == "CartPole-v1" and manifest["epsilon"] == 0.0
    assert manifest["return_mean"] == pytest.approx(sum(recording.returns) / 5)

    noisy = record(str(solved_cartpole), tmp_path / "random", episodes=5, random_policy=True, console=quiet())
    assert (
        max(noisy.returns) < 100 < min(recording.returns)
    )  # a random CartPole policy falls within ~20 steps


def test_bc_clones_the_recorded_policy_to_a_return_of_450(
    solved_cartpole: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bc_cartpole as shipped, on 40 episodes recorded from a solved run; its figure is checked in the
    real env by evaluate, on seeds neither training nor the recording used."""
    data = tmp_path / "data" / "cartpole_expert"
    record(str(solved_cartpole), data, episodes=40, console=quiet())
    monkeypatch.chdir(tmp_path)  # bc_cartpole reads data/cartpole_expert, relative to here
    summary = train(str(SHIPPED / "bc_cartpole.yaml"), runs_root=tmp_path / "runs", console=quiet())
    assert summary.status == "finished" and summary.best_eval_return >= 450, summary
    report = evaluate(str(summary.run_dir), episodes=10, seed=5000, console=quiet())
    assert report["return"]["mean"] >= 450, report["return"]
    assert report["algorithm"] == "BC"


def test_a_recording_of_another_envs_spaces_is_refused_in_one_line(
    solved_cartpole: Path, tmp_path: Path, experiments: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "cartpole"
    record(str(solved_cartpole), data, episodes=1, console=quiet())
    (experiments / "pendulum.yaml").write_text(
        f"algorithm: IQL\nenv: Pendulum-v1\noffline: {{input: {data}}}\nstop: {{iterations: 1}}\n"
    )
    runs = tmp_path / "runs"
    assert main(["train", "pendulum", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "offline.input" in err and "has observations of 4 values; Pendulum-v1's have 3" in err
    assert not runs.exists()
    (experiments / "discrete.yaml").write_text(
        f"algorithm: BC\nenv: MountainCar-v0\noffline: {{input: {data}}}\nstop: {{iterations: 1}}\n"
    )
    assert main(["train", "discrete", "--runs-dir", str(runs)]) == 2
    assert "has observations of 4 values; MountainCar-v0's have 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("algorithm", "env_id", "iterations"),
    [
        ("BC", "CartPole-v1", 2),
        ("MARWIL", "CartPole-v1", 2),
        ("IQL", "Pendulum-v1", 2),
        ("CQL", "Pendulum-v1", 1),
    ],
)
def test_each_offline_algorithm_trains_resumes_and_exports(
    ray_session: None, experiments: Path, tmp_path: Path, algorithm: str, env_id: str, iterations: int
) -> None:
    import numpy as np
    import onnxruntime

    from rl_app.policy.export import export_policy

    data = random_recording(env_id, tmp_path / "data")
    updates = "\n  updates_per_iteration: 2" if algorithm == "CQL" else ""
    (experiments / "offline.yaml").write_text(
        f"algorithm: {algorithm}\nenv: {env_id}\noffline:\n  input: {data}{updates}\n"
        "training: {train_batch_size_per_learner: 64}\nmodel: {fcnet_hiddens: [16]}\n"
        f"stop: {{iterations: {iterations}}}\ncheckpoint: {{every: 1}}\n"
    )
    runs = tmp_path / "runs"
    first = train("offline", runs_root=runs, console=quiet())
    assert first.status == "finished" and first.iterations == iterations
    assert first.timesteps > 0  # the transitions trained on
    resumed = train(
        None,
        [f"stop.iterations={iterations + 1}"],
        resume=str(first.run_dir),
        runs_root=runs,
        console=quiet(),
    )
    assert resumed.status == "finished" and resumed.iterations == iterations + 1
    out = export_policy(str(first.run_dir), "onnx", console=quiet())
    session = onnxruntime.InferenceSession(str(out))
    obs = np.zeros((3, *gymnasium_shape(env_id)), dtype=np.float32)
    (actions,) = session.run(None, {session.get_inputs()[0].name: obs})[:1]
    assert len(actions) == 3


def gymnasium_shape(env_id: str) -> tuple[int, ...]:
    import gymnasium as gym

    shape = gym.make(env_id).observation_space.shape
    assert shape is not None
    return tuple(shape)
