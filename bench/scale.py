"""Env runners on one node against the same runners spread over loopback nodes, and what one
iteration moves between processes: the numbers docs/distributed.md's cost model uses.

    python bench/scale.py [--iterations N]

1. ppo_cartpole's training env steps/s with 1, 2 and 4 remote env runners (1 env each, 8 envs),
   on one node of 4 CPUs, then on a head (0 CPUs) and two worker nodes of 2 CPUs each on
   127.0.0.2-4 (``cluster up``/``join``). This machine has 2 cores: 4 runners oversubscribe it in
   both layouts, so the figures compare placements, not scaling.
2. A lost node: ppo_cartpole with 2 env runners, one per worker node; after 30 iterations one
   worker node is SIGKILLed (raylet, agents, runners: a spot preemption). The iteration that says
   so, and iteration time and env steps/s with 2 runners before and with the survivor after.
3. Bytes per iteration: the weights a runner receives (the module's inference state), and what
   one runner's sample call returns (its episodes, pickled), for ppo_cartpole, sac_halfcheetah and
   ppo_pong's Nature CNN.

Writes bench/results/scale-<date>-<time>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from common import write_results
from stats import interval_text, ratio_of_medians

REPO = Path(__file__).resolve().parents[1]
RUNNERS = (1, 2, 4)

# One measurement in a fresh driver process: (layout address or "", runners, iterations) -> JSON.
RATE = r"""
import json, sys, time, statistics
address, runners, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
import ray
from rl_app.cluster.session import ray_session
from common import build_experiment_algo
from rl_app.rllib.runners import RunnerWatch
if not address:  # one node of 4 CPUs: the same CPU count as the two workers of the spread layout
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
with ray_session(address or None) as cluster:
    overrides = [f"env_runners.num_env_runners={runners}", "evaluation.interval=0",
                 "env_runners.num_envs_per_env_runner=8"]
    algo = build_experiment_algo("ppo_cartpole", overrides, cluster.num_cpus, 0)
    watch = RunnerWatch(algo.env_runner_group)
    nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    placed = sorted(nodes.get(n, "?") for n in watch.node_of.values())
    for _ in range(3):
        algo.train()
    rates = []
    for _ in range(iterations):
        began = time.perf_counter()
        result = algo.train()
        steps = result["env_runners"]["num_env_steps_sampled"]
        rates.append(steps / (time.perf_counter() - began))
    algo.stop()
print(json.dumps({"steps_per_s": statistics.median(rates), "rates": rates, "runners_on": placed}))
"""


def rate(address: str, runners: int, iterations: int, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-c", RATE, address, str(runners), str(iterations), str(Path(__file__).parent)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=900)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def one_node(iterations: int, env: dict[str, str]) -> dict[int, Any]:
    """The local Ray of ``rl_app train``, told it has 4 CPUs."""
    return {n: rate("", n, iterations, env) for n in RUNNERS}


def spread(iterations: int, env: dict[str, str]) -> dict[int, Any]:
    from rl_app.cluster.nodes import cluster_down, cluster_join, cluster_up, free_port

    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / ".cluster"
        head = cluster_up(
            state,
            port=free_port("127.0.0.2"),
            dashboard_port=free_port("127.0.0.2"),
            num_cpus=0,
            bind="127.0.0.2",
        )
        try:
            for address in ("127.0.0.3", "127.0.0.4"):
                cluster_join(head.gcs_address, state, bind=address, num_cpus=2)
            token = {"RAY_AUTH_TOKEN": Path(head.token_file).read_text().strip()}
            rates: dict[Any, Any] = {
                n: rate(head.gcs_address, n, iterations, {**env, **token}) for n in RUNNERS
            }
            return {**rates, "lost_node": lost_node(head.gcs_address, state, {**env, **token}, folder)}
        finally:
            cluster_down(state)


def lost_node(gcs_address: str, state: Path, env: dict[str, str], folder: str) -> dict[str, Any]:
    """Train with a runner on each worker; SIGKILL the processes of the second worker node."""
    import csv
    import signal

    from rl_app.cluster.nodes import _cluster_processes, read_workers

    runs = Path(folder) / "runs"
    command = [
        sys.executable, "-m", "rl_app", "train", "ppo_cartpole", "--address", gcs_address,
        "--runs-dir", str(runs),
        "--set", "env_runners.num_env_runners=2", "--set", "evaluation.interval=0",
        "--set", "stop.return=100000", "--set", "stop.timesteps=100000000",
    ]  # fmt: skip
    driver = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def rows() -> list[dict[str, str]]:
        found = list(runs.glob("ppo_cartpole/*/progress.csv"))
        return list(csv.DictReader(found[0].open(newline=""))) if found else []

    while len(rows()) < 30:
        time.sleep(0.2)
    killed_at = len(rows())
    victim = next(w for w in read_workers(state) if w.node_ip == "127.0.0.4")
    for process in _cluster_processes(victim.temp_dir):
        process.kill()
    while len(rows()) < killed_at + 60:
        time.sleep(0.2)
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    table = rows()
    noticed = next(i for i, r in enumerate(table) if float(r["runners_alive"]) < 2)

    def medians(part: list[dict[str, str]]) -> dict[str, float]:
        return {
            "iteration_s": statistics.median(float(r["iteration_s"]) for r in part),
            "steps_per_s": statistics.median(float(r["steps_per_s"]) for r in part),
        }

    said = next((line.strip() for line in out.splitlines() if "lost 1 env runner" in line), "")
    return {
        "killed_after_iteration": killed_at,
        "noticed_at_iteration": noticed + 1,
        "said": said,
        "healthy": medians(table[5:killed_at]),
        "survivor": medians(table[noticed + 2 :]),
    }


def bytes_per_iteration() -> dict[str, Any]:
    """Weights a runner receives and one sample call's episodes, pickled, per experiment."""
    from common import build_experiment_algo

    from rl_app.cluster.session import ray_session

    rows = {}
    with ray_session():
        for experiment, overrides in (
            ("ppo_cartpole", []),
            ("sac_halfcheetah", []),
            ("ppo_pong", ["env_runners.num_envs_per_env_runner=8"]),
        ):
            algo = build_experiment_algo(
                experiment, ["env_runners.num_env_runners=0", "evaluation.interval=0", *overrides], 2, 0
            )
            runner = algo.env_runner
            weights = runner.module.get_state(inference_only=True)
            episodes = runner.sample(explore=True)
            steps = sum(len(e) for e in episodes)
            rows[experiment] = {
                "weights_bytes": len(pickle.dumps(weights)),
                "sample_bytes": len(pickle.dumps(episodes)),
                "sample_steps": steps,
                "bytes_per_step": len(pickle.dumps(episodes)) / max(1, steps),
                "parameters": sum(p.numel() for p in runner.module.parameters()),
            }
            algo.stop()
    return rows


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Env runners on one node and spread over loopback nodes, {results['date']}",
        "",
        "ppo_cartpole training env steps/s (medians of "
        f"{results['iterations']} iterations); 2 cores: 4 runners oversubscribe both layouts.",
        "",
        "| runners | one node (4 CPUs) | spread: head + 2 workers (2 CPUs each) "
        "| spread / one node [95 % interval] | placed on |",
        "|---|---|---|---|---|",
    ]
    for n in RUNNERS:
        one, many = results["one_node"][str(n)], results["spread"][str(n)]
        ratio = interval_text(ratio_of_medians(many["rates"], one["rates"]), digits=2, suffix="x")
        lines.append(
            f"| {n} | {one['steps_per_s']:,.0f} | {many['steps_per_s']:,.0f} | {ratio} "
            f"| {', '.join(many['runners_on'])} |"
        )
    lost = results["spread"]["lost_node"]
    healthy, survivor = lost["healthy"], lost["survivor"]
    lines += [
        "",
        f"A worker node SIGKILLed after iteration {lost['killed_after_iteration']}: said at iteration "
        f"{lost['noticed_at_iteration']}. Median iteration {healthy['iteration_s'] * 1000:.0f} ms with 2 "
        f"runners ({healthy['steps_per_s']:,.0f} env steps/s), {survivor['iteration_s'] * 1000:.0f} ms with "
        f"the survivor ({survivor['steps_per_s']:,.0f} env steps/s): "
        f"{survivor['steps_per_s'] / healthy['steps_per_s']:.2f}x the healthy rate.",
    ]
    lines += [
        "",
        "| experiment | parameters | weights to a runner | one sample call | bytes per env step |",
        "|---|---|---|---|---|",
    ]
    for name, row in results["bytes"].items():
        lines.append(
            f"| {name} | {row['parameters']:,} | {row['weights_bytes'] / 1e3:,.1f} kB | "
            f"{row['sample_bytes'] / 1e3:,.1f} kB ({row['sample_steps']} steps) "
            f"| {row['bytes_per_step']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments"), "RAY_USAGE_STATS_ENABLED": "0"}
    os.environ.update({k: v for k, v in env.items() if k.startswith(("RL_APP", "RAY_USAGE"))})
    began = time.monotonic()
    results: dict[str, Any] = {
        "date": datetime.now().strftime("%Y-%m-%d-%H%M"),
        "iterations": args.iterations,
    }
    print("bytes per iteration ...", file=sys.stderr, flush=True)
    results["bytes"] = bytes_per_iteration()
    print("one node ...", file=sys.stderr, flush=True)
    results["one_node"] = {str(k): v for k, v in one_node(args.iterations, env).items()}
    print("spread over loopback nodes ...", file=sys.stderr, flush=True)
    results["spread"] = {str(k): v for k, v in spread(args.iterations, env).items()}
    results["wall_s"] = round(time.monotonic() - began, 1)
    write_results(f"scale-{results['date']}", results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
