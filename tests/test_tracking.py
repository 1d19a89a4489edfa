"""MLflow tracking against a real `mlflow server` (SQLite store, proxied artifacts, loopback): a run
and its resume, a server killed mid-run and the catch-up, a sweep as a parent run with its trials."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer
from rich.console import Console

from rl_app.cluster.nodes import free_port
from rl_app.runs.progress import read_progress
from rl_app.sweep.run import run_sweep
from rl_app.tracking.run import track_run
from rl_app.training.run import train

pytestmark = pytest.mark.ray

TINY = """\
algorithm: PPO
env: CartPole-v1
training: {train_batch_size_per_learner: 500, minibatch_size: 125, num_epochs: 1}
model: {fcnet_hiddens: [16]}
env_runners: {num_envs_per_env_runner: 2}
stop: {iterations: 3}
checkpoint: {every: 1, keep: 2}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    started = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    try:
        yield started
    finally:
        started.kill()


def captured() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=200), text


def mlflow_run(run_dir: Path) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads((run_dir / "metadata.json").read_text())["mlflow"]
    return entry


def logged_steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def progress_steps(run_dir: Path) -> list[int]:
    return [int(row["timesteps"]) for row in read_progress(run_dir / "progress.csv")]


def test_a_run_logs_params_metrics_losses_and_files_and_its_resume_continues_it(
    ray_session: None, experiments: Path, tmp_path: Path, server: MlflowServer
) -> None:
    (experiments / "tiny.yaml").write_text(TINY)
    console, text = captured()
    runs = tmp_path / "runs"
    summary = train("tiny", runs_root=runs, track=True, tracking_uri=server.uri, console=console)
    assert summary.status == "finished", text.getvalue()
    run_dir = summary.run_dir
    recorded = mlflow_run(run_dir)
    assert recorded["uri"] == server.uri and recorded["experiment_name"] == "tiny"
    assert f"MLflow run {recorded['run_id']}" in text.getvalue()
    assert "warning" not in text.getvalue()

    client = MlflowClient(server.uri)
    run = client.get_run(recorded["run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == f"tiny/{run_dir.name}"
    params = run.data.params
    assert params["algorithm"] == "PPO" and params["env.id"] == "CartPole-v1"
    assert params["training.train_batch_size_per_learner"] == "500"
    assert params["model.fcnet_hiddens"] == "[16]"
    tags = run.data.tags
    assert tags["seed"] == "0" and tags["rl_app.run_dir"] == str(run_dir.resolve())
    assert tags["version.ray"] == "2.60.0" and tags["host"]
    # One point per iteration at its env steps, the same numbers as progress.csv.
    steps = progress_steps(run_dir)
    assert len(steps) == 3
    assert logged_steps(client, run.info.run_id, "return_mean") == steps
    rows = read_progress(run_dir / "progress.csv")
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "return_mean")}
    assert [history[s] for s in steps] == pytest.approx([row["return_mean"] for row in rows])
    losses = [key for key in run.data.metrics if key.startswith("learners/default_policy/")]
    assert any(key.endswith("/policy_loss") for key in losses), sorted(run.data.metrics)
    assert any(key.endswith("/vf_loss") for key in losses)
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"experiment.yaml", "summary.json", "progress.csv", "reward_curve.png"} <= files
    listed = subprocess.run(
        [sys.executable, "-m", "rl_app", "runs", "--runs-dir", str(runs), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(listed.stdout)[0]["mlflow_run_id"] == run.info.run_id

    resumed = train(None, ["stop.iterations=5"], resume=str(run_dir), runs_root=runs, console=captured()[0])
    assert resumed.status == "finished" and resumed.iterations == 5
    assert mlflow_run(run_dir)["run_id"] == run.info.run_id  # the same MLflow run goes on
    assert logged_steps(client, run.info.run_id, "return_mean") == progress_steps(run_dir)
    assert len(progress_steps(run_dir)) == 5
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_server_killed_mid_run_leaves_training_going_and_track_catches_up(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    (experiments / "tiny.yaml").write_text(TINY)
    server = MlflowServer(tmp_path / "mlflow").start()
    runs = tmp_path / "runs"
    killed_at: list[int] = []

    def kill_after_first_logged_iteration() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed_at:
            for meta in runs.glob("tiny/*/metadata.json"):
                progress = meta.parent / "progress.csv"
                if "mlflow" in json.loads(meta.read_text()) and progress.is_file():
                    done = len(read_progress(progress))
                    if done >= 1:
                        server.kill()
                        killed_at.append(done)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_after_first_logged_iteration, daemon=True)
    killer.start()
    console, text = captured()
    began = time.monotonic()
    try:
        summary = train(
            "tiny",
            ["stop.iterations=12"],
            runs_root=runs,
            track=True,
            tracking_uri=server.uri,
            console=console,
        )
        killer.join(5)
        output = text.getvalue()
        assert killed_at and killed_at[0] < 12, output
        assert summary.status == "finished" and summary.iterations == 12, output
        # One warning when the server went, one line at the end saying what was not logged.
        assert output.count("does not answer") == 1, output
        assert "not logged to MLflow" in output and f"rl_app track {summary.run_dir}" in output
        assert time.monotonic() - began < 120

        server.start()  # the same store and port: the server is back
        console, text = captured()
        assert track_run(summary.run_dir, None, console) == 0, text.getvalue()
        client = MlflowClient(server.uri)
        run = client.get_run(mlflow_run(summary.run_dir)["run_id"])
        assert logged_steps(client, run.info.run_id, "return_mean") == progress_steps(summary.run_dir)
        assert run.info.status == "FINISHED"
        files = {f.path for f in client.list_artifacts(run.info.run_id)}
        assert {"summary.json", "reward_curve.png"} <= files
    finally:
        server.kill()


def test_a_tracking_server_that_never_answers_costs_a_warning_not_the_run(
    ray_session: None, experiments: Path, tmp_path: Path
) -> None:
    (experiments / "tiny.yaml").write_text(TINY)
    console, text = captured()
    began = time.monotonic()
    summary = train(
        "tiny",
        runs_root=tmp_path / "runs",
        track=True,
        tracking_uri=f"http://127.0.0.1:{free_port()}",
        console=console,
    )
    output = text.getvalue()
    assert summary.status == "finished" and summary.iterations == 3, output
    assert output.count("does not answer") == 1
    assert "not logged to MLflow" in output and "3 iteration(s) of metrics" in output
    assert "mlflow" not in json.loads((summary.run_dir / "metadata.json").read_text())
    assert time.monotonic() - began < 90


def test_a_sweep_is_a_parent_run_with_a_child_run_per_trial(
    ray_session: None, experiments: Path, tmp_path: Path, server: MlflowServer
) -> None:
    (experiments / "swept.yaml").write_text(
        TINY.replace("stop: {iterations: 3}", "stop: {iterations: 2}")
        + "sweep:\n  num_samples: 1\n  space:\n    training.lr: {grid: [0.001, 0.0003]}\n"
    )
    console, text = captured()
    summary = run_sweep(
        "swept", runs_root=tmp_path / "runs", track=True, tracking_uri=server.uri, console=console
    )
    assert summary.status == "finished", text.getvalue()
    parent_id = json.loads((summary.sweep_dir / "sweep.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(server.uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.params["algorithm"] == "PPO"
    assert {"results.csv", "curves.png", "summary.json"} <= {f.path for f in client.list_artifacts(parent_id)}
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    assert len(children) == 2
    assert sorted(float(c.data.params["training.lr"]) for c in children) == [0.0003, 0.001]
    for child in children:
        assert child.info.status == "FINISHED"
        trial = next(t for t in summary.trials if t.trial.endswith(child.data.tags["rl_app.trial_id"]))
        steps = logged_steps(client, child.info.run_id, "return_mean")
        assert len(steps) == trial.iterations == 2
        assert math.isclose(child.data.metrics["return_mean"], trial.history[-1]["return_mean"])
