"""Ray Jobs on a local head node started (and stopped, by pid) by the test: token auth, loopback only."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SMALL_PPO

from rl_app.cli import main
from rl_app.cluster.jobs import Connection, client, submit
from rl_app.cluster.nodes import ClusterState, cluster_down, cluster_up, free_port, listeners

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    state_dir = tmp_path_factory.mktemp("cluster")
    import psutil

    state = cluster_up(state_dir, port=free_port(), dashboard_port=free_port(), num_cpus=2)
    try:
        yield state
    finally:
        listening = {
            f"{where}:{port.split()[0]}" for where, ports in listeners(state).items() for port in ports
        }
        started = time.monotonic()
        cluster_down(state_dir)
        took = time.monotonic() - started
        from rl_app.cluster.nodes import _cluster_processes

        assert _cluster_processes(state.temp_dir, state.gcs_address) == [], "cluster down left processes"
        still = {
            f"{c.laddr.ip.removeprefix('::ffff:')}:{c.laddr.port}"
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert not listening & still, f"still listening after cluster down: {listening & still}"
        assert took < 5, f"cluster down took {took:.1f} s: some process waited out the grace period"


@pytest.fixture
def shipped_experiments(monkeypatch: pytest.MonkeyPatch, shipped: Path) -> Path:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    return shipped


def job_ids(state: ClusterState) -> set[str]:
    from ray.job_submission import JobSubmissionClient

    token = Path(state.token_file).read_text().strip()
    jobs = JobSubmissionClient(state.address, headers={"Authorization": f"Bearer {token}"})
    return {job.submission_id for job in jobs.list_jobs()}


def test_cluster_listens_on_loopback_only_and_its_token_is_private(cluster: ClusterState) -> None:
    # Ray's client server (ray://, port 10001) is the head's too, though it names only the GCS
    # address; it binds a moment after `ray start` returns.
    deadline = time.monotonic() + 30
    found = listeners(cluster)
    while not any(p.startswith("10001 ") for ports in found.values() for p in ports):
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
        found = listeners(cluster)
    assert set(found) == {"127.0.0.1"}, found  # nothing on every interface, nothing elsewhere
    assert stat.S_IMODE(os.stat(cluster.token_file).st_mode) == 0o600


def test_submitted_training_succeeds_and_writes_a_checkpoint(
    cluster: ClusterState, shipped_experiments: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    job_id, status = submit(
        "ppo_cartpole",
        [*SMALL_PPO, "stop.iterations=2"],
        address=cluster.address,
        token_file=cluster.token_file,
        runs_dir=str(runs),
    )
    assert status == "SUCCEEDED", job_id
    assert "packaging" not in capfd.readouterr().err  # Ray's upload INFO lines are not for users
    checkpoints = list(runs.glob("ppo_cartpole/*/checkpoints/iter_000002/rl_app_checkpoint.json"))
    assert len(checkpoints) == 1


def test_failing_job_is_reported_failed_with_its_error(
    cluster: ClusterState, shipped_experiments: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Valid here; only the cluster (2 CPUs) can tell that 5 env runners do not fit on it.
    argv = ["submit", "ppo_cartpole", "--set", "env_runners.num_env_runners=5"]
    target = ["--address", cluster.address, "--token-file", cluster.token_file]
    assert main([*argv, *target, "--runs-dir", str(tmp_path / "runs")]) == 1
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "rl_app: error: 5 env runners + 0 evaluation runners + 0 learners needs 5 CPUs, but 2" in out
    assert "FAILED: Job entrypoint command failed with exit code 2" in out
    assert not (tmp_path / "runs").exists()


def test_a_running_job_is_listed_and_can_be_stopped(
    cluster: ClusterState, shipped_experiments: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id, _ = submit(
        "ppo_cartpole",
        [*SMALL_PPO, "stop.iterations=100000"],
        address=cluster.address,
        token_file=cluster.token_file,
        runs_dir=str(tmp_path / "runs"),
        wait=False,
    )
    base = ["--address", cluster.address, "--token-file", cluster.token_file]
    jobs = client(
        Connection(
            cluster.address, {"Authorization": f"Bearer {Path(cluster.token_file).read_text().strip()}"}
        )
    )
    deadline = time.monotonic() + 120
    while str(jobs.get_job_status(job_id)) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    capsys.readouterr()
    assert main(["jobs", "list", "--json", *base]) == 0  # ids whole, for scripts
    listed = {job["job"]: job for job in json.loads(capsys.readouterr().out)}
    assert listed[job_id]["entrypoint"].startswith("python -m rl_app train")
    assert main(["jobs", "list", *base]) == 0
    assert job_id in capsys.readouterr().out  # the table never cuts an id, whatever the width
    assert main(["jobs", "stop", job_id, *base]) == 0
    while str(jobs.get_job_status(job_id)) not in ("STOPPED", "FAILED") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert str(jobs.get_job_status(job_id)) == "STOPPED"


def test_jobs_find_the_token_where_train_does(
    cluster: ClusterState, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """$RAY_AUTH_TOKEN_PATH, as `train --address` reads it (the cluster's own state is elsewhere)."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", cluster.token_file)
    assert main(["jobs", "list", "--address", cluster.address]) == 0, capsys.readouterr().err
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    assert main(["jobs", "list", "--address", cluster.address]) == 2
    assert "no token was sent" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no token", "requires token authentication and no token was sent"),
        ("wrong token", "requires token authentication and the token was refused"),
        ("unknown job", "no job 'raysubmit_nope' on this cluster"),
        ("other ray version", "runs Ray 2.60.0, this machine Ray 2.59.0"),
        ("unreachable", "cannot reach the Ray dashboard at http://127.0.0.1:9"),
        ("unreachable", "start a local cluster with `make cluster-up`, or pass --address"),
        ("wrong scheme", "scheme must be http:// or https://"),
    ],
)
def test_bad_cluster_inputs_are_one_line_exit_2_and_start_nothing(
    case: str,
    message: str,
    cluster: ClusterState,
    shipped_experiments: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong = tmp_path / "wrong_token"
    wrong.write_text("not-the-token\n")
    target = {
        "no token": ["--address", cluster.address],
        "wrong token": ["--address", cluster.address, "--token-file", str(wrong)],
        "other ray version": ["--address", cluster.address, "--token-file", cluster.token_file],
        "unreachable": ["--address", "http://127.0.0.1:9", "--token-file", cluster.token_file],
        "wrong scheme": ["--address", "ray://127.0.0.1:10001", "--token-file", cluster.token_file],
    }
    if case == "other ray version":
        monkeypatch.setattr("ray.__version__", "2.59.0")
    before = job_ids(cluster)
    if case == "unknown job":
        argv = [
            "jobs",
            "status",
            "raysubmit_nope",
            "--address",
            cluster.address,
            "--token-file",
            cluster.token_file,
        ]
    else:
        argv = ["submit", "ppo_cartpole", *target[case], "--runs-dir", str(tmp_path / "runs")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rl_app: error: "), err
    assert message in err, err
    assert job_ids(cluster) == before, "a refused submission must not start a job"
    assert not (tmp_path / "runs").exists()


def test_sweep_entrypoint_and_working_dir_excludes() -> None:
    from rl_app.cluster.jobs import WORKING_DIR_EXCLUDES, entrypoint

    command = entrypoint(
        "experiments/ppo_cartpole_sweep.yaml", ["sweep.num_samples=2"], True, None, "s3://b/p"
    )
    assert command == (
        "python -m rl_app sweep experiments/ppo_cartpole_sweep.yaml --set sweep.num_samples=2 --storage s3://b/p"
    )
    assert {"/runs/", ".venv/", ".git/", ".cluster/"} <= set(WORKING_DIR_EXCLUDES)
    # Ray matches them like .gitignore lines: the run folders stay home, the rl_app.runs package goes.
    from ray._private.runtime_env.packaging import _get_excludes

    root = Path(__file__).resolve().parents[1]
    excluded = _get_excludes(root, WORKING_DIR_EXCLUDES)
    assert excluded(root / "runs" / "ppo_cartpole" / "progress.csv")
    assert not excluded(root / "rl_app" / "runs" / "remote.py")
    assert not excluded(root / "rl_app" / "runs")
