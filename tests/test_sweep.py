"""Ray Tune sweeps end to end: ASHA ranking and results, crashing trials, kill -9 and resume."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import local_ray, replayed_returns, rllib_policy
from ray import tune
from rich.console import Console

from rl_app.config import load_experiment
from rl_app.runs.checkpoints import MARKER, read_info
from rl_app.sweep.run import run_sweep
from rl_app.training.run import train
from rl_app.training.trial import fallback_checkpoint

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.ray

TINY = """\
algorithm: PPO
env: {env}
training: {{train_batch_size_per_learner: 500, minibatch_size: 125, num_epochs: 1}}
model: {{fcnet_hiddens: [16]}}
env_runners: {{num_envs_per_env_runner: 2}}
stop: {{timesteps: {timesteps}}}
checkpoint: {{every: 1, keep: 2}}
sweep:
{sweep}
"""


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """Like conftest's, but trial actors can import tests/faulty_env.py."""
    pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    with local_ray({"PYTHONPATH": pythonpath}):
        yield


def write_sweep(folder: Path, name: str, sweep: str, env: str = "CartPole-v1", timesteps: int = 2000) -> None:
    (folder / f"{name}.yaml").write_text(TINY.format(env=env, sweep=sweep, timesteps=timesteps))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def quiet() -> Console:
    return Console(file=io.StringIO(), width=150)


def test_asha_sweep_ranks_trials_writes_results_and_the_best_config_trains(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    write_sweep(
        experiments,
        "tiny",
        """\
  num_samples: 4
  scheduler: {type: asha, grace_period: 1000, reduction_factor: 2}
  space:
    training.lr: {loguniform: [1.0e-4, 1.0e-2]}
    training.num_epochs: {choice: [1, 2]}
""",
    )
    summary = run_sweep("tiny", runs_root=tmp_path / "runs", console=quiet())

    assert summary.status == "finished" and summary.metric == "return"
    rows = summary.trials
    assert [r.rank for r in rows] == [1, 2, 3, 4]
    scores = [r.score for r in rows]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
    for row in rows:
        assert row.status in ("finished", "pruned"), row
        # ASHA prunes only at a rung before max_t; finished trials ran their whole budget.
        assert (row.timesteps >= 2000) == (row.status == "finished"), row
        assert 1e-4 <= row.values["training.lr"] <= 1e-2 and row.values["training.num_epochs"] in (1, 2)

    sweep_dir = summary.sweep_dir
    assert sweep_dir.parent == tmp_path / "runs" / "tiny"
    table = read_csv(sweep_dir / "results.csv")
    assert [r["trial"] for r in table] == [r.trial for r in rows]
    assert float(table[0]["return"]) == pytest.approx(rows[0].score)
    assert {"training.lr", "training.num_epochs", "checkpoint", "status"} <= set(table[0])
    for png in ("curves.png", "hyperparameters.png"):
        data = (sweep_dir / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    for row in rows:  # every trial keeps its own config, metrics and checkpoints
        trial_dir = Path(row.trial_dir)
        assert (trial_dir / "params.json").is_file() and (trial_dir / "progress.csv").is_file()
        assert len(row.history) == row.iterations

    best = rows[0]
    checkpoint = Path(best.checkpoint)
    assert checkpoint.parent == Path(best.trial_dir)
    assert read_info(checkpoint).algorithm == "PPO"  # our marker: evaluate/export/--init-from take it
    from rl_app.policy.evaluate import evaluate

    report = evaluate(str(checkpoint), episodes=2, seed=1000, console=quiet())
    returns = [episode["episode_return"] for episode in report["per_episode"]]
    assert returns == replayed_returns("CartPole-v1", [1000, 1001], rllib_policy(checkpoint))

    best_file = summary.best_experiment
    assert best_file == sweep_dir / "tiny_best.yaml"
    loaded = load_experiment(str(best_file))
    assert loaded.config.sweep is None
    assert loaded.config.training.lr == pytest.approx(best.values["training.lr"])
    assert loaded.config.training.num_epochs == best.values["training.num_epochs"]
    run = train(str(best_file), ["stop.timesteps=500"], runs_root=tmp_path / "runs", console=quiet())
    assert run.status == "finished" and run.last_checkpoint is not None
    assert run.run_dir.parent == tmp_path / "runs" / "tiny_best"


def test_crashing_trials_are_retried_then_recorded_and_the_sweep_completes(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    sweep = f"""\
  search: grid
  max_failures: 1
  space:
    env.config.crash: {{grid: [never, once, always, kill_runner_once]}}
    env.config.marker_dir: {{grid: ["{marker_dir}"]}}
"""
    write_sweep(experiments, "flaky", sweep, env="faulty_env:CrashingCartPole", timesteps=1500)
    # A failing env fails its trial here (rather than being recreated), so Tune's retries are what is tested.
    flaky = experiments / "flaky.yaml"
    flaky.write_text(
        flaky.read_text().replace(
            "num_envs_per_env_runner: 2", "num_envs_per_env_runner: 2, restart_failed_envs: false"
        )
    )
    summary = run_sweep("flaky", runs_root=tmp_path / "runs", console=quiet())

    assert summary.status == "finished"
    by_mode = {row.values["env.config.crash"]: row for row in summary.trials}
    assert (by_mode["never"].status, by_mode["never"].failures) == ("finished", 0)
    assert (by_mode["once"].status, by_mode["once"].failures) == ("finished", 1)  # retried from a checkpoint
    assert by_mode["once"].timesteps >= 1500
    assert (by_mode["always"].status, by_mode["always"].failures) == ("error", 2)  # 1 try + 1 retry
    assert "deliberate crash (always)" in by_mode["always"].error
    # The trial's own process SIGKILLed (its envs live in it): Tune retries it from its checkpoint.
    killed = by_mode["kill_runner_once"]
    assert (killed.status, killed.failures) == ("finished", 1) and killed.timesteps >= 1500
    assert summary.best is not None and summary.best.values["env.config.crash"] != "always"
    table = {r["env.config.crash"]: r for r in read_csv(summary.sweep_dir / "results.csv")}
    assert table["always"]["status"] == "error" and "deliberate crash" in table["always"]["error"]
    assert table["kill_runner_once"]["status"] == "finished" and table["kill_runner_once"]["failures"] == "1"


def result_iterations(trial_dir: Path) -> list[int]:
    path = trial_dir / "result.json"
    if not path.is_file():
        return []
    return [json.loads(line)["training_iteration"] for line in path.read_text().splitlines() if line.strip()]


def finished(trial_dir: Path) -> bool:
    path = trial_dir / "result.json"
    return path.is_file() and '"stop_reason"' in path.read_text()


def recorded_statuses(sweep_dir: Path) -> dict[str, str]:
    """Trial folder -> status in Tune's newest saved sweep state (what a resume starts from)."""
    states = sorted(sweep_dir.glob("experiment_state-*.json"))
    try:
        trials = json.loads(states[-1].read_text())["trial_data"] if states else []
    except ValueError:  # caught mid-write
        return {}
    return {f"trial_{state['trial_id']}": state["status"] for state in (json.loads(t[0]) for t in trials)}


def test_kill_9_of_the_sweep_driver_then_resume_keeps_finished_trials(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    sweep = """\
  search: grid
  max_concurrent_trials: 1
  space:
    training.lr: {grid: [0.0003, 0.001, 0.003]}
"""
    write_sweep(experiments, "killed", sweep, timesteps=6000)
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "rl_app", "sweep", "killed", "--runs-dir", str(runs)]
    process = subprocess.Popen(
        command,
        env={**os.environ, "RL_APP_EXPERIMENTS_DIR": str(experiments)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            trial_dirs = sorted(runs.glob("killed/*/trial_*"))
            recorded = recorded_statuses(trial_dirs[0].parent) if trial_dirs else {}
            # Finished as far as the saved state knows: Tune saves it every 2 s, so a trial that
            # finished after the last save is continued from its recorded checkpoint on resume.
            done = [d for d in trial_dirs if finished(d) and recorded.get(d.name) == "TERMINATED"]
            running = [d for d in trial_dirs if not finished(d) and len(result_iterations(d)) >= 3]
            if done and running:
                break
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.1)
        else:
            pytest.fail("the sweep never had a finished and a half-done trial")
        os.killpg(process.pid, signal.SIGKILL)  # the driver and every Ray process it started
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    sweep_dir = done[0].parent
    assert len(trial_dirs) == 2  # max_concurrent_trials 1: the third not started while one runs
    kept = {d.name: result_iterations(d) for d in done}
    interrupted = running[0]
    reported_before_kill = len(result_iterations(interrupted))

    summary = run_sweep(None, resume=str(sweep_dir), runs_root=runs, console=quiet())

    assert summary.status == "finished"
    assert [r.status for r in summary.trials] == ["finished"] * 3
    for name, iterations in kept.items():
        assert result_iterations(sweep_dir / name) == iterations  # not rerun
    after = result_iterations(interrupted)
    assert len(after) > reported_before_kill and after[-1] == 12  # 6000 steps / 500 per iteration
    assert after.count(1) == 1  # continued from its checkpoint, not restarted


@dataclass
class RecordedCheckpoint:
    """The (checkpoint, metrics) pair Tune's saved sweep state hands ``Trainable.restore``."""

    checkpoint: tune.Checkpoint
    metrics: dict[str, Any]


@pytest.mark.parametrize(
    ("complete", "recorded", "chosen"),
    [
        ({"checkpoint_000001": 2, "checkpoint_000002": 3, "checkpoint_000005": 6}, 5, 3),
        ({"checkpoint_000005": 6, "checkpoint_000006": 7}, 5, 6),
    ],
)
def test_a_pruned_recorded_checkpoint_falls_back_to_the_newest_complete_one_not_after_it(
    tmp_path: Path, complete: dict[str, int], recorded: int, chosen: int
) -> None:
    for name, iteration in complete.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / MARKER).write_text(json.dumps({"iteration": iteration}))
    (tmp_path / "checkpoint_000007").mkdir()  # a save cut short: no marker
    missing = RecordedCheckpoint(
        tune.Checkpoint(str(tmp_path / "checkpoint_000004")), {"training_iteration": recorded, "x": 1}
    )

    replacement = fallback_checkpoint(missing)

    assert replacement.metrics == {"training_iteration": chosen, "x": 1}
    marker = json.loads((Path(replacement.checkpoint.path) / MARKER).read_text())
    assert marker["iteration"] == chosen


def test_optuna_search_and_pbt_scheduler_run_through_tune(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    write_sweep(
        experiments,
        "optuna",
        """\
  search: optuna
  num_samples: 2
  space:
    training.lr: {loguniform: [1.0e-4, 1.0e-2]}
    training.num_epochs: {choice: [1, 2]}
""",
        timesteps=1000,
    )
    summary = run_sweep("optuna", runs_root=tmp_path / "runs", console=quiet())
    assert [r.status for r in summary.trials] == ["finished", "finished"]
    assert list(summary.sweep_dir.glob("searcher-state-*.pkl")), "Optuna's searcher state was not saved"

    write_sweep(
        experiments,
        "pbt",
        """\
  num_samples: 2
  scheduler: {type: pbt, perturbation_interval: 500, resample_probability: 1.0}
  space:
    training.lr: {loguniform: [1.0e-4, 1.0e-2]}
""",
        timesteps=3000,  # five chances to exploit: PBT needs both trials' scores at that moment
    )
    summary = run_sweep("pbt", runs_root=tmp_path / "runs", console=quiet())
    assert [r.status for r in summary.trials] == ["finished", "finished"]
    # PBT logs each exploit (a trial restarted from the better one's checkpoint with a new lr).
    exploits = (summary.sweep_dir / "pbt_global.txt").read_text().splitlines()
    assert exploits, "PBT never exploited"


def test_trials_that_stop_before_their_first_evaluation_are_evaluated_when_they_stop(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    import math

    (experiments / "late.yaml").write_text(
        TINY.format(
            env="CartPole-v1",
            timesteps=1000,
            sweep="  search: grid\n  space:\n    training.lr: {grid: [0.001, 0.0003]}\n",
        )
        + "evaluation: {interval: 5, episodes: 2}\n"
    )
    output = io.StringIO()
    summary = run_sweep("late", runs_root=tmp_path / "runs", console=Console(file=output, width=300))
    assert "trials stop at 1,000 timesteps, before their first evaluation (iteration 5" in output.getvalue()
    assert summary.metric == "eval_return" and len(summary.trials) == 2
    for row in summary.trials:
        assert math.isfinite(row.score) and row.score == row.eval_return_mean, row
        evaluated = [not math.isnan(point["eval_return_mean"]) for point in row.history]
        assert evaluated == [False, True], row.history  # only where it was measured: at the end
    from rl_app.policy.evaluate import evaluate

    # A trial folder is taken as it is: its best checkpoint is evaluated.
    report = evaluate(summary.trials[0].trial_dir, episodes=2, console=quiet())
    assert Path(report["checkpoint"]).parent == Path(summary.trials[0].trial_dir)
