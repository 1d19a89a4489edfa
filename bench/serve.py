"""`make bench-serve`: requests/s and p50/p99 latency of `rl_app serve` against FastAPI + onnxruntime
baselines (bench/serve_baseline.py: the naive one, and one tuned as a practitioner would) and
`rl_app serve --ray-serve`, one CartPole observation per request, at concurrency 1, 8 and 64 over
keep-alive connections from 127.0.0.1, each point measured by two clients: bench/load.py's minimal
asyncio client and aiohttp's.

Every server runs alone, in a fresh process, for each of ``--repeats`` rounds (all servers in turn
within a round); each must give the same actions for the same observations first. Figures are
medians over rounds with bootstrap 95 % intervals; ratios are paired by round. ``--rev REV`` adds
`rl_app serve` of an earlier revision (a git worktree, same Python and packages) to tell whether a
change left serving speed alone. Writes bench/results/serve-<date>.json and .md.

    python bench/serve.py [--policy EXPORT_DIR] [--seconds 4] [--repeats 3] [--rev REV] [--skip-ray-serve]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from common import write_results
from load import LoadResult, http_request, run_load, run_load_aiohttp, send_once
from stats import interval_text, median_interval, paired_ratio

from rl_app.cluster.nodes import free_port

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 8, 64)
CHECK_OBSERVATIONS = [[0.01, 0.02, 0.03, 0.04], [0.0, 0.5, -0.1, -0.5], [0.1, -0.4, 0.05, 0.3]]
ONE_OBSERVATION = json.dumps({"observations": CHECK_OBSERVATIONS[:1]}).encode()
REFERENCE = "baseline_tuned"
# Fixed before the run (issue 44): rl_app at c=64 at least 1.5x the tuned baseline, p99 at most
# 20 ms at c=64 and 2 ms at c=8, by both clients.
TARGETS = {"ratio_c64": 1.5, "p99_ms": {64: 20.0, 8: 2.0}}


def bench_client(port: int, concurrency: int, seconds: float) -> LoadResult:
    return asyncio.run(run_load(port, http_request("/v1/act", ONE_OBSERVATION), concurrency, seconds))


def aiohttp_client(port: int, concurrency: int, seconds: float) -> LoadResult:
    return asyncio.run(run_load_aiohttp(port, "/v1/act", ONE_OBSERVATION, concurrency, seconds))


CLIENTS: dict[str, Callable[[int, int, float], LoadResult]] = {
    "bench": bench_client,
    "aiohttp": aiohttp_client,
}


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


def tree_revision() -> str:
    """This tree's commit, ``-dirty`` when it has changes not committed."""
    describe = ["git", "describe", "--always", "--dirty"]
    return subprocess.run(describe, cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def start(
    command: list[str], port: int, env: dict[str, str] | None = None, timeout: float = 180, output: Any = None
) -> subprocess.Popen[bytes]:
    """``command``, a server on ``port``, once it answers an act request; its stdout and stderr to
    ``output`` (None: discarded)."""
    stdout, stderr = (
        (subprocess.DEVNULL, subprocess.DEVNULL) if output is None else (output, subprocess.STDOUT)
    )
    process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
    deadline = time.monotonic() + timeout
    request = http_request("/v1/act", ONE_OBSERVATION)
    while True:
        try:
            if asyncio.run(send_once(port, request))[0] == 200:
                return process
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"server did not start: {' '.join(command)}")
        time.sleep(0.2)


def measure(name: str, command: list[str], env: dict[str, str], seconds: float) -> dict[str, Any]:
    """One round of one server: its actions for the check observations, then each client's load."""
    port = free_port()
    process = start([part.replace("{port}", str(port)) for part in command], port, env)
    try:
        body = json.dumps({"observations": CHECK_OBSERVATIONS}).encode()
        _, answer = asyncio.run(send_once(port, http_request("/v1/act", body)))
        asyncio.run(run_load(port, http_request("/v1/act", ONE_OBSERVATION), 8, 1.0))  # warm-up
        loads: dict[str, dict[int, dict[str, Any]]] = {}
        for client, load in CLIENTS.items():
            loads[client] = {}
            for concurrency in CONCURRENCY:
                result = load(port, concurrency, seconds)
                loads[client][concurrency] = {**asdict(result), "per_second": result.per_second}
                print(
                    f"  {name:>14} {client:>7} c={concurrency:<3} {result.per_second:8,.0f} req/s  "
                    f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  errors {result.errors}",
                    flush=True,
                )
        return {"actions": json.loads(answer)["actions"], "loads": loads}
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per client, server and concurrency: medians with intervals over rounds, and ratios of
    requests/s to the tuned baseline and to the naive one, paired by round."""
    summary: dict[str, Any] = {}
    for client in CLIENTS:
        summary[client] = {}
        for name, runs in rounds.items():
            summary[client][name] = {}
            for concurrency in CONCURRENCY:
                points = [run["loads"][client][concurrency] for run in runs]

                def rates(server: str, client: str = client, c: int = concurrency) -> list[float]:
                    return [run["loads"][client][c]["per_second"] for run in rounds[server]]

                summary[client][name][concurrency] = {
                    "per_second": median_interval([p["per_second"] for p in points]),
                    "p50_ms": median_interval([p["p50_ms"] for p in points]),
                    "p99_ms": median_interval([p["p99_ms"] for p in points]),
                    "errors": sum(p["errors"] for p in points),
                    "vs_tuned": paired_ratio(rates(name), rates(REFERENCE)),
                    "vs_naive": paired_ratio(rates(name), rates("baseline")),
                }
    return summary


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of TARGETS, for each client: the figure, and met or missed."""
    checks = []
    for client, servers in summary.items():
        ours = servers["rl_app"]
        ratio = ours[64]["vs_tuned"]
        checks.append(
            {
                "client": client,
                "target": f"requests/s at c=64 >= {TARGETS['ratio_c64']}x the tuned baseline",
                "value": interval_text(ratio, 2, "x"),
                "met": ratio["median"] >= TARGETS["ratio_c64"],
            }
        )
        for concurrency, bound in TARGETS["p99_ms"].items():
            p99 = ours[concurrency]["p99_ms"]
            checks.append(
                {
                    "client": client,
                    "target": f"p99 at c={concurrency} <= {bound:g} ms",
                    "value": interval_text(p99, 2, " ms"),
                    "met": p99["median"] <= bound,
                }
            )
    return checks


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# bench-serve {results['date']} ({results['tree']})",
        "",
        "CartPole policy (ONNX), 1 observation per request, keep-alive connections, "
        f"{results['seconds']:g} s per point, {results['repeats']} rounds (every server in a fresh "
        "process each round), "
        f"{results['cpus']} CPUs shared by server and client. Medians over rounds with bootstrap 95 % "
        "intervals; ratios paired by round.",
        "",
        "Servers: " + "; ".join(f"**{name}**: {text}" for name, text in results["servers"].items()) + ".",
    ]
    for client, servers in results["summary"].items():
        lines += [
            "",
            f"### {client} client",
            "",
            "| server | c | requests/s | vs tuned baseline | vs naive baseline | p50 ms | p99 ms | errors |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, points in servers.items():
            for concurrency, point in points.items():
                lines.append(
                    f"| {name} | {concurrency} | {interval_text(point['per_second'], 0)} | "
                    f"{interval_text(point['vs_tuned'], 2, 'x')} | "
                    f"{interval_text(point['vs_naive'], 2, 'x')} | {interval_text(point['p50_ms'], 2)} | "
                    f"{interval_text(point['p99_ms'], 2)} | {point['errors']} |"
                )
    for client, ratios in results.get("vs_earlier", {}).items():
        cells = ", ".join(f"c={c}: {interval_text(r, 2, 'x')}" for c, r in ratios.items())
        lines += ["", f"This tree / {results['earlier']}, requests/s, {client} client: {cells}."]
    lines += [
        "",
        "### Targets (fixed before the run)",
        "",
        "| client | target | rl_app | |",
        "|---|---|---|---|",
    ]
    for check in results["targets"]:
        verdict = "met" if check["met"] else "**missed**"
        lines.append(f"| {check['client']} | {check['target']} | {check['value']} | {verdict} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, help="an ONNX export folder (default: train and export one)")
    parser.add_argument("--seconds", type=float, default=4.0, help="load time per point (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every server (default 3)")
    parser.add_argument("--rev", help="also serve with this earlier git revision of rl_app")
    parser.add_argument("--skip-ray-serve", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        policy = args.policy or make_export(Path(scratch))
        baseline = [sys.executable, str(REPO / "bench" / "serve_baseline.py"), str(policy), "{port}"]
        rl_app = [
            sys.executable,
            "-m",
            "rl_app",
            "serve",
            str(policy),
            "--format",
            "onnx",
            "--port",
            "{port}",
        ]
        servers: dict[str, tuple[list[str], dict[str, str], str]] = {
            "baseline": (baseline, env, "FastAPI, sync handler, onnxruntime and uvicorn defaults"),
            REFERENCE: (
                [*baseline, "--tuned"],
                env,
                "FastAPI, async handler, onnxruntime with 1 thread, access log off, uvloop + httptools",
            ),
            "rl_app": (rl_app, env, "`rl_app serve` of this tree"),
        }
        earlier = Path(scratch) / "earlier"
        revision = None
        if args.rev:
            revision = subprocess.run(
                ["git", "rev-parse", "--short", args.rev],
                cwd=REPO,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(earlier), revision], cwd=REPO, check=True
            )
            servers[f"rl_app@{revision}"] = (
                rl_app,
                {**env, "PYTHONPATH": str(earlier)},  # ahead of the installed (editable) rl_app
                f"`rl_app serve` of {revision}",
            )
        if not args.skip_ray_serve:
            servers["ray_serve"] = ([*rl_app, "--ray-serve"], env, "`rl_app serve --ray-serve`, 1 replica")
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        try:
            for round_number in range(1, args.repeats + 1):
                print(f"round {round_number} of {args.repeats}", flush=True)
                for name, (command, server_env, _) in servers.items():
                    rounds[name].append(measure(name, command, server_env, args.seconds))
        finally:
            if revision:
                subprocess.run(["git", "worktree", "remove", "--force", str(earlier)], cwd=REPO, check=False)
    answers = {json.dumps(run["actions"]) for runs in rounds.values() for run in runs}
    if len(answers) != 1:
        raise SystemExit(f"the servers disagree on the same observations: {answers}")
    summary = summarise(rounds)
    results = {
        "date": stamp,
        "tree": tree_revision(),
        "cpus": os.cpu_count(),
        "seconds": args.seconds,
        "repeats": args.repeats,
        "servers": {name: description for name, (_, _, description) in servers.items()},
        "rounds": rounds,
        "summary": summary,
        "targets": targets(summary),
    }
    if revision:
        results["earlier"] = revision
        results["vs_earlier"] = {
            client: {
                c: paired_ratio(
                    [run["loads"][client][c]["per_second"] for run in rounds["rl_app"]],
                    [run["loads"][client][c]["per_second"] for run in rounds[f"rl_app@{revision}"]],
                )
                for c in CONCURRENCY
            }
            for client in CLIENTS
        }
    write_results(f"serve-{stamp}", results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
