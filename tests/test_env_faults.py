"""Faults inside a run: an env that raises now and then is recreated and training goes on, counted
in progress.csv and said on the console; one that fails every time stops the run with its own error."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import SMALL_PPO, local_ray
from rich.console import Console

from rl_app.cli import main
from rl_app.runs.checkpoints import latest_checkpoint, read_info
from rl_app.training.run import train

TESTS = Path(__file__).resolve().parent
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """Like conftest's, but env runner actors can import tests/faulty_env.py."""
    pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    with local_ray({"PYTHONPATH": pythonpath}):
        yield


FAULTY = """\
algorithm: PPO
env:
  id: faulty_env:CrashingCartPole
  config: {{crash: {crash}, after_steps: {after_steps}, marker_dir: "{markers}"}}
env_runners: {{num_env_runners: {runners}, num_envs_per_env_runner: 4}}
stop: {{iterations: 3}}
checkpoint: {{every: 1, keep: 2}}
"""


def progress_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "progress.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_an_env_failing_now_and_then_is_recreated_and_training_finishes(
    experiments: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (experiments / "flaky.yaml").write_text(
        FAULTY.format(crash="always", after_steps=150, markers=tmp_path, runners=0)
    )
    out = io.StringIO()
    summary = train("flaky", SMALL_PPO, runs_root=tmp_path, console=Console(file=out, width=200))

    assert summary.status == "finished" and summary.iterations == 3
    failures = [float(row["env_failures"]) for row in progress_rows(summary.run_dir)]
    assert failures[-1] > 0 and failures == sorted(failures)  # a lifetime count, in every row
    assert "env failure(s), envs recreated and their episodes dropped" in out.getvalue()
    assert "Traceback" not in capsys.readouterr().err  # RLlib's report of each failure went to rl_app.log
    assert "Environment step failed" in (summary.run_dir / "rl_app.log").read_text()
    assert int(float(progress_rows(summary.run_dir)[-1]["timesteps"])) >= 3 * 400  # the batches still filled


def test_an_env_failing_every_time_stops_the_run_with_its_own_error(
    experiments: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (experiments / "broken.yaml").write_text(
        FAULTY.format(crash="all_but_first", after_steps=1, markers=tmp_path, runners=0)
    )
    code = main(["train", "broken", "--runs-dir", str(tmp_path), *(f"--set={o}" for o in SMALL_PPO)])

    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "failed in step() 21 times in a row (RuntimeError: deliberate crash" in err
    assert "Traceback" not in err


def test_a_killed_env_runner_process_is_recreated_and_the_run_finishes(
    experiments: Path, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    (experiments / "killed.yaml").write_text(
        FAULTY.format(crash="kill_runner_once", after_steps=120, markers=markers, runners=1)
    )
    out = io.StringIO()
    overrides = [*SMALL_PPO, "stop.iterations=8"]  # Ray takes a few seconds to bring the runner back
    summary = train("killed", overrides, runs_root=tmp_path / "runs", console=Console(file=out, width=200))

    assert (markers / "killed").exists(), "the runner process was never killed"
    assert summary.status == "finished" and summary.iterations == 8
    restarts = [float(row["runner_restarts"]) for row in progress_rows(summary.run_dir)]
    assert restarts[-1] >= 1
    assert "crashed env runner(s) recreated" in out.getvalue()


@pytest.fixture
def ray_kill_runner_after(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[int]], None]:
    """``ray.kill`` a remote env runner's actor (restartable) after each of the given iterations,
    or after the first iteration following it at which a runner is up again."""
    import ray

    from rl_app.training.backends import AlgorithmBackend

    def arrange(iterations: list[int]) -> None:
        original, pending = AlgorithmBackend.train, sorted(iterations)

        def train(self: AlgorithmBackend, *args: Any) -> Any:
            metrics, result = original(self, *args)
            if pending and metrics.iteration >= pending[0]:
                handles = self.algo.env_runner_group.foreach_env_runner(
                    lambda runner: ray.get_runtime_context().current_actor, local_env_runner=False
                )
                if handles:
                    ray.kill(handles[0], no_restart=False)
                    pending.pop(0)
            return metrics, result

        monkeypatch.setattr(AlgorithmBackend, "train", train)

    return arrange


def test_a_runner_actor_killed_through_ray_is_recreated_and_the_run_finishes(
    experiments: Path, tmp_path: Path, ray_kill_runner_after: Callable[[list[int]], None]
) -> None:
    (experiments / "killed.yaml").write_text(
        FAULTY.format(crash="never", after_steps=1, markers=tmp_path, runners=1)
    )
    ray_kill_runner_after([2])
    out = io.StringIO()
    # Iterations while the runner is down sample nothing: a step budget waits for its return.
    overrides = [*SMALL_PPO, "stop.timesteps=3200", "stop.iterations=400"]
    summary = train("killed", overrides, runs_root=tmp_path / "runs", console=Console(file=out, width=200))

    assert summary.status == "finished" and summary.timesteps >= 3200
    rows = progress_rows(summary.run_dir)
    assert float(rows[-1]["runner_restarts"]) == 1
    assert int(float(rows[-1]["timesteps"])) > int(float(rows[2]["timesteps"]))  # sampling went on
    assert "1 crashed env runner(s) recreated" in out.getvalue()


def test_runners_crashing_past_max_restarts_stop_the_run_in_one_line_with_a_final_checkpoint(
    experiments: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ray_kill_runner_after: Callable[[list[int]], None],
) -> None:
    (experiments / "killed.yaml").write_text(
        FAULTY.format(crash="never", after_steps=1, markers=tmp_path, runners=1)
    )
    ray_kill_runner_after([2, 5])  # the first is restarted, the second is one more than allowed
    overrides = [*SMALL_PPO, "stop.iterations=400", "env_runners.max_restarts=1", "checkpoint.every=4"]
    code = main(["train", "killed", "--runs-dir", str(tmp_path), *(f"--set={o}" for o in overrides)])

    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "env runners crashed 2 times, more than env_runners.max_restarts=1 allows" in err
    assert "Traceback" not in err
    (run_dir,) = (tmp_path / "killed").iterdir()
    rows = progress_rows(run_dir)
    last = int(rows[-1]["iteration"])
    assert 5 <= last < 400  # it stopped, and not before the second crash
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    final = latest_checkpoint(run_dir)
    assert final is not None and read_info(final).iteration == last  # the final checkpoint, not iter 4


def test_a_killed_evaluation_runner_is_said_at_once_and_comes_back(
    experiments: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluation runners are watched as the training runners are: the loss is said in the
    iteration that found it, evaluation goes on without the runner, and it comes back."""
    import ray

    from rl_app.training.backends import AlgorithmBackend

    (experiments / "evaluated.yaml").write_text(
        FAULTY.format(crash="never", after_steps=1, markers=tmp_path, runners=0)
        + "evaluation: {interval: 1, episodes: 2, num_env_runners: 1}\n"
    )
    import rl_app.training.loop as loop_module

    original, killed, back, done = AlgorithmBackend.train, [], [], []

    def train_then_kill(self: AlgorithmBackend, *args: Any) -> Any:
        metrics, result = original(self, *args)
        if metrics.iteration == 2 and not killed:
            (handle,) = self.algo.eval_env_runner_group.foreach_env_runner(
                lambda runner: ray.get_runtime_context().current_actor, local_env_runner=False
            )
            ray.kill(handle, no_restart=False)
            killed.append(metrics.iteration)
        elif back and not math.isnan(metrics.eval_return_mean):
            done.append(metrics.iteration)  # evaluated again after the runner came back: enough
        if any("runner(s) back" in notice for notice in self.notices()):
            back.append(metrics.iteration)
        return metrics, result

    # The run ends once the runner came back and evaluated (at the latest after stop.time_s).
    real_stop_reason = loop_module.stop_reason
    monkeypatch.setattr(
        loop_module,
        "stop_reason",
        lambda *args: "evaluated after the runner came back" if done else real_stop_reason(*args),
    )
    monkeypatch.setattr(AlgorithmBackend, "train", train_then_kill)
    out = io.StringIO()
    # Ray takes seconds to start the runner again; iterations take a fraction of one.
    overrides = [*SMALL_PPO, "evaluation.interval=1", "stop.iterations=100000", "stop.time_s=40"]
    summary = train("evaluated", overrides, runs_root=tmp_path / "runs", console=Console(file=out, width=200))
    said = out.getvalue()
    assert killed == [2] and summary.status == "finished"
    lost = [line for line in said.splitlines() if "lost 1 evaluation runner(s)" in line]
    assert lost and "iteration 3:" in lost[0] and "evaluations are skipped until one comes back" in lost[0]
    back = next(line for line in said.splitlines() if "evaluation runner(s) back" in line)
    back_at = int(back.split("iteration ")[1].split(":")[0])
    evaluated = [
        int(float(r["iteration"])) for r in progress_rows(summary.run_dir) if r["eval_return_mean"] != ""
    ]
    assert any(i > back_at for i in evaluated), "no evaluation after the runner came back"
