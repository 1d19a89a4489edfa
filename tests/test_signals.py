"""Ctrl-C and SIGTERM: a final checkpoint is written and Ray is shut down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def start_training(tmp_path: Path, checkpoint_every: int) -> tuple[subprocess.Popen[str], Path]:
    """`rl_app train` in its own process, returned once its run folder has two iterations."""
    command = [
        sys.executable, "-m", "rl_app", "train", "ppo_cartpole", "--runs-dir", str(tmp_path),
        "--set", "stop.timesteps=100000000", "--set", f"checkpoint.every={checkpoint_every}",
        "--set", "training.train_batch_size_per_learner=500", "--set", "training.minibatch_size=100",
    ]  # fmt: skip
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        progress = list(tmp_path.glob("ppo_cartpole/*/progress.csv"))
        if progress and len(progress[0].read_text().splitlines()) >= 3:
            return process, progress[0].parent
        if process.poll() is not None:
            raise AssertionError(process.communicate()[0])
        time.sleep(0.2)
    process.kill()
    raise AssertionError("training never reported an iteration")


@pytest.mark.ray
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_writes_final_checkpoint(signum: int, tmp_path: Path) -> None:
    process, run_dir = start_training(tmp_path, checkpoint_every=1000)
    try:
        process.send_signal(signum)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["last_checkpoint"] and Path(summary["last_checkpoint"]).is_dir()
    assert "Traceback" not in output


@pytest.mark.ray
def test_a_second_interrupt_stops_at_once_and_the_run_still_resumes(tmp_path: Path) -> None:
    process, run_dir = start_training(tmp_path, checkpoint_every=1)
    try:
        process.send_signal(signal.SIGINT)
        time.sleep(0.05)  # the first is being handled (final checkpoint) when the second comes
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "Traceback" not in output, output
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    resume = ["train", "--resume", str(run_dir), "--set", "stop.iterations=1"]
    resumed = subprocess.run(
        [sys.executable, "-m", "rl_app", *resume], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Resumed from iter_" in resumed.stdout


@pytest.mark.ray
def test_a_signal_inside_an_env_step_still_stops_gracefully(tmp_path: Path) -> None:
    """RLlib's env runner turns an env's exceptions into 'env failed': ours must not be one."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "selfstop.yaml").write_text(
        "algorithm: PPO\nenv: broken_envs:SignalsItself\n"
        "training: {train_batch_size_per_learner: 500, minibatch_size: 100, num_epochs: 1}\n"
        "env_runners: {num_env_runners: 0, num_envs_per_env_runner: 1}\n"
        "stop: {iterations: 100}\ncheckpoint: {every: 1000}\n"
    )
    env = {
        **os.environ,
        "RL_APP_EXPERIMENTS_DIR": str(experiments),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-m", "rl_app", "train", "selfstop", "--runs-dir", str(tmp_path / "runs")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 130, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (run_dir,) = (tmp_path / "runs" / "selfstop").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "interrupted (SIGTERM)"


def test_a_signal_during_rays_shutdown_waits_for_it_to_end() -> None:
    """A second Ctrl-C that lands in ``ray.shutdown()`` is raised once the shutdown is over."""
    from rl_app.cluster.session import _signals_held

    finished = []
    before = signal.getsignal(signal.SIGINT)
    raised = pytest.raises(KeyboardInterrupt, match="SIGTERM during the test's block")
    with raised, _signals_held("the test's block"):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handlers run between these bytecodes, and only record
        finished.append(True)
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is before


# Runs `rl_app train` with SIGINT sent to itself as Ray's real shutdown begins (after the run has
# finished and written its final checkpoint); says when that shutdown returned.
SIGINT_IN_RAYS_SHUTDOWN = """
import os, signal, sys, time
import ray
real_shutdown = ray.shutdown

def shutdown(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler has run: the signal is held, not raised, while Ray stops
    real_shutdown(*args, **kwargs)
    print("ray.shutdown returned", file=sys.stderr, flush=True)

ray.shutdown = shutdown
from rl_app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def session_processes(session: int) -> list[int]:
    """Processes still alive in the session ``session`` leads (Ray's, which the driver started)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                alive.append(int(entry.name))
    return alive


@pytest.mark.ray
def test_a_sigint_during_a_real_ray_shutdown_lets_it_finish_then_exits_130(tmp_path: Path) -> None:
    command = [
        sys.executable, "-c", SIGINT_IN_RAYS_SHUTDOWN, "train", "ppo_cartpole", "--runs-dir", str(tmp_path),
        "--set", "stop.iterations=2", "--set", "evaluation.interval=0",
    ]  # fmt: skip
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stdout + stderr
    lines = stderr.strip().splitlines()
    assert lines == ["ray.shutdown returned", "rl_app: interrupted (SIGINT during Ray's shutdown)"], stderr
    deadline = time.monotonic() + 10  # Ray's processes exit on their own once told to
    while (left := session_processes(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"Ray processes left running: {left}"
    (run_dir,) = (tmp_path / "ppo_cartpole").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations"] == 2
    assert (run_dir / "checkpoints" / "iter_000002" / "rl_app_checkpoint.json").is_file()
