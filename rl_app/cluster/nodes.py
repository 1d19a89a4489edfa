"""A local Ray head node to try cluster features on one machine: loopback only, token auth on.

``rl_app cluster up`` runs ``ray start --head`` with every port on 127.0.0.1 and Ray's
token authentication (``RAY_AUTH_MODE=token``) using a fresh token in a file only the
user can read. It records the processes it started, and ``rl_app cluster down`` stops
exactly those (and their children), never other Ray instances on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_app.errors import UserError

DEFAULT_STATE_DIR = Path(".cluster")
LOOPBACK = "127.0.0.1"


@dataclass
class ClusterState:
    """What ``cluster up`` wrote: where the cluster listens and which processes are its own."""

    address: str  # the Jobs API / dashboard: http://127.0.0.1:8265
    gcs_address: str  # what `ray.init(address=...)` and workers use
    token_file: str
    temp_dir: str
    processes: list[tuple[int, float]]  # (pid, create_time): safe against reused pids


def state_file(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def read_state(state_dir: Path) -> ClusterState | None:
    try:
        data = json.loads(state_file(state_dir).read_text())
    except (OSError, ValueError):
        return None
    data["processes"] = [tuple(p) for p in data["processes"]]
    return ClusterState(**data)


def read_token(token_file: Path | str) -> str:
    """The token of ``token_file``; a missing or empty file is a user error."""
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise UserError(f"cannot read the cluster token '{token_file}' ({exc.strerror or exc})") from None
    if not token:
        raise UserError(f"cluster token file '{token_file}' is empty")
    return token


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file created readable and writable by the user only (0600)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _is_cluster_root(command_line: str, temp_dir: str, gcs_address: str | None) -> bool:
    """Ray's daemons name the head's temp folder; its client server (``ray://``, started by
    ``ray start`` and then left to init) names only the head's GCS address."""
    if temp_dir in command_line:
        return True
    return (
        gcs_address is not None
        and "ray.util.client.server" in command_line
        and f"--address={gcs_address}" in command_line.split()
    )


def _cluster_processes(temp_dir: str, gcs_address: str | None = None) -> list[Any]:
    """Ray's daemons for ``temp_dir`` (and the client server of ``gcs_address``) and all their children.

    Children must be found through the daemons: workers and agents rename themselves
    (``ray::IDLE``), so their command lines no longer mention the folder.
    """
    import psutil

    roots = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if _is_cluster_root(" ".join(process.info["cmdline"] or []), temp_dir, gcs_address):
                roots.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    found = {p.pid: p for p in roots}
    for root in roots:
        try:
            found.update({c.pid: c for c in root.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def listening_addresses(state: ClusterState) -> list[str]:
    """Every TCP address the cluster's processes listen on (to check they are all loopback)."""
    import psutil

    pids = {p.pid for p in _cluster_processes(state.temp_dir, state.gcs_address)}
    return sorted(
        f"{c.laddr.ip}:{c.laddr.port}"
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    )


def cluster_up(
    state_dir: Path = DEFAULT_STATE_DIR,
    *,
    port: int = 6380,
    dashboard_port: int = 8265,
    num_cpus: int | None = None,
    bind: str = LOOPBACK,
) -> ClusterState:
    """Start a Ray head node with token auth; ``bind`` other than 127.0.0.1 exposes it to the network."""
    existing = read_state(state_dir)
    if existing is not None and _alive(existing):
        raise UserError(f"a cluster is already running at {existing.address} (rl_app cluster down first)")
    state_dir.mkdir(parents=True, exist_ok=True)
    token_file = (state_dir / "auth_token").resolve()
    write_private(token_file, secrets.token_hex(32) + "\n")
    # Short and unique: Ray puts unix sockets under it (107-character limit).
    temp_dir = tempfile.mkdtemp(prefix="rl_app-ray-")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Jobs run `python ...` on the cluster: make that this environment's Python.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        # "0" keeps every Ray port (GCS, raylet, agents, object manager) on loopback.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0" if bind == LOOPBACK else "1",
    }
    command = [
        str(Path(sys.executable).with_name("ray")), "start", "--head",
        f"--node-ip-address={bind}", f"--port={port}",
        f"--dashboard-host={bind}", f"--dashboard-port={dashboard_port}",
        # Ray's fixed default (52365) collides with any other Ray on the machine.
        f"--dashboard-agent-listen-port={free_port(bind)}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
        *([f"--num-cpus={num_cpus}"] if num_cpus else []),
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    processes = _cluster_processes(temp_dir, f"{bind}:{port}")
    if result.returncode != 0:
        _stop(processes)
        shutil.rmtree(temp_dir, ignore_errors=True)
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        raise UserError(f"ray start failed: {lines[-1] if lines else result.returncode}")
    state = ClusterState(
        address=f"http://{bind}:{dashboard_port}",
        gcs_address=f"{bind}:{port}",
        token_file=str(token_file),
        temp_dir=temp_dir,
        processes=[(p.pid, p.create_time()) for p in processes],
    )
    state_file(state_dir).write_text(json.dumps(asdict(state), indent=2) + "\n")
    return state


def _alive(state: ClusterState) -> bool:
    import psutil

    for pid, created in state.processes:
        try:
            if psutil.Process(pid).create_time() == created:
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def _running(processes: list[Any]) -> list[Any]:
    """Those still running; a zombie has exited (whoever inherited it may never reap it)."""
    import psutil

    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


def _is_gcs(process: Any) -> bool:
    import psutil

    try:
        return "gcs_server" in process.name()
    except psutil.NoSuchProcess:
        return False


def _stop(processes: list[Any], grace_s: float = 10.0) -> int:
    """SIGTERM, then SIGKILL what is still running after ``grace_s``; returns as soon as all are gone.

    The GCS goes last: the raylet and the agents shut down in well under a second while it is
    up, but wait out any grace period without it (10 s here)."""
    gcs = [p for p in processes if _is_gcs(p)]
    _terminate([p for p in processes if p not in gcs], grace_s)
    _terminate(gcs, grace_s)
    return len(processes)


def _terminate(processes: list[Any], grace_s: float) -> None:
    import psutil

    for process in processes:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + grace_s
    while _running(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in _running(processes):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + 5
    while _running(processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def cluster_down(state_dir: Path = DEFAULT_STATE_DIR) -> int:
    """Stop the processes ``cluster_up`` started (and theirs); returns how many were stopped."""
    import psutil

    state = read_state(state_dir)
    if state is None:
        raise UserError(f"no cluster was started from here (no {state_file(state_dir)})")
    processes = {p.pid: p for p in _cluster_processes(state.temp_dir, state.gcs_address)}
    for pid, created in state.processes:
        try:
            process = psutil.Process(pid)
            if process.create_time() == created:
                processes.setdefault(pid, process)
        except psutil.NoSuchProcess:
            continue
    stopped = _stop(list(processes.values()))
    shutil.rmtree(state.temp_dir, ignore_errors=True)
    state_file(state_dir).unlink()
    return stopped
