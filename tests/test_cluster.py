"""Several Ray nodes on one machine: a head on 127.0.0.2 and two workers on 127.0.0.3 and 127.0.0.4
started with ``cluster up``/``join`` (token auth; Ray treats the addresses as other hosts, every
packet stays on loopback), then what a distributed run must survive: a worker node killed as a
spot preemption would kill it, jobs submitted back to back, a sweep that loses a node."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from rl_app.cluster.nodes import (
    ClusterState,
    _cluster_processes,
    cluster_down,
    cluster_join,
    cluster_up,
    free_port,
    listeners,
)
from rl_app.errors import UserError

pytestmark = [pytest.mark.ray, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[1]
HEAD = "127.0.0.2"
WORKERS = ("127.0.0.3", "127.0.0.4")


@dataclass
class Nodes:
    state_dir: Path
    head: ClusterState
    workers: dict[str, ClusterState]

    def rejoin(self, address: str) -> ClusterState:
        self.workers[address] = cluster_join(self.head.gcs_address, self.state_dir, bind=address, num_cpus=1)
        return self.workers[address]


def kill_node(state: ClusterState) -> int:
    """SIGKILL every process of a node at once, as a spot preemption takes the machine away."""
    processes = _cluster_processes(state.temp_dir)
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(processes, timeout=10)
    return len(processes)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """The head offers no CPU, so env runners, trials and jobs' work land on the two workers."""
    state_dir = tmp_path_factory.mktemp("cluster") / ".cluster"
    head = cluster_up(state_dir, port=free_port(HEAD), dashboard_port=free_port(HEAD), num_cpus=0, bind=HEAD)
    nodes = Nodes(state_dir, head, {})
    try:
        for address in WORKERS:
            nodes.rejoin(address)
        yield nodes
    finally:
        states = [head, *nodes.workers.values()]
        listening = {port for state in states for ports in listeners(state).values() for port in ports}
        cluster_down(state_dir)
        for state in states:
            assert _cluster_processes(state.temp_dir) == [], "cluster down left processes"
        assert not any(listeners(state) for state in states), listening


def rl_app_environment(**env: str) -> dict[str, str]:
    """This environment with the shipped experiments and no Ray address or token but ``env``'s."""
    environment = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments"), **env}
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS"):
        if name not in env:
            environment.pop(name, None)
    return environment


def rl_app(
    args: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rl_app ARGS`` in a fresh process (as a user runs it), from ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "rl_app", *args],
        cwd=cwd,
        env=rl_app_environment(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_rl_app(args: list[str], **popen: Any) -> subprocess.Popen[str]:
    """``rl_app ARGS`` started in a fresh process, left running."""
    command = [sys.executable, "-m", "rl_app", *args]
    return subprocess.Popen(command, env=rl_app_environment(), text=True, **popen)


def test_workers_join_a_bound_head_and_every_node_listens_where_it_says(nodes: Nodes, tmp_path: Path) -> None:
    script = (
        "import json, ray; ray.init(address='auto'); "
        "print(json.dumps(sorted((n['NodeManagerAddress'], n['Resources'].get('CPU', 0)) "
        "for n in ray.nodes() if n['Alive'])))"
    )
    environment = {
        **os.environ,
        "RAY_ADDRESS": nodes.head.gcs_address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": nodes.head.token_file,
    }
    listed = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(listed.stdout.strip().splitlines()[-1]) == [
        [HEAD, 0.0],
        [WORKERS[0], 1.0],
        [WORKERS[1], 1.0],
    ]
    for state in [nodes.head, *nodes.workers.values()]:
        found = listeners(state)
        # Each node listens on its own address, and (Ray's gRPC servers) on every interface:
        # never on another node's address, never on the machine's network address.
        assert set(found) <= {state.node_ip, "every interface", "127.0.0.1"}, found
        assert found.get("every interface"), found
    head = listeners(nodes.head)
    gcs_port = nodes.head.gcs_address.rsplit(":", 1)[1]
    dashboard_port = nodes.head.address.rsplit(":", 1)[1]
    assert any(p.startswith(f"{gcs_port} (GCS)") for p in head["every interface"]), head
    assert any(p.startswith(f"{dashboard_port} (dashboard") for p in head[HEAD]), head


def test_a_head_on_loopback_or_a_wrong_token_refuses_a_join_in_one_line(nodes: Nodes, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"listens on loopback only and takes no worker nodes"):
        cluster_join("127.0.0.1:6380", tmp_path, bind="127.0.0.5")
    with pytest.raises(UserError, match=r"give this node an address of its own"):
        cluster_join(nodes.head.gcs_address, tmp_path)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    began = time.monotonic()
    result = rl_app(
        ["cluster", "join", nodes.head.gcs_address, "--bind", "127.0.0.5", "--token-file", str(wrong)],
        cwd=tmp_path,
    )
    assert result.returncode == 2 and time.monotonic() - began < 10
    assert result.stderr.strip() == (
        f"rl_app: error: the Ray cluster at {nodes.head.gcs_address} refused the token from {wrong}"
    )
    assert not list(tmp_path.glob(".cluster/worker-*.json"))


@pytest.mark.parametrize("token", ["none", "wrong"])
def test_train_against_a_cluster_without_its_token_is_one_line_within_5_s(
    nodes: Nodes, tmp_path: Path, token: str
) -> None:
    env = {"RAY_AUTH_TOKEN": "not-the-token"} if token == "wrong" else {}
    began = time.monotonic()
    result = rl_app(["train", "ppo_cartpole", "--address", nodes.head.gcs_address], cwd=tmp_path, env=env)
    took = time.monotonic() - began
    assert result.returncode == 2, result.stderr
    expected = {
        "none": "requires a token and none was found (looked in --token-file, $RAY_AUTH_TOKEN",
        "wrong": "refused the token from $RAY_AUTH_TOKEN",
    }[token]
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
    assert took < 5, f"{took:.1f} s from the process's start"
    assert not (tmp_path / "runs").exists()


def runner_nodes(nodes: Nodes) -> list[str]:
    """The addresses of the nodes the live env runner actors are on, from Ray's state API."""
    import requests

    headers = {"Authorization": f"Bearer {Path(nodes.head.token_file).read_text().strip()}"}

    def listed(kind: str, **params: str) -> list[dict[str, str]]:
        answer = requests.get(
            f"{nodes.head.address}/api/v0/{kind}", params=params, headers=headers, timeout=30
        )
        answer.raise_for_status()
        return list(answer.json()["data"]["result"]["result"])

    address = {node["node_id"]: node["node_ip"] for node in listed("nodes")}
    runners = listed(
        "actors", filter_keys="class_name", filter_predicates="=", filter_values="BatchedEnvRunner"
    )
    return sorted(address[actor["node_id"]] for actor in runners if actor["state"] == "ALIVE")


def progress_rows(run_dir: Path) -> list[dict[str, str]]:
    path = run_dir / "progress.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def wait_for_rows(run_dir: Path, count: int, process: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(progress_rows(run_dir)) < count:
        assert process.poll() is None, f"the run ended early: {process.communicate()}"
        assert time.monotonic() < deadline, f"fewer than {count} iterations in {timeout} s"
        time.sleep(0.2)


def test_a_killed_worker_node_is_said_at_once_and_training_goes_on_at_the_survivors_rate(
    nodes: Nodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two env runners, one per worker node; the node of one is SIGKILLed mid-run (a spot
    preemption). Within one iteration the run says which runner it lost and where; the survivor
    samples at its own full rate meanwhile; when the node comes back the runner is recreated there;
    every iteration is in progress.csv once; the run finishes."""
    runs = tmp_path / "runs"
    command = [
        "train", "ppo_cartpole", "--address", nodes.head.gcs_address,
        "--token-file", nodes.head.token_file, "--runs-dir", str(runs),
        "--set", "env_runners.num_env_runners=2", "--set", "evaluation.interval=0",
        "--set", "stop.return=100000", "--set", "stop.timesteps=100000000",
        "--set", "training.lr=0.0003",
    ]  # fmt: skip
    process = start_rl_app(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not list(runs.glob("ppo_cartpole/*/progress.csv")):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.2)
        (run_dir,) = runs.glob("ppo_cartpole/*")
        wait_for_rows(run_dir, 15, process)
        assert runner_nodes(nodes) == list(WORKERS)  # one runner on each worker, none on the head
        healthy = len(progress_rows(run_dir))
        victim = nodes.workers[WORKERS[1]]
        assert kill_node(victim) > 0
        wait_for_rows(run_dir, healthy + 25, process)
        killed_at = healthy
        survivors = len(progress_rows(run_dir))
        nodes.rejoin(WORKERS[1])
        rows = progress_rows(run_dir)
        deadline = time.monotonic() + 180
        while float(rows[-1]["runners_alive"]) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "the lost runner never came back"
            time.sleep(0.5)
            rows = progress_rows(run_dir)
        back_at = len(rows)
        wait_for_rows(run_dir, back_at + 5, process)
    finally:
        process.send_signal(2)  # Ctrl-C: the run ends with its final checkpoint
        out, _ = process.communicate(timeout=120)
    rows = progress_rows(run_dir)
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1)), (
        "an iteration missing or twice"
    )
    alive = [float(r["runners_alive"]) for r in rows]
    assert alive[:killed_at] == [2.0] * killed_at
    lost = next(i for i, a in enumerate(alive) if a < 2)
    assert lost <= killed_at + 1, f"the loss was noticed {lost - killed_at} iterations after the kill"
    said = out.splitlines()
    first_back = next(i for i, line in enumerate(said) if "env runner(s) back" in line)
    lines = [line for line in said[:first_back] if "lost 1 env runner" in line]
    # Said before Ray's GCS declares the node dead (its heartbeats time out seconds later).
    assert len(lines) == 1 and f"on node {WORKERS[1]})" in lines[0], out
    assert "training goes on with 1 of 2" in lines[0]
    assert f"on node {WORKERS[1]}" in next(line for line in out.splitlines() if "env runner(s) back" in line)

    # The survivor's iterations: the same batch from one runner, so at most twice as long as with
    # two (scaled by the runner count), with half again for noise; no wait on the dead one.
    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    before = median([float(r["iteration_s"]) for r in rows[5:killed_at]])
    during = median([float(r["iteration_s"]) for r in rows[lost + 2 : min(survivors, back_at - 1)]])
    noticed_s = float(rows[lost]["elapsed_s"]) - float(rows[killed_at - 1]["elapsed_s"])
    with capsys.disabled():
        print(
            f"\nlost node noticed at iteration {lost + 1} (killed after {killed_at}), within "
            f"{noticed_s:.2f} s of training time; median iteration {before * 1000:.0f} ms with 2 runners, "
            f"{during * 1000:.0f} ms with 1 ({during / before:.2f}x)"
        )
    assert during <= 1.5 * 2 * before, (before, during)
    assert "interrupted" in out and (run_dir / "summary.json").is_file()


def test_twenty_jobs_in_a_row_all_start_and_succeed(nodes: Nodes, tmp_path: Path) -> None:
    """A job's driver imports torch and RLlib while it connects: nothing may race there (a job
    once failed on a partially initialized torch), so 20 submissions give 20 SUCCEEDED."""
    from rl_app.cluster.jobs import Connection, client, submit

    token = Path(nodes.head.token_file).read_text().strip()
    statuses = []
    for _ in range(20):
        job_id, status = submit(
            "ppo_cartpole",
            ["stop.iterations=1", "evaluation.interval=0", "training.train_batch_size_per_learner=256"],
            address=nodes.head.address,
            token_file=nodes.head.token_file,
            runs_dir=str(tmp_path / "runs"),
        )
        statuses.append(status)
        if status != "SUCCEEDED":
            jobs = client(Connection(nodes.head.address, {"Authorization": f"Bearer {token}"}))
            pytest.fail(f"job {len(statuses)} {status}: {jobs.get_job_logs(job_id)[-3000:]}")
    assert statuses == ["SUCCEEDED"] * 20
    assert len(list((tmp_path / "runs").glob("ppo_cartpole/*/summary.json"))) == 20


def test_a_sweep_over_two_nodes_finishes_every_trial_when_one_node_dies(nodes: Nodes, tmp_path: Path) -> None:
    """One trial per worker node; one node is killed while both run. Tune retries the lost trial
    from its last checkpoint on the node that is left; results.csv says where each trial ran."""
    for address in WORKERS:  # the previous tests may have left a node down
        if not listeners(nodes.workers[address]):
            nodes.rejoin(address)
    runs = tmp_path / "runs"
    command = [
        "sweep", "ppo_cartpole_sweep", "--address", nodes.head.gcs_address,
        "--token-file", nodes.head.token_file, "--runs-dir", str(runs),
        "--set", "sweep.num_samples=2", "--set", "sweep.stop.timesteps=40000",
        "--set", "checkpoint.every=1", "--set", "env_runners.num_env_runners=0",
    ]  # fmt: skip
    process = start_rl_app(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while len({p.parent for p in runs.glob("ppo_cartpole_sweep/*/*/checkpoint_*")}) < 2:  # both trials
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.5)
        kill_node(nodes.workers[WORKERS[1]])
        out, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out
    (results,) = runs.glob("ppo_cartpole_sweep/*/results.csv")
    with results.open(newline="") as handle:
        trials = list(csv.DictReader(handle))
    assert [t["status"] for t in trials] == ["finished", "finished"], trials
    ran_on = sorted(t["nodes"] for t in trials)
    assert ran_on[0] == WORKERS[0] and ran_on[1] == f"{WORKERS[1]} then {WORKERS[0]}", ran_on
    assert sorted(int(t["failures"]) for t in trials) == [0, 1]


def test_a_run_whose_head_dies_resumes_from_its_storage_on_a_new_head(nodes: Nodes, tmp_path: Path) -> None:
    """The head machine goes away with the driver on it (both SIGKILLed mid-run). The run's storage
    (a path every node reaches, as an S3 bucket would be) holds its checkpoints; on a new head,
    `train --resume STORAGE_RUN` continues from the newest one, redoing at most one interval.
    Last in this module: it takes the fixture's head down."""
    shared, every = tmp_path / "shared", 4
    command = [
        "train", "ppo_cartpole", "--address", nodes.head.gcs_address,
        "--token-file", nodes.head.token_file, "--runs-dir", str(tmp_path / "head-disk"),
        "--storage", str(shared), "--set", f"checkpoint.every={every}", "--set", "evaluation.interval=0",
        "--set", "stop.return=100000", "--set", "env_runners.num_env_runners=0",
    ]  # fmt: skip
    driver = start_rl_app(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while len(list(shared.glob("ppo_cartpole/*/checkpoints/iter_*/rl_app_checkpoint.json"))) < 2:
        assert driver.poll() is None, driver.communicate()[1]
        assert time.monotonic() < deadline, "no two checkpoints uploaded"
        time.sleep(0.2)
    driver.kill()
    kill_node(nodes.head)
    driver.wait(timeout=30)
    (run,) = shared.glob("ppo_cartpole/*")
    uploaded = max(int(p.name.split("_")[1]) for p in run.glob("checkpoints/iter_*") if p.name[5:].isdigit())
    reached = len(progress_rows(tmp_path / "head-disk" / "ppo_cartpole" / run.name))

    new_dir = tmp_path / "new-head"
    new_head = cluster_up(
        new_dir / ".cluster",
        port=free_port("127.0.0.5"),
        dashboard_port=free_port("127.0.0.5"),
        num_cpus=2,
        bind="127.0.0.5",
    )
    try:
        result = rl_app(
            ["train", "--resume", str(run), "--address", new_head.gcs_address, "--set", "stop.iterations=1"],
            cwd=new_dir,
            timeout=300,
        )
    finally:
        cluster_down(new_dir / ".cluster")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Resumed from iter_{uploaded:06d}" in result.stdout, result.stdout
    assert reached - uploaded <= every, (reached, uploaded)
