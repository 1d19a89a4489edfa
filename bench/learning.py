"""Learning proof for the experiments too slow for the test suite: train as shipped, check the target.

    python bench/learning.py [EXP ...]      (default: every shipped experiment but the *_sweep ones,
                                             which bench/sweep.py covers, and those with a bench
                                             of their own: OTHER_PROOFS, CLUSTER_BUDGETS)

Writes bench/results/learning-<date>.json, prints the rows of bench/README.md's learning table,
and exits 1 if an experiment misses its target.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import date
from pathlib import Path

from rl_app.config import available_experiments, load_experiment
from rl_app.training.run import train

RESULTS = Path(__file__).resolve().parent / "results"
# Their full-budget targets (Pong: 10M steps) are a cluster's job; their proof on a CPU is the
# pipeline test (tests/test_workloads.py); the pixel learning proofs are ppo_minatar_breakout and
# ppo_breakout.
CLUSTER_BUDGETS = {"ppo_pong", "impala_pong"}
# Judged on more than a return: their proof is bench/multi_agent.py (make bench-multi-agent),
# ppo_breakout's an hour of training, bench/atari_learning.py (make bench-learning-atari), and
# ppo_minatar_breakout's a published figure on held-out seeds, bench/minatar_learning.py.
OTHER_PROOFS = {"ppo_simple_spread", "ppo_tictactoe_selfplay", "ppo_breakout", "ppo_minatar_breakout"}


def main(names: list[str]) -> int:
    names = names or [
        n
        for n in available_experiments()
        if not n.endswith("_sweep") and n not in CLUSTER_BUDGETS | OTHER_PROOFS
    ]
    figures, missed = {}, []
    with tempfile.TemporaryDirectory() as runs_root:
        for name in names:
            experiment = load_experiment(name).config
            summary = train(name, runs_root=Path(runs_root))
            target = experiment.stop.return_
            figures[name] = {
                "target": target,
                "best_eval_return": summary.best_eval_return,
                "timesteps": summary.timesteps,
                "budget": experiment.stop.timesteps,
                "iterations": summary.iterations,
                "wall_s": round(summary.elapsed_s, 1),
                "reached": target is not None and summary.best_eval_return >= target,
            }
            if not figures[name]["reached"]:
                missed.append(name)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"learning-{date.today().isoformat()}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print("| experiment | target | best eval return | env steps | minutes | reached |")
    print("|---|---|---|---|---|---|")
    for name, row in figures.items():
        print(
            f"| {name} | {row['target']:g} | {row['best_eval_return']:.1f} | {row['timesteps']:,} "
            f"| {row['wall_s'] / 60:.1f} | {'yes' if row['reached'] else 'MISSED'} |"
        )
    print(f"wrote {out}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
