"""Ray nodes this machine runs for rl_app: a head (``cluster up``) and workers that join a head
(``cluster join``), Ray's token authentication on, each stopped by the processes it recorded
(``cluster down``, ``cluster leave``), never another Ray instance on the machine.

``cluster up`` listens on 127.0.0.1 by default, where Ray keeps every port on loopback and the
head takes no worker nodes. ``--bind ADDR`` makes a head that workers can join at ADDR. Ray 2.60
takes no bind address for its gRPC servers: the GCS, each raylet and each dashboard agent listen
on every interface unless the node's address is 127.0.0.1, guarded by the token; its other
listeners (dashboard, Jobs API, client server, agents' HTTP ports) take ADDR. ``up`` and ``join``
read the node's real listening sockets and say which port listens where.
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
    """What ``cluster up`` (or ``join``) wrote: where the node listens and which processes are its own."""

    address: str  # the head's Jobs API / dashboard (http://127.0.0.1:8265); a worker: its head's
    gcs_address: str  # the cluster's GCS: what `ray.init(address=...)` and workers use
    token_file: str
    temp_dir: str
    processes: list[tuple[int, float]]  # (pid, create_time): safe against reused pids
    role: str = "head"  # or "worker"
    node_ip: str = LOOPBACK  # the address this node's Ray goes by (--bind)


def state_file(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def worker_state_file(state_dir: Path, node_ip: str) -> Path:
    return state_dir / f"worker-{node_ip}.json"


def _read(path: Path) -> ClusterState | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    data["processes"] = [tuple(p) for p in data["processes"]]
    return ClusterState(**data)


def read_state(state_dir: Path) -> ClusterState | None:
    """The head ``cluster up`` started from ``state_dir``, if any."""
    return _read(state_file(state_dir))


def read_workers(state_dir: Path) -> list[ClusterState]:
    """The worker nodes ``cluster join`` started from ``state_dir``."""
    found = (_read(path) for path in sorted(state_dir.glob("worker-*.json")))
    return [state for state in found if state is not None]


@dataclass(frozen=True)
class Token:
    value: str | None
    source: str  # where it came from, for messages
    looked_in: str  # every place looked, for the message when there is none


def find_token(address: str | None, token_file: str | None, state_dir: Path = DEFAULT_STATE_DIR) -> Token:
    """The token for the cluster at ``address`` (its GCS, or its dashboard URL): ``token_file``,
    else $RAY_AUTH_TOKEN, else $RAY_AUTH_TOKEN_PATH, else the token of the head ``cluster up``
    started from ``state_dir`` (or a head joined from there) when ``address`` is that head's."""
    places = "--token-file, $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, " + str(state_dir / "auth_token")
    if token_file:
        return Token(read_token(token_file), token_file, places)
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return Token(os.environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN", places)
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        path = os.environ["RAY_AUTH_TOKEN_PATH"]
        return Token(read_token(path), f"$RAY_AUTH_TOKEN_PATH ({path})", places)
    for state in [read_state(state_dir), *read_workers(state_dir)]:
        if state is not None and address in (None, state.gcs_address, state.address):
            return Token(read_token(state.token_file), state.token_file, places)
    return Token(None, "", places)


def split_address(address: str, default_port: int = 6380) -> tuple[str, int]:
    """``host[:port]`` of a GCS address (a ``ray://`` or ``http://`` prefix is not one)."""
    host, _, port = address.rpartition(":") if ":" in address else (address, "", str(default_port))
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"Ray address '{address}': expected HOST:PORT of the head's GCS (e.g. 127.0.0.2:6380)"
        )
    return host, int(port)


def check_gcs(gcs_address: str, token: Token, timeout_s: float = 5.0) -> None:
    """Fail in seconds, in one line, when the GCS at ``gcs_address`` cannot be reached or refuses
    the token."""
    import socket

    from rl_app.ray_adapter import probe_gcs

    host, port = split_address(gcs_address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UserError(
            f"cannot reach Ray's GCS at {host}:{port} ({exc.strerror or type(exc).__name__}); "
            "is the head up (rl_app cluster up --bind ADDR), and is this its address and GCS port?"
        ) from None
    answer = probe_gcs(f"{host}:{port}", token.value, timeout_s)
    if answer == "refused":
        if token.value is None:
            raise UserError(
                f"the Ray cluster at {host}:{port} requires a token and none was found "
                f"(looked in {token.looked_in})"
            )
        raise UserError(f"the Ray cluster at {host}:{port} refused the token from {token.source}")
    if answer == "silent":
        raise UserError(f"{host}:{port} answers but is not a Ray GCS (no answer within {timeout_s:g} s)")


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


# Ray's listeners by process, for the start-up report.
LISTENER_NAMES = (
    ("gcs_server", "GCS"),
    ("raylet", "raylet"),
    ("DashboardAgent", "dashboard agent"),
    ("RuntimeEnvAgent", "runtime env agent"),
    ("dashboard.py", "dashboard and Jobs API"),
    ("ray.util.client.server", "client server (ray://)"),
)
EVERY_INTERFACE = ("0.0.0.0", "::", "*")


def _listener_name(process: Any) -> str:
    import psutil

    try:
        described = " ".join([process.name(), *process.cmdline()])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
    return next((name for key, name in LISTENER_NAMES if key in described), process.name())


def listeners(state: ClusterState) -> dict[str, list[str]]:
    """The node's listening sockets, by where they listen: its own address, loopback, or every
    interface; each as ``port (what)``, read from the node's processes."""
    import psutil

    processes = {
        p.pid: p
        for p in _cluster_processes(state.temp_dir, state.gcs_address if state.role == "head" else None)
    }
    found: dict[str, list[str]] = {}
    for connection in psutil.net_connections("tcp"):
        if connection.status != psutil.CONN_LISTEN or connection.pid not in processes:
            continue
        ip = connection.laddr.ip.removeprefix("::ffff:")
        where = "every interface" if ip in EVERY_INTERFACE else ip
        found.setdefault(where, []).append(
            f"{connection.laddr.port} ({_listener_name(processes[connection.pid])})"
        )
    return {where: sorted(set(ports), key=lambda p: int(p.split()[0])) for where, ports in found.items()}


def describe_listeners(state: ClusterState) -> str:
    """One line per address the node listens on, and why some listen on every interface."""
    found = listeners(state)
    lines = [f"  on {where}: {', '.join(ports)}" for where, ports in sorted(found.items())]
    if "every interface" in found:
        lines.append(
            "  Ray 2.60's GCS, raylet and dashboard agent take no bind address: unless a node's "
            "address is 127.0.0.1 they listen on every interface, guarded by the token."
        )
    return "\n".join(lines)


def _ray_env(token_file: Path, cluster: bool) -> dict[str, str]:
    """``ray start``'s environment: this one's, with the node's token file its only token."""
    return {
        **{k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"},
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Jobs run `python ...` on the cluster: make that this environment's Python.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        # "0" keeps every Ray port on loopback and makes Ray refuse worker nodes.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1" if cluster else "0",
    }


def _ray_start(command: list[str], env: dict[str, str], temp_dir: str, gcs_address: str | None) -> list[Any]:
    """Run ``ray start``; its processes, or (stopping what it started) a one-line error."""
    ray = str(Path(sys.executable).with_name("ray"))
    result = subprocess.run([ray, "start", *command], env=env, capture_output=True, text=True, timeout=180)
    processes = _cluster_processes(temp_dir, gcs_address)
    if result.returncode != 0:
        _stop(processes)
        shutil.rmtree(temp_dir, ignore_errors=True)
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        raise UserError(f"ray start failed: {lines[-1] if lines else result.returncode}")
    return processes


def cluster_up(
    state_dir: Path = DEFAULT_STATE_DIR,
    *,
    port: int = 6380,
    dashboard_port: int = 8265,
    num_cpus: int | None = None,
    bind: str = LOOPBACK,
) -> ClusterState:
    """Start a Ray head node with token auth; ``bind`` other than 127.0.0.1 makes a head that
    worker nodes can join (and that listens beyond loopback: see the module docstring)."""
    existing = read_state(state_dir)
    if existing is not None and _alive(existing):
        raise UserError(f"a cluster is already running at {existing.address} (rl_app cluster down first)")
    state_dir.mkdir(parents=True, exist_ok=True)
    token_file = (state_dir / "auth_token").resolve()
    write_private(token_file, secrets.token_hex(32) + "\n")
    # Short and unique: Ray puts unix sockets under it (107-character limit).
    temp_dir = tempfile.mkdtemp(prefix="rl_app-ray-")
    command = [
        "--head", f"--node-ip-address={bind}", f"--port={port}",
        f"--dashboard-host={bind}", f"--dashboard-port={dashboard_port}",
        # Ray's fixed default (52365) collides with any other Ray on the machine.
        f"--dashboard-agent-listen-port={free_port(bind)}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
        *([f"--num-cpus={num_cpus}"] if num_cpus is not None else []),
    ]  # fmt: skip
    processes = _ray_start(command, _ray_env(token_file, bind != LOOPBACK), temp_dir, f"{bind}:{port}")
    state = ClusterState(
        address=f"http://{bind}:{dashboard_port}",
        gcs_address=f"{bind}:{port}",
        token_file=str(token_file),
        temp_dir=temp_dir,
        processes=[(p.pid, p.create_time()) for p in processes],
        role="head",
        node_ip=bind,
    )
    state_file(state_dir).write_text(json.dumps(asdict(state), indent=2) + "\n")
    return state


def cluster_join(
    head: str,
    state_dir: Path = DEFAULT_STATE_DIR,
    *,
    bind: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    resources: dict[str, float] | None = None,
    token_file: str | None = None,
) -> ClusterState:
    """Start a worker node of the cluster whose GCS is at ``head`` (``HOST[:PORT]``), with the
    cluster's token, listening as ``bind``; recorded in ``state_dir`` like a head."""
    host, port = split_address(head)
    gcs_address = f"{host}:{port}"
    if host in (LOOPBACK, "localhost"):
        raise UserError(
            f"the head at {gcs_address} listens on loopback only and takes no worker nodes: start it with "
            "`rl_app cluster up --bind ADDR` (an address the workers reach; on one machine 127.0.0.2)"
        )
    if bind is None and host.startswith("127."):
        raise UserError(
            f"the head is at loopback address {host}: give this node an address of its own "
            "(--bind 127.0.0.3, say)"
        )
    if bind is not None and bind == host:
        raise UserError(f"--bind {bind} is the head's address: a worker node needs its own")
    existing = _read(worker_state_file(state_dir, bind or "auto"))
    if existing is not None and _alive(existing):
        raise UserError(
            f"a worker node at {bind} already runs from here (rl_app cluster leave --bind {bind})"
        )
    token = find_token(gcs_address, token_file, state_dir)
    check_gcs(gcs_address, token)
    assert token.value is not None  # check_gcs refuses a cluster that wants one when there is none
    state_dir.mkdir(parents=True, exist_ok=True)
    node_token_file = (state_dir / f"token-{bind or 'auto'}").resolve()
    write_private(node_token_file, token.value + "\n")
    temp_dir = tempfile.mkdtemp(prefix="rl_app-ray-")
    command = [
        f"--address={gcs_address}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
        *([f"--node-ip-address={bind}"] if bind else []),
        f"--dashboard-agent-listen-port={free_port(bind or LOOPBACK)}",
        *([f"--num-cpus={num_cpus}"] if num_cpus is not None else []),
        *([f"--num-gpus={num_gpus}"] if num_gpus is not None else []),
        *([f"--resources={json.dumps(resources)}"] if resources else []),
    ]  # fmt: skip
    processes = _ray_start(command, _ray_env(node_token_file, True), temp_dir, None)
    state = ClusterState(
        address=gcs_address,
        gcs_address=gcs_address,
        token_file=str(node_token_file),
        temp_dir=temp_dir,
        processes=[(p.pid, p.create_time()) for p in processes],
        role="worker",
        node_ip=bind or "auto",
    )
    worker_state_file(state_dir, state.node_ip).write_text(json.dumps(asdict(state), indent=2) + "\n")
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


def _stop_node(state: ClusterState) -> int:
    """Stop one node's processes (those recorded and their children), remove its temp folder."""
    import psutil

    gcs_address = state.gcs_address if state.role == "head" else None
    processes = {p.pid: p for p in _cluster_processes(state.temp_dir, gcs_address)}
    for pid, created in state.processes:
        try:
            process = psutil.Process(pid)
            if process.create_time() == created:
                processes.setdefault(pid, process)
        except psutil.NoSuchProcess:
            continue
    stopped = _stop(list(processes.values()))
    shutil.rmtree(state.temp_dir, ignore_errors=True)
    return stopped


def cluster_leave(state_dir: Path = DEFAULT_STATE_DIR, bind: str | None = None) -> int:
    """Stop the worker nodes joined from ``state_dir`` (only the one at ``bind``, if given)."""
    workers = [w for w in read_workers(state_dir) if bind is None or w.node_ip == bind]
    if not workers:
        which = f" at {bind}" if bind else ""
        raise UserError(f"no worker node{which} was joined from here (no {state_dir}/worker-*.json)")
    stopped = 0
    for worker in workers:
        stopped += _stop_node(worker)
        worker_state_file(state_dir, worker.node_ip).unlink()
        Path(worker.token_file).unlink(missing_ok=True)
    return stopped


def cluster_down(state_dir: Path = DEFAULT_STATE_DIR) -> int:
    """Stop the worker nodes joined from ``state_dir``, then the head ``cluster up`` started there;
    returns how many processes were stopped."""
    state = read_state(state_dir)
    if state is None and not read_workers(state_dir):
        raise UserError(f"no cluster was started from here (no {state_file(state_dir)})")
    stopped = cluster_leave(state_dir) if read_workers(state_dir) else 0
    if state is not None:
        stopped += _stop_node(state)
        state_file(state_dir).unlink()
    return stopped
