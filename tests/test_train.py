"""Training runs on one small shared Ray session: run folders, checkpoints, reproducibility."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import random_recording

from rl_app.config import available_experiments, load_experiment
from rl_app.runs.checkpoints import list_checkpoints
from rl_app.training.run import train

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

SMALL_PPO = (
    "training.train_batch_size_per_learner=400",
    "training.minibatch_size=100",
    "training.num_epochs=1",
)


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "progress.csv").open() as handle:
        return list(csv.DictReader(handle))


# The Atari experiments' shipped batches (4,000 Pong frames through a Nature CNN, 10 epochs) take
# a minute an iteration here: test_workloads.py runs the Pong ones with small batches, end to end,
# and ppo_breakout differs from them in settings only (test_config validates it). The self-play
# experiment trains in test_multi_agent.py.
SHIPPED = [
    name
    for name in available_experiments(Path(__file__).resolve().parents[1] / "experiments")
    if name not in ("ppo_pong", "impala_pong", "ppo_breakout", "ppo_tictactoe_selfplay")
]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_experiment_builds_and_trains(name: str, shipped: Path, tmp_path: Path) -> None:
    # (sweep=null: without evaluation a sweep ranked by eval_return is rightly refused)
    overrides = ["stop.iterations=1", "evaluation.interval=0", "sweep=null"]
    experiment = load_experiment(name).config
    if experiment.offline is not None:  # its recording is made by `make offline-data`: a stand-in here
        data = random_recording(experiment.env.id, tmp_path / "data")
        overrides.append(f"offline.input={data}")
    summary = train(name, overrides, runs_root=tmp_path)
    assert summary.status == "finished" and summary.iterations == 1
    (row,) = rows(summary.run_dir)
    assert int(row["timesteps"]) == summary.timesteps > 0  # the summary and progress.csv agree
    # Strict JSON: a return never measured (no evaluation ran here) is null, not -Infinity.
    saved = json.loads((summary.run_dir / "summary.json").read_text(), parse_constant=_not_json)
    measured = summary.best_eval_return if math.isfinite(summary.best_eval_return) else None
    assert saved["best_eval_return"] == measured and saved["timesteps"] == summary.timesteps


def _not_json(constant: str) -> None:
    raise AssertionError(f"summary.json holds {constant}, which JSON does not have")


def test_run_folder_tells_its_own_story(shipped: Path, tmp_path: Path) -> None:
    overrides = [
        *SMALL_PPO, "stop.iterations=3", "checkpoint.every=1", "checkpoint.keep=2", "seed=5",
        "evaluation.interval=2",
    ]  # fmt: skip
    summary = train("ppo_cartpole", overrides, runs_root=tmp_path)
    run_dir = summary.run_dir
    assert run_dir.parent == tmp_path / "ppo_cartpole"

    progress = rows(run_dir)
    assert [int(r["iteration"]) for r in progress] == [1, 2, 3]
    assert all(float(r["steps_per_s"]) > 0 for r in progress)
    # The evaluation's seconds, apart: only the iteration that evaluated spent any, within its own.
    evaluating = [float(r["evaluation_s"]) for r in progress]
    assert evaluating[0] == evaluating[2] == 0.0
    assert 0 < evaluating[1] < float(progress[1]["iteration_s"])
    assert summary.evaluation_s == pytest.approx(sum(evaluating))
    assert int(progress[-1]["timesteps"]) == summary.timesteps >= 1200

    kept = [p.name for p in list_checkpoints(run_dir)]
    best_name = max(progress, key=lambda r: float(r["return_mean"]))["iteration"]
    assert kept[-2:] == ["iter_000002", "iter_000003"]  # the last K=2 ...
    assert f"iter_{int(best_name):06d}" in kept and len(kept) <= 3  # ... plus the best by return
    assert summary.last_checkpoint == run_dir / "checkpoints" / "iter_000003"
    assert (summary.last_checkpoint / "rllib_checkpoint.json").is_file()
    assert not list((run_dir / "checkpoints").glob(".partial-*"))

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["training"]["train_batch_size_per_learner"] == 400
    assert resolved["training"]["kl_target"] == pytest.approx(0.01)  # RLlib default, recorded
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["seed"] == 5
    assert metadata["overrides"] == overrides
    assert metadata["versions"]["ray"] == "2.60.0"
    assert metadata["git_revision"]
    assert (run_dir / "command.txt").read_text() == " ".join(sys.argv) + "\n"  # the process's command line
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["status"] == "finished" and saved["iterations"] == 3
    png = run_dir / "reward_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    again = train("ppo_cartpole", overrides, runs_root=tmp_path)
    assert again.run_dir != run_dir
    assert (run_dir / "summary.json").read_text() == json.dumps(saved, indent=2, sort_keys=True) + "\n"


def test_same_seed_same_off_policy_run(shipped: Path, tmp_path: Path) -> None:
    """Replay sampling is seeded and iterations are step counts, so SAC repeats itself."""
    overrides = [
        "training.num_steps_sampled_before_learning_starts=50",
        "training.train_batch_size_per_learner=32",
        "model.fcnet_hiddens=[32,32]",
        "stop.iterations=6",
        "evaluation.interval=0",
    ]
    keys = ("timesteps", "episodes", "return_mean")
    runs = [train("sac_pendulum", overrides, runs_root=tmp_path).run_dir for _ in range(2)]
    first, second = ([{k: row[k] for k in keys} for row in rows(run)] for run in runs)
    assert first == second
    assert sum(row["return_mean"] != "nan" for row in first) >= 2  # episodes shaped by learning


def test_same_seed_same_first_iteration(shipped: Path, tmp_path: Path) -> None:
    overrides = [*SMALL_PPO, "stop.iterations=1", "env_runners.num_env_runners=0", "seed=3"]
    first = rows(train("ppo_cartpole", overrides, runs_root=tmp_path).run_dir)[0]
    second = rows(train("ppo_cartpole", overrides, runs_root=tmp_path).run_dir)[0]
    other = rows(train("ppo_cartpole", [*overrides, "seed=4"], runs_root=tmp_path).run_dir)[0]
    keys = ("timesteps", "episodes", "return_mean", "return_min", "return_max", "episode_len_mean")
    assert {k: first[k] for k in keys} == {k: second[k] for k in keys}
    assert {k: first[k] for k in keys} != {k: other[k] for k in keys}


def test_each_evaluation_starts_from_new_states_yet_repeats_with_the_seed(shipped: Path) -> None:
    """RLlib reseeds eval envs identically for every evaluation; ours draw new starts each time."""
    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.rllib.algorithm import build_experiment

    loaded = load_experiment("ppo_cartpole", ["evaluation.episodes=4", "env_runners.num_env_runners=0"])

    def three_evaluations() -> list[float]:
        plan = plan_resources(loaded.config, 2, 0)
        algo = build_experiment(loaded.config, plan, loaded.source)
        try:  # same (untrained) weights each time: only the start states can differ
            return [algo.evaluate()["env_runners"]["episode_return_mean"] for _ in range(3)]
        finally:
            algo.stop()

    first = three_evaluations()
    assert len(set(first)) > 1, first
    assert three_evaluations() == first


def test_a_wrapper_declared_in_the_experiment_applies_in_training_and_evaluation(
    experiments: Path, tmp_path: Path
) -> None:
    """The env factory wraps RLlib's envs, RLlib's evaluation envs and rl_app evaluate's alike."""
    import io

    from rich.console import Console

    from rl_app.policy.evaluate import evaluate

    (experiments / "short.yaml").write_text(
        "algorithm: PPO\n"
        "env: {id: CartPole-v1, wrappers: [{time_limit: {max_episode_steps: 20}}]}\n"
        "training: {train_batch_size_per_learner: 400, minibatch_size: 100, num_epochs: 1}\n"
        "evaluation: {interval: 1, episodes: 4}\n"
        "stop: {iterations: 1}\n"
    )
    summary = train("short", runs_root=tmp_path)
    (row,) = rows(summary.run_dir)
    assert float(row["return_max"]) == 20.0  # CartPole's own limit is 500: episodes were cut at 20
    assert float(row["episode_len_mean"]) <= 20
    assert 0 < float(row["eval_return_mean"]) <= 20
    quiet = Console(file=io.StringIO())
    report = evaluate(str(summary.run_dir), episodes=10, explore=True, console=quiet)
    lengths = [episode["length"] for episode in report["per_episode"]]
    assert max(lengths) == 20 and all(length <= 20 for length in lengths)


def test_an_evaluation_is_recorded_only_on_the_iteration_that_ran_it(shipped: Path, tmp_path: Path) -> None:
    """RLlib's results repeat the last evaluation until the next; progress.csv must not."""
    overrides = [*SMALL_PPO, "evaluation.interval=2", "evaluation.episodes=2", "stop.iterations=5"]
    progress = rows(train("ppo_cartpole", overrides, runs_root=tmp_path).run_dir)
    evaluated = [row["eval_return_mean"] not in ("", "nan") for row in progress]
    assert evaluated == [False, True, False, True, False]


def test_library_messages_go_to_the_run_log_not_the_console(shipped: Path, tmp_path: Path) -> None:
    """One quiet PPO run collects every kind of message the console must not show: RLlib's banner
    and notices (Python logging), Ray core worker's native line for each remote env runner RLlib
    makes (its config is an object-store reference and restarts are asked for), and MuJoCo's
    warning about Gymnasium's HalfCheetah XML, printed when the first env is made: for ``train`` the
    check before Ray starts, for ``show`` the env made for its spaces. ``--verbose`` lets RLlib's
    banner through."""
    rl_app = [sys.executable, "-m", "rl_app"]
    shown = subprocess.run([*rl_app, "show", "ppo_halfcheetah"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert "settotalmass" not in shown.stdout

    overrides = [*SMALL_PPO, "stop.iterations=1", "env_runners.num_env_runners=1"]
    quiet = subprocess.run(
        [*rl_app, "train", "ppo_halfcheetah", "--runs-dir", str(tmp_path),
         *[arg for item in overrides for arg in ("--set", item)]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert "settotalmass" not in quiet.stdout
    (run_dir,) = (tmp_path / "ppo_halfcheetah").iterdir()
    log = (run_dir / "rl_app.log").read_text()
    assert "new API stack" in log
    assert "has constructor arguments in the object store" in log
    assert "settotalmass" in log
    assert f"Ray's and RLlib's own messages: {run_dir / 'rl_app.log'}" in quiet.stdout

    args = [arg for item in [*SMALL_PPO, "stop.iterations=1"] for arg in ("--set", item)]
    loud = subprocess.run(
        [*rl_app, "train", "ppo_cartpole", "--runs-dir", str(tmp_path), *args, "--verbose"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert loud.returncode == 0 and "new API stack" in loud.stderr


def test_native_lines_go_to_the_log_and_other_stderr_comes_back(capfd: pytest.CaptureFixture[str]) -> None:
    import logging
    import os

    from rl_app import library_logs

    class Held(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    records: list[logging.LogRecord] = []
    native = logging.getLogger("ray.core_worker")
    library_logs.capture_library_logs()
    native.addHandler(held := Held())
    try:
        with library_logs.native_lines_to_log():
            os.write(2, b"[2026-12-06 20:21:47,583 E 1913 1913] core_worker.cc:2465: Actor with class ")
            os.write(2, b"name: 'X' and ID: '01' has constructor arguments in the object store and ...\n")
            os.write(2, b"a line of someone else's\n")
            os.write(2, b"[2026-12-06 20:21:48,001 F 1913 1913] raylet_client.cc:1: a real failure\n")
    finally:
        native.removeHandler(held)
    assert capfd.readouterr().err.splitlines() == [
        "a line of someone else's",
        "[2026-12-06 20:21:48,001 F 1913 1913] raylet_client.cc:1: a real failure",
    ]
    assert [r.levelno for r in records] == [logging.WARNING]
    assert records[0].getMessage().endswith("has constructor arguments in the object store and ...")


SESSION_TASK_EVENTS = """
import ray
from rl_app.cluster.session import ray_session
with ray_session():
    print(ray._config.task_events_max_num_task_in_gcs())
"""


def test_a_local_ray_keeps_a_bounded_task_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's GCS growth: Ray keeps 100,000 tasks' events by default, ours 10,000; the
    environment variable still decides when set."""
    from rl_app.cluster.session import TASK_EVENTS_KEPT, _task_events_cap

    env = {
        k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_task_events_max_num_task_in_gcs")
    }
    started = subprocess.run(
        [sys.executable, "-c", SESSION_TASK_EVENTS], env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == [str(TASK_EVENTS_KEPT)]
    monkeypatch.setenv("RAY_task_events_max_num_task_in_gcs", "777")
    assert _task_events_cap() == {}


SESSION_PROCESSES = """
import gc
import psutil
from rl_app.cluster.session import _autoscaler_monitors, ray_session
with ray_session():
    monitors = len(_autoscaler_monitors())
    started = psutil.Process().children(recursive=True)
    frozen_inside = gc.get_freeze_count()
running = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
frozen = (frozen_inside > 100_000, gc.get_freeze_count(), gc.isenabled())
print(monitors, len(started) > 3, len(running), *frozen)
"""


def test_a_local_ray_session_stops_every_process_it_started_and_leaves_the_collector_as_it_was() -> None:
    """The session kills Ray's autoscaler monitor itself (Ray's shutdown waits a second for
    it), and freezes what the start imported only while it lasts."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    ran = subprocess.run(
        [sys.executable, "-c", SESSION_PROCESSES], env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1", "True", "0", "True", "0", "True"]


def test_short_iterations_print_a_line_a_second_and_every_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import math
    import time

    from rich.console import Console

    from rl_app.console.progress import ProgressPrinter
    from rl_app.runs.progress import IterationMetrics

    tenths = [0]  # a clock in tenths of a second: exact, no float drift
    monkeypatch.setattr(time, "monotonic", lambda: tenths[0] / 10)
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=120), stop_timesteps=10_000, stop_time_s=None)
    for i in range(1, 31):  # 3 s of 0.1 s iterations, an evaluation at iteration 15
        evaluated = 475.0 if i == 15 else math.nan
        printer.iteration(
            IterationMetrics(i, 256 * i, 1, 20.0, 9.0, 40.0, 20.0, evaluated, 2560.0, 0.1, i / 10)
        )
        tenths[0] += 1
    printed = [int(line.split()[0]) for line in out.getvalue().splitlines()]
    assert printed == [1, 11, 15, 25]


def test_an_iteration_without_an_episode_shows_the_latest_return_carried_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import math
    import time

    from rich.console import Console

    from rl_app.console.progress import ProgressPrinter
    from rl_app.runs.progress import IterationMetrics

    seconds = [0]
    monkeypatch.setattr(time, "monotonic", lambda: seconds[0])
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=120, color_system=None), None, None)
    for i, returned in enumerate([math.nan, 20.0, math.nan, math.nan, 31.5], start=1):
        printer.iteration(IterationMetrics(i, 256 * i, 0, returned, 0, 0, 0, math.nan, 2560.0, 0.1, i))
        seconds[0] += 2  # slow iterations: each gets its line
    cells = [line[20:28] for line in out.getvalue().splitlines()]
    assert cells == ["     n/a", "    20.0", "~   20.0", "~   20.0", "    31.5"]
