"""Ray Jobs: submit training or a sweep to a running cluster, and list, follow and stop jobs.

A thin layer over Ray's ``JobSubmissionClient``: it adds the cluster's auth token,
ships this package and the experiments as the job's ``working_dir`` (without runs,
environments and caches), and turns connection, token and version problems into
one-line errors.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from rl_app.cluster.nodes import DEFAULT_STATE_DIR, find_token, read_state
from rl_app.console.tables import Column, fitted_table, output_console
from rl_app.errors import UserError, first_line

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Never uploaded with a job: results, environments, caches, VCS, the local cluster's state.
WORKING_DIR_EXCLUDES = [
    "/runs/", ".venv/", ".conda-env/", ".git/", ".cluster/", "/bench/results/", "**/__pycache__/",
    "*.egg-info/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/",
]  # fmt: skip
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass(frozen=True)
class Connection:
    address: str
    headers: dict[str, str]


def connection(address: str | None, token_file: str | None) -> Connection:
    """Where to submit, with which token: flags, then the environment, then ``cluster up``'s cluster."""
    state = read_state(DEFAULT_STATE_DIR)
    address = (
        address or os.environ.get("RL_APP_JOBS_ADDRESS") or (state.address if state else DEFAULT_ADDRESS)
    )
    if "://" not in address:
        address = f"http://{address}"
    scheme = urlsplit(address).scheme
    if scheme not in ("http", "https"):
        raise UserError(f"job address '{address}': scheme must be http:// or https:// (the Ray dashboard)")
    token = find_token(address.rstrip("/"), token_file).value
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Connection(address.rstrip("/"), headers)


def _check_cluster(conn: Connection) -> None:
    """One request before anything is uploaded: reachable, token accepted, same Ray version."""
    import ray
    import requests

    try:
        response = requests.get(f"{conn.address}/api/version", headers=conn.headers, timeout=10)
    except requests.RequestException as exc:
        raise UserError(
            f"cannot reach the Ray dashboard at {conn.address}: {type(exc).__name__} "
            "(start a local cluster with `make cluster-up`, or pass --address http://HOST:8265)"
        ) from None
    if response.status_code in (401, 403):
        said = "no token was sent" if not conn.headers else "the token was refused"
        raise UserError(
            f"the cluster at {conn.address} requires token authentication and {said} "
            "(--token-file FILE, $RAY_AUTH_TOKEN or $RAY_AUTH_TOKEN_PATH)"
        )
    if response.status_code != 200:
        raise UserError(
            f"{conn.address} is not a Ray dashboard (GET /api/version: HTTP {response.status_code})"
        )
    cluster_version = response.json().get("ray_version")
    if cluster_version != ray.__version__:
        raise UserError(
            f"the cluster at {conn.address} runs Ray {cluster_version}, this machine Ray {ray.__version__}; "
            "jobs need the same version on both"
        )


def client(conn: Connection) -> Any:
    from ray.job_submission import JobSubmissionClient

    from rl_app.library_logs import capture_library_logs

    capture_library_logs()  # Ray's packaging and upload INFO lines are not for our users
    _check_cluster(conn)
    return JobSubmissionClient(conn.address, headers=conn.headers)


def project_root() -> Path:
    """The folder holding rl_app/ and experiments/: what a job's working_dir ships."""
    return Path(__file__).resolve().parents[2]


def entrypoint(
    experiment: str, overrides: list[str], sweep: bool, runs_dir: str | None, storage: str | None
) -> str:
    """The command the job runs on the cluster."""
    command = ["python", "-m", "rl_app", "sweep" if sweep else "train", experiment]
    for override in overrides:
        command += ["--set", override]
    if runs_dir:
        command += ["--runs-dir", runs_dir]
    if storage:
        command += ["--storage", storage]
    return shlex.join(command)


def submit(
    experiment: str,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    sweep: bool = False,
    address: str | None = None,
    token_file: str | None = None,
    runs_dir: str | None = None,
    storage: str | None = None,
    wait: bool = True,
    console: Console | None = None,
) -> tuple[str, str]:
    """Submit ``experiment`` as a Ray Job; with ``wait``, stream its logs. Returns (job id, status)."""
    from rl_app.config import load_experiment

    console = console or Console(highlight=False)
    loaded = load_experiment(experiment, overrides)  # bad input fails here, not on the cluster
    root = project_root()
    if not loaded.path.resolve().is_relative_to(root):
        raise UserError(
            f"{loaded.source}: a job ships {root} as its working_dir; put the experiment file "
            "inside it (experiments/ or any subfolder)"
        )
    if sweep and loaded.config.sweep is None:
        raise UserError(f"{loaded.source}: has no sweep section")
    conn = connection(address, token_file)
    jobs = client(conn)
    # The job's working_dir is a temporary copy; results go to a lasting place.
    runs_dir = runs_dir or (None if storage else str((Path.cwd() / "runs").resolve()))
    job_id = jobs.submit_job(
        # The file, relative to the working_dir: what this machine validated is what the job runs.
        entrypoint=entrypoint(
            str(loaded.path.resolve().relative_to(root)), list(overrides), sweep, runs_dir, storage
        ),
        runtime_env={
            "working_dir": str(root),
            "excludes": WORKING_DIR_EXCLUDES,
            "env_vars": {"RL_APP_EXPERIMENTS_DIR": "experiments", "RAY_USAGE_STATS_ENABLED": "0"},
        },
        metadata={"rl_app": "sweep" if sweep else "train", "experiment": loaded.name},
    )
    where = storage or f"{runs_dir} on the cluster's head node"
    console.print(f"Submitted job [bold]{job_id}[/bold] to {conn.address}; results: {where}")
    if not wait:
        console.print(f"Follow it: rl_app jobs logs {job_id} --follow")
        return job_id, str(jobs.get_job_status(job_id))
    return job_id, follow(jobs, job_id, console)


def follow(jobs: Any, job_id: str, console: Console, poll_s: float = 1.0) -> str:
    """Print the job's logs as they come until it ends; returns its final status."""
    printed = 0
    while True:
        status = str(jobs.get_job_status(job_id))
        logs = jobs.get_job_logs(job_id)
        if len(logs) > printed:
            console.out(logs[printed:], end="")
            printed = len(logs)
        if status in TERMINAL:
            console.print(f"Job {job_id} {status}{_reason(jobs.get_job_info(job_id))}")
            return status
        time.sleep(poll_s)


def _reason(info: Any) -> str:
    """Ray's job message, without the copy of the logs it appends on failure."""
    if not info.message:
        return ""
    return f": {first_line(Exception(info.message)).split(', last available logs')[0]}"


def _known(jobs: Any, job_id: str) -> Any:
    try:
        return jobs.get_job_info(job_id)
    except RuntimeError as exc:
        if "does not exist" in str(exc) or "404" in str(exc):
            raise UserError(f"no job '{job_id}' on this cluster (rl_app jobs list)") from None
        raise


JOB_COLUMNS = [
    Column("job"),
    Column("status"),
    Column("started", optional=True),
    Column("entrypoint", optional=True),
]


def list_jobs(
    address: str | None, token_file: str | None, console: Console | None = None, as_json: bool = False
) -> list[Any]:
    """Print the cluster's jobs, oldest first (``as_json``: one JSON list, for scripts)."""
    jobs = sorted(client(connection(address, token_file)).list_jobs(), key=lambda j: j.start_time or 0)
    listed = [
        {
            "job": job.submission_id or job.job_id or "?",
            "status": str(job.status),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((job.start_time or 0) / 1000)),
            "entrypoint": job.entrypoint,
        }
        for job in jobs
    ]
    if as_json:
        print(json.dumps(listed, indent=2))
        return jobs
    console = console or output_console()
    rows = [[str(job[column.name]) for column in JOB_COLUMNS] for job in listed]
    console.print(fitted_table("Jobs", JOB_COLUMNS, rows, console.width))
    return jobs


def job_status(job_id: str, address: str | None, token_file: str | None) -> str:
    info = _known(client(connection(address, token_file)), job_id)
    print(f"{job_id}: {info.status}{_reason(info)}")
    return str(info.status)


def job_logs(job_id: str, address: str | None, token_file: str | None, follow_logs: bool = False) -> str:
    jobs = client(connection(address, token_file))
    _known(jobs, job_id)
    if follow_logs:
        return follow(jobs, job_id, Console(highlight=False))
    logs = str(jobs.get_job_logs(job_id))
    print(logs, end="")
    return logs


def stop_job(job_id: str, address: str | None, token_file: str | None) -> bool:
    jobs = client(connection(address, token_file))
    _known(jobs, job_id)
    stopped = bool(jobs.stop_job(job_id))
    print(f"{job_id}: {'stop requested' if stopped else 'already finished'}")
    return stopped
