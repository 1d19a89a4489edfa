"""`rl_app serve` against slow, stuck and many clients, over real loopback sockets: SIGTERM ends it
within its bound whatever clients do, stalled requests get 408 and give their descriptors back
(counted in /proc), connections past the limit get 503 while health checks still pass, and JSON
nested or sized past any real request is a 4xx before it is parsed."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_client import Server, act, request, serving

from rl_app.policy.export import export_policy
from rl_app.serve.connections import ConnectionLimits
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
OBSERVATION = [[0.01, 0.02, 0.03, 0.04]]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tabular CartPole policy as ONNX: the server's behaviour here does not depend on the model,
    and this one trains in seconds without Ray."""
    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    root = tmp_path_factory.mktemp("runs")
    settings = ["training.steps_per_iteration=2000", "stop.iterations=1", "evaluation.interval=0"]
    run_dir = train("qlearning_cartpole", settings, runs_root=root).run_dir
    export_policy(str(run_dir), "onnx", run_dir / "export")
    return run_dir / "export"


@pytest.fixture(scope="module", autouse=True)
def many_descriptors() -> Iterator[None]:
    """Room in this process for a few thousand client sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 5000:
        pytest.skip(f"the open-file hard limit is {hard}; these tests hold over 2,000 sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 5000), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_descriptors(pid: int) -> int:
    """The server's open descriptors once connections it is still closing are gone."""
    count, deadline = open_descriptors(pid), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (now := open_descriptors(pid)) == count:
            break
        count = now
    return count


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def half_sent_request(port: int, body_bytes: int | None) -> socket.socket:
    """A connection that sent part of a request: the headers cut short (``body_bytes`` None), or the
    headers of a 100,000-byte body and ``body_bytes`` of it."""
    sock = connect(port)
    if body_bytes is None:
        sock.sendall(b"POST /v1/act HTTP/1.1\r\nHost: test\r\nContent-Ty")
    else:
        head = b"POST /v1/act HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b"Content-Length: 100000\r\n\r\n" + b'{"observations": [['[:body_bytes])
    return sock


def status_of(sock: socket.socket) -> int | None:
    """The status the server answered on ``sock``, or None when it closed without one."""
    try:
        data = sock.recv(4096)
    except ConnectionResetError:
        return None
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", data)
    return int(match.group(1)) if match else None


def metric(port: int, series: str) -> float:
    """One sample of the server's /metrics (0 when the series has none yet)."""
    text = request(port, "GET", "/metrics").text
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def sigterm_with_a_request_in_flight(server: Server) -> tuple[list[int], int, float, str]:
    """SIGTERM while one request waits in the batcher: its status, the exit code, the seconds from
    the signal to the exit, and the server's output."""
    in_flight: list[int] = []
    worker = threading.Thread(target=lambda: in_flight.append(act(server.port, OBSERVATION).status))
    worker.start()
    time.sleep(0.3)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(timeout=30)
    took = time.monotonic() - signalled
    worker.join(timeout=10)
    return in_flight, code, took, server.output()


def test_sigterm_with_a_half_sent_request_exits_within_the_bound_and_answers_requests_in_flight(
    export: Path,
) -> None:
    # --max-wait-ms holds a lone request in the batcher for 0.8 s: it is being computed at SIGTERM.
    limits = ["--shutdown-timeout", "3", "--max-wait-ms", "800"]
    with serving(str(export), *limits) as server:
        stuck_body = half_sent_request(server.port, body_bytes=10)
        stuck_headers = half_sent_request(server.port, body_bytes=None)
        in_flight, code, took, output = sigterm_with_a_request_in_flight(server)
        assert in_flight == [200], output
        assert took < 3.0, f"the server took {took:.1f} s to stop: {output}"
        assert status_of(stuck_body) == 503 and status_of(stuck_headers) == 503
        assert code == 1, output  # requests were cut
        assert "2 request(s) cut (2 still arriving)" in output
        assert "Traceback" not in output and "ERROR" not in output, output


def test_a_request_computed_past_the_shutdown_timeout_is_cut_and_counted_without_a_traceback(
    export: Path,
) -> None:
    with serving(str(export), "--shutdown-timeout", "0.5", "--max-wait-ms", "20000") as server:
        in_flight, code, took, output = sigterm_with_a_request_in_flight(server)
        assert took < 2.0, f"the server took {took:.1f} s to stop: {output}"
        assert code == 1 and "1 request(s) cut (1 unfinished after the 0.5 s shutdown timeout)" in output
        assert in_flight == [503]  # never computed: a client may retry it elsewhere
        assert "Traceback" not in output and "ERROR" not in output, output


def test_sigterm_with_no_request_open_stops_at_once_with_exit_code_0(export: Path) -> None:
    with serving(str(export)) as server:
        assert act(server.port, OBSERVATION).status == 200
        idle = connect(server.port)  # an idle connection does not hold the shutdown either
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=5) == 0
        assert "no request cut" in server.output()
        idle.close()


def test_two_thousand_stalled_connections_get_408_and_give_their_descriptors_back(export: Path) -> None:
    with serving(str(export), "--read-timeout", "3") as server:
        pid = server.process.pid
        assert act(server.port, OBSERVATION).status == 200
        baseline = settled_descriptors(pid)
        stalled = [half_sent_request(server.port, None if i % 2 else 10) for i in range(2000)]
        held, deadline = open_descriptors(pid), time.monotonic() + 2
        while held < baseline + 2000 and time.monotonic() < deadline:  # the server accepting them
            time.sleep(0.05)
            held = max(held, open_descriptors(pid))
        answered = [act(server.port, OBSERVATION).status for _ in range(20)]
        time.sleep(0.5)
        answered += [act(server.port, OBSERVATION).status for _ in range(20)]
        assert answered == [200] * 40
        assert held >= baseline + 2000, (baseline, held)
        deadline = time.monotonic() + 15
        while open_descriptors(pid) > baseline and time.monotonic() < deadline:
            time.sleep(0.1)
        after = open_descriptors(pid)
        statuses = [status_of(sock) for sock in stalled]
        for sock in stalled:
            sock.close()
        assert after <= baseline, f"descriptors: {baseline} before, {held} held, {after} after the timeout"
        assert statuses.count(408) == 2000, {s: statuses.count(s) for s in set(statuses)}
        assert metric(server.port, 'rl_app_serve_read_timeouts_total{stage="headers"}') == 1000
        assert metric(server.port, 'rl_app_serve_read_timeouts_total{stage="body"}') == 1000
        assert act(server.port, OBSERVATION).status == 200
        assert "Traceback" not in server.output()


def test_a_connection_that_sends_nothing_is_closed_after_the_read_timeout(export: Path) -> None:
    with serving(str(export), "--read-timeout", "1") as server:
        silent = connect(server.port)
        started = time.monotonic()
        assert silent.recv(4096) == b""  # closed without a word: nothing was asked
        assert 0.8 < time.monotonic() - started < 5


def test_connections_past_the_limit_are_refused_with_503_while_health_checks_pass(export: Path) -> None:
    with serving(str(export), "--max-connections", "40", "--read-timeout", "60") as server:
        pid = server.process.pid
        baseline = settled_descriptors(pid)
        idle = [connect(server.port) for _ in range(40)]
        time.sleep(0.3)  # accepted: the limit is reached
        refused = act(server.port, OBSERVATION)
        assert refused.status == 503 and refused.body["field"] == "server", refused.text
        assert "limit of 40 connections" in refused.body["error"]
        assert request(server.port, "GET", "/v1/health").status == 200  # an orchestrator's probe
        # A burst far past the limit: beyond the overflow the server closes at once, so its
        # descriptors stay bounded however many clients come.
        burst = [connect(server.port) for _ in range(600)]
        time.sleep(0.3)
        during = open_descriptors(pid)
        for sock in burst + idle:
            sock.close()
        assert during <= baseline + 40 + 256 + 8, (baseline, during)
        deadline = time.monotonic() + 10
        while act(server.port, OBSERVATION).status != 200:
            assert time.monotonic() < deadline, "the server did not recover once the clients left"
            time.sleep(0.2)
        assert metric(server.port, 'rl_app_serve_refused_connections_total{answer="503"}') >= 1
        assert metric(server.port, 'rl_app_serve_refused_connections_total{answer="closed"}') >= 1
        assert metric(server.port, "rl_app_serve_open_connections") <= 2
        output = server.output()
        assert "Traceback" not in output and "ERROR" not in output, output


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b'{"observations": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nested 5001 deep"),
        (b'{"observations": ' + b"[" * 200000 + b"]" * 200000 + b"}", 400, "nested 200001 deep"),
        (b'{"observations": [' + b"0," * 1_000_000 + b"0]}", 413, "values or more"),
        (b'{"observations": {"base64": "", "dtype": "uint8", "shape": [[[[[[1]]]]]]}}', 400, "nested"),
    ],
)
def test_json_nested_or_sized_past_any_request_is_refused_with_4xx_before_parsing(
    export: Path, body: bytes, status: int, reason: str
) -> None:
    with serving(str(export)) as server:
        answer = request(server.port, "POST", "/v1/act", body)
        assert answer.status == status and reason in answer.body["error"], answer.text
        assert act(server.port, OBSERVATION).status == 200
        assert "Traceback" not in server.output()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-connections", "100000000"], "leaves room for at most"),
        (["--read-timeout", "0"], "expected a number > 0"),
        (["--shutdown-timeout", "-1"], "expected a number >= 0"),
        (["--ray-serve", "--read-timeout", "3"], "--read-timeout is the lightweight server's"),
    ],
)
def test_connection_settings_out_of_range_are_refused_in_one_line(
    export: Path, flags: list[str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rl_app", "serve", str(export), *flags, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3  # argparse's usage line, then the error


def test_default_limits_leave_room_in_the_descriptor_limit() -> None:
    from rl_app.serve.connections import RESERVED_DESCRIPTORS, most_connections, overflow_for

    assert ConnectionLimits().max_connections is None  # sized at start-up
    for descriptors in (256, 1024, 65536):
        assert most_connections(descriptors) + overflow_for(descriptors) + RESERVED_DESCRIPTORS <= descriptors
    assert most_connections(1024) >= 800
