"""Training speed of an earlier revision against this working tree, in turn, each run in a fresh process.

    python bench/before_after.py REV [--rounds 6]

For a change meant to leave speed alone (a refactor, a move behind an adapter): the earlier
revision is checked out in a temporary git worktree, and each round runs it and then this tree,
with the same Python and packages:
- ``ppo_cartpole``: env steps/s of training iterations (sampling and PPO updates) after two warm-up
  iterations;
- ``sac_halfcheetah``: env steps/s with one update per env step once learning is under way
  (``bench/compare.py``'s measurement: uniform replay, 1,000 steps before learning).

Each tree runs with its own shipped experiments. Writes bench/results/before-after-<date>-<rev>.json
and .md: per round, and the median ratio (this tree / earlier) with a bootstrap 95 % interval over
the paired rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from common import write_results
from stats import interval_text, paired_ratio

REPO = Path(__file__).resolve().parents[1]

PPO_SCRIPT = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import ray
from common import build_experiment_algo
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME
ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
algo = build_experiment_algo("ppo_cartpole", ["evaluation.interval=0"], os.cpu_count(), 0)
def sampled():
    return algo.train()[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME]
sampled(); first = sampled()
began = time.perf_counter()
for _ in range(int(sys.argv[2])):
    last = sampled()
rate = (last - first) / (time.perf_counter() - began)
algo.stop(); ray.shutdown()
print(json.dumps({"steps_per_s": rate}))
"""

SAC_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import compare
print(json.dumps({"steps_per_s": compare.with_ray(compare.ours_sac_rate, *map(int, sys.argv[2:5]))}))
"""


def rate(tree: Path, script: str, *arguments: object) -> float:
    """Env steps/s that ``script`` prints, run fresh with rl_app and the experiments of ``tree``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),  # ahead of the installed (editable) rl_app
        "RL_APP_EXPERIMENTS_DIR": str(tree / "experiments"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    result = subprocess.run(
        [sys.executable, "-c", script, str(tree / "bench"), *map(str, arguments)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(result.stdout.strip().splitlines()[-1])["steps_per_s"])


CASES = {
    "ppo_cartpole": (PPO_SCRIPT, 20),  # 20 timed iterations
    "sac_halfcheetah": (SAC_SCRIPT, 1_000, 50, 600),  # starts, warm-up, timed steps
}


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Training speed, {results['revision']} against this tree, {results['date']}",
        "",
        f"Env steps/s, each run in a fresh process, {results['rounds']} rounds in turn (earlier, then this "
        f"tree); the ratio is this tree over the earlier revision, the median over rounds with a bootstrap "
        f"95 % interval. {os.cpu_count()} CPUs.",
        "",
        "| experiment | earlier, by round | this tree, by round | this tree / earlier |",
        "|---|---|---|---|",
    ]
    for name, case in results["cases"].items():
        before = ", ".join(f"{v:,.1f}" for v in case["before"])
        after = ", ".join(f"{v:,.1f}" for v in case["after"])
        lines.append(f"| {name} | {before} | {after} | {interval_text(case['ratio'], 2, 'x')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the earlier git revision, e.g. a0fffcc")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.revision], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    results: dict[str, Any] = {"date": stamp, "revision": revision, "rounds": args.rounds, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="rl_app-before-") as scratch:
        earlier = Path(scratch) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(earlier), revision], cwd=REPO, check=True)
        try:
            for name, (script, *arguments) in CASES.items():
                before, after = [], []
                for round_number in range(1, args.rounds + 1):
                    before.append(rate(earlier, script, *arguments))
                    after.append(rate(REPO, script, *arguments))
                    print(f"{name} round {round_number}: {before[-1]:,.1f} then {after[-1]:,.1f}", flush=True)
                results["cases"][name] = {
                    "before": before,
                    "after": after,
                    "ratio": paired_ratio(after, before),
                }
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(earlier)], cwd=REPO, check=False)
    write_results(f"before-after-{stamp}-{revision}", results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
