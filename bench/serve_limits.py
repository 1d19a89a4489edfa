"""`rl_app serve` against stuck and stalled clients, measured: how long SIGTERM takes with requests
half sent, and the server's open descriptors before, during and after 2,000 stalled connections.

    python bench/serve_limits.py EXPORT_DIR [--connections 2000] [--read-timeout 3] [--rounds 5]

Each round starts a fresh server. Writes bench/results/serve-limits-<date>-<time>.json and .md
(medians over rounds with bootstrap 95 % intervals).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from common import write_results
from serve import start
from stats import interval_text, median_interval

from rl_app.cluster.nodes import free_port

ACT = b'{"observations": [[0.01, 0.02, 0.03, 0.04]]}'


def start_server(export: Path, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "rl_app", "serve", str(export), "--port", str(port), *flags]
    return start(command, port, output=subprocess.PIPE), port


def half_sent(port: int, body: bool) -> socket.socket:
    """A request cut short: in its headers, or 10 bytes into a 100,000-byte body."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = b"POST /v1/act HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    sock.sendall(head + b"Content-Length: 100000\r\n\r\n" + ACT[:10] if body else head[:30])
    return sock


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def shutdown_with_stuck_clients(export: Path) -> dict[str, Any]:
    process, port = start_server(export)
    stuck = [half_sent(port, body) for body in (True, False)]
    time.sleep(0.3)
    signalled = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=60)[0].decode()
    seconds = time.perf_counter() - signalled
    for sock in stuck:
        sock.close()
    line = next((text for text in output.splitlines() if text.startswith("stopped")), "")
    return {"seconds": seconds, "exit_code": process.returncode, "line": line}


def stalled_connections(export: Path, count: int, read_timeout: float) -> dict[str, Any]:
    process, port = start_server(export, "--read-timeout", f"{read_timeout:g}")
    time.sleep(0.5)
    before = descriptors(process.pid)
    stalled = [half_sent(port, i % 2 == 0) for i in range(count)]
    held, deadline = before, time.monotonic() + 3
    while held < before + count and time.monotonic() < deadline:
        time.sleep(0.05)
        held = max(held, descriptors(process.pid))
    began = time.monotonic()
    while descriptors(process.pid) > before and time.monotonic() - began < read_timeout + 15:
        time.sleep(0.05)
    after, back_in = descriptors(process.pid), time.monotonic() - began
    statuses = []
    for sock in stalled:
        data = sock.recv(64)
        match = re.match(rb"HTTP/1\.1 (\d{3})", data)
        statuses.append(int(match.group(1)) if match else None)
        sock.close()
    process.terminate()
    process.communicate(timeout=60)
    return {
        "before": before,
        "held": held,
        "after": after,
        "seconds_to_baseline_after_all_held": back_in,
        "answered_408": statuses.count(408),
    }


def markdown(results: dict[str, Any]) -> str:
    shutdown, stalled = results["summary"]["shutdown"], results["summary"]["stalled"]
    rounds = results["rounds"]

    def row(
        figure: str, summary: dict[str, Any], values: list[Any], digits: int = 0, suffix: str = ""
    ) -> str:
        return f"| {figure} | {interval_text(summary, digits, suffix)} | {', '.join(map(str, values))} |"

    def stalled_row(figure: str, key: str) -> str:
        return row(figure, stalled[key], [r["stalled"][key] for r in rounds])

    return "\n".join(
        [
            f"# rl_app serve with stuck and stalled clients, {results['date']}",
            "",
            f"{len(rounds)} rounds, a fresh server each; {os.cpu_count()} CPUs.",
            "",
            "| figure | median [95 % interval] | by round |",
            "|---|---|---|",
            row(
                "SIGTERM to exit, 2 requests half sent (defaults: --shutdown-timeout 5)",
                shutdown,
                [f"{r['shutdown']['seconds']:.3f}" for r in rounds],
                3,
                " s",
            ),
            stalled_row(
                f"server descriptors before {results['connections']:,} stalled connections", "before"
            ),
            stalled_row("while they are held", "held"),
            stalled_row(f"after the read timeout ({results['read_timeout']:g} s)", "after"),
            stalled_row("clients answered 408", "answered_408"),
            "",
            f"Exit codes after SIGTERM: {sorted({r['shutdown']['exit_code'] for r in rounds})}; "
            f'the server\'s line: "{rounds[-1]["shutdown"]["line"]}".',
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, help="an ONNX export folder")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--read-timeout", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.connections + 1000)), hard))
    rounds = []
    for number in range(1, args.rounds + 1):
        rounds.append(
            {
                "shutdown": shutdown_with_stuck_clients(args.export),
                "stalled": stalled_connections(args.export, args.connections, args.read_timeout),
            }
        )
        print(f"round {number}: {rounds[-1]}", flush=True)
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    results = {
        "date": stamp,
        "connections": args.connections,
        "read_timeout": args.read_timeout,
        "rounds": rounds,
        "summary": {
            "shutdown": median_interval([r["shutdown"]["seconds"] for r in rounds]),
            "stalled": {
                key: median_interval([r["stalled"][key] for r in rounds])
                for key in ("before", "held", "after", "answered_408")
            },
        },
    }
    write_results(f"serve-limits-{stamp}", results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
