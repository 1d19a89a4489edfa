"""`make bench-serve`: requests/s and p50/p99 latency of `rl_app serve`, `rl_app serve --ray-serve` and
the endpoint anyone would write first (bench/serve_baseline.py: FastAPI + onnxruntime, one request
-> one ``session.run``), side by side in one run, one CartPole observation per request, at
concurrency 1, 8 and 64 over keep-alive connections from 127.0.0.1.

Each server runs alone (its own process; the load client takes the other core) for a fixed time
per concurrency after a warm-up; every server must give the same actions for the same
observations first. Writes bench/results/serve-<date>.json and .md.

    python bench/serve.py [--policy EXPORT_DIR] [--seconds 5] [--skip-ray-serve]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from load import LoadResult, http_request, run_load, send_once

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCY = (1, 8, 64)
CHECK_OBSERVATIONS = [[0.01, 0.02, 0.03, 0.04], [0.0, 0.5, -0.1, -0.5], [0.1, -0.4, 0.05, 0.3]]


def make_export(scratch: Path) -> Path:
    """A CartPole ONNX export of a 2-iteration ppo_cartpole run (the policy's quality is irrelevant)."""
    runs = scratch / "runs"
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    command = [sys.executable, "-m", "rl_app", "train", "ppo_cartpole", "--runs-dir", str(runs)]
    subprocess.run([*command, "--set", "stop.iterations=2"], check=True, env=env, stdout=subprocess.DEVNULL)
    (run_dir,) = (runs / "ppo_cartpole").iterdir()
    export = scratch / "export"
    export_command = [sys.executable, "-m", "rl_app", "export", str(run_dir), "--format", "onnx"]
    subprocess.run([*export_command, "--out", str(export)], check=True, stdout=subprocess.DEVNULL)
    return export


def act_request(observations: list[list[float]]) -> bytes:
    return http_request("/v1/act", json.dumps({"observations": observations}).encode())


def start(command: list[str], port: int, timeout: float = 180) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _ = asyncio.run(send_once(port, act_request(CHECK_OBSERVATIONS[:1])))
            if status == 200:
                return process
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"server did not start: {' '.join(command)}")
        time.sleep(0.2)


def measure(name: str, command: list[str], port: int, seconds: float) -> tuple[list[LoadResult], list[int]]:
    process = start(command, port)
    try:
        _, body = asyncio.run(send_once(port, act_request(CHECK_OBSERVATIONS)))
        actions = json.loads(body)["actions"]
        asyncio.run(run_load(port, act_request(CHECK_OBSERVATIONS[:1]), 8, 1.0))  # warm-up
        results = []
        for concurrency in CONCURRENCY:
            result = asyncio.run(run_load(port, act_request(CHECK_OBSERVATIONS[:1]), concurrency, seconds))
            print(
                f"  {name:>9} c={concurrency:<3} {result.per_second:8,.0f} req/s  "
                f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  errors {result.errors}",
                flush=True,
            )
            results.append(result)
        return results, actions
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def table(measured: dict[str, list[LoadResult]]) -> str:
    baseline = {r.concurrency: r for r in measured["baseline"]}
    lines = [
        "| server | concurrency | requests/s | vs baseline | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, results in measured.items():
        for r in results:
            ratio = r.per_second / baseline[r.concurrency].per_second
            lines.append(
                f"| {name} | {r.concurrency} | {r.per_second:,.0f} | {ratio:.2f}x | {r.p50_ms:.2f} | "
                f"{r.p99_ms:.2f} | {r.errors} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, help="an ONNX export folder (default: train and export one)")
    parser.add_argument("--seconds", type=float, default=5.0, help="load time per concurrency (default 5)")
    parser.add_argument("--skip-ray-serve", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        policy = args.policy or make_export(Path(scratch))
        rl_app = [sys.executable, "-m", "rl_app", "serve", str(policy), "--format", "onnx"]
        servers = {
            "baseline": (
                [sys.executable, str(REPO / "bench" / "serve_baseline.py"), str(policy), "8601"],
                8601,
            ),
            "rl_app": ([*rl_app, "--port", "8602"], 8602),
        }
        if not args.skip_ray_serve:
            servers["ray_serve"] = ([*rl_app, "--ray-serve", "--port", "8603"], 8603)
        measured, actions = {}, {}
        for name, (command, port) in servers.items():
            print(f"{name}: {' '.join(command[1:])}", flush=True)
            measured[name], actions[name] = measure(name, command, port, args.seconds)
    if len({json.dumps(a) for a in actions.values()}) != 1:
        raise SystemExit(f"the servers disagree on the same observations: {actions}")
    date = datetime.date.today().isoformat()
    markdown = (
        f"# bench-serve {date}\n\nCartPole policy (ONNX), 1 observation per request, keep-alive "
        f"connections, {args.seconds:g} s per point, {os.cpu_count()} CPUs shared by server and client."
        f"\n\n{table(measured)}\n"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"serve-{date}.md").write_text(markdown)
    payload = {
        name: [{**asdict(r), "per_second": r.per_second} for r in results]
        for name, results in measured.items()
    }
    (RESULTS / f"serve-{date}.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
