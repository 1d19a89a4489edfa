"""Runs that survive: kill -9 and resume, config checks on resume, warm starts, bad run folders."""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import SMALL_PPO

from rl_app.errors import UserError
from rl_app.runs.checkpoints import MARKER, list_checkpoints, read_info
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


def iterations(run_dir: Path) -> list[int]:
    with (run_dir / "progress.csv").open() as handle:
        return [int(row["iteration"]) for row in csv.DictReader(handle)]


def test_kill_9_then_resume_loses_at_most_one_checkpoint_interval(tmp_path: Path) -> None:
    every = 3
    command = [
        sys.executable, "-m", "rl_app", "train", "ppo_cartpole", "--runs-dir", str(tmp_path),
        "--set", "stop.iterations=12", "--set", f"checkpoint.every={every}",
        *[arg for item in SMALL_PPO for arg in ("--set", item)],
    ]  # fmt: skip
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        run_dirs: list[Path] = []
        while time.monotonic() < deadline:
            run_dirs = [p.parent for p in tmp_path.glob("ppo_cartpole/*/progress.csv")]
            if run_dirs and len(iterations(run_dirs[0])) >= every + 2:
                break
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.2)
        assert run_dirs, "training never reported an iteration"
        os.killpg(process.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    run_dir = run_dirs[0]
    done_before_kill = len(iterations(run_dir))
    latest = list_checkpoints(run_dir)[-1]
    assert done_before_kill - read_info(latest).iteration <= every
    assert json.loads((run_dir / "status.json").read_text())["status"] == "running"  # it never said goodbye

    from rl_app.runs.layout import run_status

    assert run_status(run_dir) == "killed"
    result = subprocess.run(
        [sys.executable, "-m", "rl_app", "train", "--resume", str(run_dir), "--runs-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Resumed from {latest.name}" in result.stdout
    assert iterations(run_dir) == list(range(1, 13))  # appended, no duplicated or missing iteration
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations"] == 12
    assert run_status(run_dir) == "finished"
    with (run_dir / "progress.csv").open() as handle:
        timesteps = [int(row["timesteps"]) for row in csv.DictReader(handle)]
    assert timesteps == sorted(timesteps) and len(set(timesteps)) == 12  # counters restored, not restarted


@pytest.fixture(scope="module")
def finished_run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    root = tmp_path_factory.mktemp("runs")
    return train(
        "ppo_cartpole", [*SMALL_PPO, "stop.iterations=2", "checkpoint.every=1"], runs_root=root
    ).run_dir


def test_resume_continues_counters_and_optimizer(finished_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "copy" / "ppo_cartpole" / finished_run.name
    shutil.copytree(finished_run, run_dir)
    before = read_info(list_checkpoints(run_dir)[-1])
    steps_before = adam_steps(list_checkpoints(run_dir)[-1])
    summary = train(None, ["stop.iterations=4"], resume=str(run_dir), runs_root=tmp_path)
    assert summary.status == "finished" and summary.iterations == 4
    assert iterations(run_dir) == [1, 2, 3, 4]
    assert summary.timesteps > before.timesteps
    # Adam's step count goes on from the checkpoint's: two more iterations of about as many updates
    # (an optimizer started afresh would count those two alone, about as many as before).
    assert adam_steps(list_checkpoints(run_dir)[-1]) > 1.5 * steps_before


def adam_steps(checkpoint: Path) -> float:
    """The step count of the learner's Adam optimizer saved in ``checkpoint``."""
    with (checkpoint / "learner_group" / "learner" / "state.pkl").open("rb") as file:
        state = pickle.load(file)
    optimizer = state["optimizer"]["default_policy_default_optimizer"]["state"]
    (steps,) = {float(parameter["step"]) for parameter in optimizer["state"].values()}
    return steps


def test_resume_refuses_a_changed_config_unless_forced(finished_run: Path, tmp_path: Path) -> None:
    before = {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=r"different config \(training.lr: .*--force-config"):
        train(None, ["training.lr=0.01"], resume=str(finished_run), runs_root=tmp_path)
    assert {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()} == before


def test_resume_refuses_a_checkpoint_of_another_algorithm(finished_run: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"checkpoint .* is from PPO, not DQN"):
        train("dqn_cartpole", [], resume=str(finished_run), force_config=True, runs_root=tmp_path)


def test_warm_start_weights_reach_every_remote_env_runner_through_the_object_store(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module is read from disk once on the driver; two remote env runners get identical weights."""
    import numpy as np

    import rl_app.rllib.algorithm as rllib_algorithm
    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.rllib.algorithm import warm_start
    from rl_app.rllib.config import algorithm_config

    checkpoint = list_checkpoints(finished_run)[-1]
    copy = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, copy)
    reads: list[Path] = []
    real_load = rllib_algorithm.load_module

    def counting_load(path: Path):  # type: ignore[no-untyped-def]
        reads.append(path)
        module = real_load(path)
        shutil.rmtree(path)  # nobody can read the files after this: remote actors must use the object store
        return module

    monkeypatch.setattr(rllib_algorithm, "load_module", counting_load)
    loaded = load_experiment(
        "ppo_cartpole", [*SMALL_PPO, "env_runners.num_env_runners=2", "env_runners.reserved_cpus=0"]
    )
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    algo = config.build_algo()
    try:
        expected = {k: np.asarray(v) for k, v in real_load(checkpoint).get_state().items()}

        def remote_states() -> list[dict[str, np.ndarray]]:
            states = algo.env_runner_group.foreach_env_runner(
                lambda runner: runner.module.get_state(), local_env_runner=False
            )
            return [{k: np.asarray(v) for k, v in s.items() if k in expected} for s in states]

        fresh = remote_states()
        assert any(not np.array_equal(fresh[0][k], expected[k]) for k in fresh[0])
        warm_start(algo, copy)
        assert reads == [copy] and not copy.exists()
        states = remote_states()
        assert len(states) == 2 and all(states)
        for state in states:
            for name, value in state.items():
                np.testing.assert_array_equal(value, expected[name])
    finally:
        algo.stop()


def test_init_from_starts_a_new_run_from_weights(finished_run: Path, tmp_path: Path) -> None:
    summary = train(
        "ppo_cartpole", [*SMALL_PPO, "stop.iterations=1"], init_from=str(finished_run), runs_root=tmp_path
    )
    assert summary.status == "finished" and summary.run_dir != finished_run
    assert iterations(summary.run_dir) == [1]  # counters start fresh, weights do not


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", "does not exist"),
        ("no_marker", "no complete checkpoint"),
        ("truncated", "no complete checkpoint whose files are as written"),
    ],
)
def test_damaged_runs_are_refused_with_one_line(
    finished_run: Path, tmp_path: Path, damage: str, message: str
) -> None:
    run_dir = tmp_path / "ppo_cartpole" / "damaged"
    shutil.copytree(finished_run, run_dir)
    if damage == "missing":
        shutil.rmtree(run_dir)
    for checkpoint in list_checkpoints(run_dir):
        if damage == "no_marker":
            (checkpoint / MARKER).unlink()
        if damage == "truncated":
            state = checkpoint / "learner_group" / "learner" / "state.pkl"
            state.write_bytes(state.read_bytes()[:100])
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} if run_dir.exists() else {}
    with pytest.raises(UserError, match=message) as caught:
        train(None, ["stop.iterations=3"], resume=str(run_dir), runs_root=tmp_path)
    assert "\n" not in str(caught.value)
    if run_dir.exists():
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_damaged_newest_checkpoint_is_kept_aside_and_the_one_before_resumes(
    finished_run: Path, tmp_path: Path
) -> None:
    from rich.console import Console

    from rl_app.policy.evaluate import evaluate

    run_dir = tmp_path / "ppo_cartpole" / "bit_rot"
    shutil.copytree(finished_run, run_dir)
    older, newest = list_checkpoints(run_dir)[-2:]
    state = newest / "learner_group" / "learner" / "state.pkl"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, the size unchanged: RLlib would load it without a word
    state.write_bytes(bytes(data))
    damaged = {p.relative_to(newest): p.read_bytes() for p in newest.rglob("*") if p.is_file()}

    console = Console(record=True, width=400)
    report = evaluate(str(run_dir), episodes=1, runs_root=tmp_path, console=console)
    assert report["checkpoint"] == str(older)
    assert f"{newest.name} is damaged (learner_group/learner/state.pkl differs" in console.export_text()
    with pytest.raises(UserError, match=f"{newest.name}' is damaged"):
        evaluate(str(newest), episodes=1, runs_root=tmp_path)  # named explicitly: refused

    summary = train(None, ["stop.iterations=3"], resume=str(run_dir), runs_root=tmp_path, console=console)
    text = console.export_text()
    kept = newest.with_name(f"{newest.name}.damaged")
    assert f"kept aside as {kept.name}; using {older.name}" in text
    assert f"Resumed from {older.name}" in text
    assert read_info(older).iteration == 1
    assert summary.status == "finished" and iterations(run_dir) == [1, 2, 3]  # iteration 2 done again
    assert {p.relative_to(kept): p.read_bytes() for p in kept.rglob("*") if p.is_file()} == damaged
    assert newest.name in {c.name for c in list_checkpoints(run_dir)}  # written again, sound this time


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--resume", "no/such/run"], "run 'no/such/run' does not exist"),
        (["evaluate", "no/such/run"], "'no/such/run' does not exist"),
        (["export", "no/such/run", "--format", "onnx"], "'no/such/run' does not exist"),
        (["train", "ppo_cartpole", "--storage", "ftp://host/x"], "unknown scheme 'ftp://'"),
        (["train", "ppo_cartpole", "--init-from", "no/such/run"], "'no/such/run' does not exist"),
        (["export", "x", "--format", "pickle"], "invalid choice: 'pickle'"),
        (["runs", "--runs-dir", "no/such/folder"], "runs folder 'no/such/folder' does not exist"),
    ],
)
def test_bad_run_inputs_are_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    result = subprocess.run(
        [sys.executable, "-m", "rl_app", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_replay_buffer_is_saved_and_restored(ray_session: None, tmp_path: Path) -> None:
    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.rllib.accel.replay_buffer import ArrayPrioritizedEpisodeReplayBuffer
    from rl_app.rllib.algorithm import build_experiment, restore_algorithm
    from rl_app.rllib.replay import BUFFER_RNG, REPLAY_BUFFER

    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    overrides = ["stop.iterations=2", "evaluation.interval=0"]
    summary = train("dqn_cartpole", overrides, runs_root=tmp_path)
    checkpoint = list_checkpoints(summary.run_dir)[-1]
    assert (checkpoint / REPLAY_BUFFER).stat().st_size > 1000
    loaded = load_experiment("dqn_cartpole", overrides)
    algo = build_experiment(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    try:
        buffer = algo.local_replay_buffer
        assert isinstance(buffer, ArrayPrioritizedEpisodeReplayBuffer)  # the array path is chosen
        assert buffer.get_num_timesteps() == 0
        fresh_rng = buffer.rng.bit_generator.state
        restore_algorithm(algo, checkpoint)
        assert buffer.get_num_timesteps() > 0
        assert algo.training_iteration == read_info(checkpoint).iteration
        # the sampling RNG continues where the run left off, not from the seed again
        saved_rng = pickle.loads((checkpoint / REPLAY_BUFFER).read_bytes())[BUFFER_RNG]
        assert buffer.rng.bit_generator.state == saved_rng != fresh_rng
    finally:
        algo.stop()


def test_a_restored_sweep_trial_reseeds_like_a_resumed_run(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both hosts load a checkpoint through one loop: env runners re-seeded with seed + iteration,
    and the next iteration is the same one."""
    import yaml
    from ray import tune

    from rl_app.cluster.resources import plan_resources
    from rl_app.config import validate_experiment
    from rl_app.training.trial import ExperimentTrial

    checkpoint = list_checkpoints(finished_run)[-1]
    iteration = read_info(checkpoint).iteration
    run_dir = tmp_path / "ppo_cartpole" / finished_run.name
    shutil.copytree(finished_run, run_dir)
    train(None, [f"stop.iterations={iteration + 1}"], resume=str(run_dir), runs_root=tmp_path)
    with (run_dir / "progress.csv").open() as handle:
        resumed = list(csv.DictReader(handle))[-1]

    data = yaml.safe_load((finished_run / "experiment.yaml").read_text())
    plan = plan_resources(validate_experiment(data, "experiment.yaml"), 2, 0)
    monkeypatch.setattr("ray.tune.trainable.trainable.DEFAULT_STORAGE_PATH", str(tmp_path / "tune"))
    trial = tune.with_parameters(ExperimentTrial, experiment=data, name="ppo_cartpole", plan=plan)(config={})
    try:
        fresh = trial.loop.algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.seed, local_env_runner=True
        )
        trial.load_checkpoint(str(checkpoint))
        seeds = trial.loop.algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.seed, local_env_runner=True
        )
        result = trial.step()
    finally:
        trial.stop()
    assert fresh == [data["seed"]] and seeds == [data["seed"] + iteration]
    assert int(resumed["iteration"]) == iteration + 1
    for key in ("timesteps", "episodes"):
        assert result[key] == int(resumed[key]), key
    for key in ("return_mean", "return_min", "return_max", "episode_len_mean"):
        assert result[key] == pytest.approx(float(resumed[key])), key


def test_a_checkpoint_the_disk_refuses_stops_the_run_in_one_line_and_keeps_the_last_complete_one(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from rl_app.training.backends import AlgorithmBackend

    real_save = AlgorithmBackend.save
    saves: list[Path] = []

    def disk_full_at_the_third(learner, folder: Path, replay_buffer: bool) -> None:  # type: ignore[no-untyped-def]
        saves.append(folder)
        real_save(learner, folder, replay_buffer)
        if len(saves) == 3:  # RLlib's files are half there when the disk fills
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("RL_APP_EXPERIMENTS_DIR", str(REPO / "experiments"))
    monkeypatch.setattr(AlgorithmBackend, "save", disk_full_at_the_third)
    overrides = [*SMALL_PPO, "stop.iterations=5", "checkpoint.every=1"]
    with pytest.raises(
        UserError, match=r"cannot write checkpoint iter_000003 .*No space left on device"
    ) as err:
        train("ppo_cartpole", overrides, runs_root=tmp_path)
    assert "the latest complete checkpoint, iter_000002, is kept and resumable" in str(err.value)
    (run_dir,) = (tmp_path / "ppo_cartpole").iterdir()
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000001", "iter_000002"]
    assert not list((run_dir / "checkpoints").glob(".partial-*"))
    assert iterations(run_dir) == [1, 2, 3]  # progress.csv kept every iteration trained
    monkeypatch.setattr(AlgorithmBackend, "save", real_save)  # room on the disk again
    resumed = train(None, ["stop.iterations=4"], resume=str(run_dir), runs_root=tmp_path)
    assert resumed.status == "finished" and iterations(run_dir) == [1, 2, 3, 4]


def test_a_resumed_sweep_trial_whose_named_checkpoint_was_pruned_continues_from_its_newest(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tune's sweep state (saved every 2 s) can name a checkpoint its retention deleted just after;
    a sweep resumed after kill -9 must continue that trial, not fail it."""
    import yaml
    from ray import tune
    from ray.train._internal.session import _TrainingResult

    from rl_app.cluster.resources import plan_resources
    from rl_app.config import validate_experiment
    from rl_app.training.trial import ExperimentTrial

    trial_dir = tmp_path / "trial_0001"
    shutil.copytree(list_checkpoints(finished_run)[-1], trial_dir / "checkpoint_000002")
    (trial_dir / "checkpoint_000003").mkdir()  # half-written: no marker
    data = yaml.safe_load((finished_run / "experiment.yaml").read_text())
    plan = plan_resources(validate_experiment(data, "experiment.yaml"), 2, 0)
    monkeypatch.setattr("ray.tune.trainable.trainable.DEFAULT_STORAGE_PATH", str(tmp_path / "tune"))
    trial = tune.with_parameters(ExperimentTrial, experiment=data, name="ppo_cartpole", plan=plan)(config={})
    try:
        pruned = tune.Checkpoint.from_directory(str(trial_dir / "checkpoint_000004"))  # gone
        trial.restore(_TrainingResult(checkpoint=pruned, metrics={"training_iteration": 4}))
        assert trial.iteration == trial.loop.iteration == 2
        result = trial.train()
        assert result["training_iteration"] == trial.loop.iteration == 3
    finally:
        trial.stop()


def test_a_sac_run_from_before_model_sac_critic_resumes_with_the_critic_it_trained(tmp_path: Path) -> None:
    """Such a run's config.yaml names no sac_critic: it trained RLlib's multi-stream critic, and
    resume rebuilds that, not today's default."""
    from rl_app.runs.layout import as_trained

    saved = {"algorithm": "SAC", "env": {"id": "Pendulum-v1"}, "model": {"fcnet_hiddens": [256, 256]}}
    (tmp_path / "config.yaml").write_text("algorithm: SAC\nmodel: {fcnet_hiddens: [256, 256]}\n")
    assert as_trained(tmp_path, saved)["model"] == {"fcnet_hiddens": [256, 256], "sac_critic": "multi_stream"}
    (tmp_path / "config.yaml").write_text("algorithm: SAC\nmodel: {sac_critic: concat}\n")
    assert as_trained(tmp_path, saved) == saved  # a run of this version: its config.yaml says which
    ppo = {"algorithm": "PPO", "model": {}}
    assert as_trained(tmp_path, ppo) == ppo
