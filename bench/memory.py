"""Memory where the env hides what a policy needs (make bench-memory): ppo_stateless_cartpole (CartPole
without its velocities) as shipped, with its LSTM, against the same experiment without one
(``model.use_lstm=false``, the same budget and settings otherwise), on held-out seeds.

Each run trains until its stop rule (evaluation return >= 200, or 500k env steps); its final policy is
then evaluated on EVAL_EPISODES deterministic episodes no run saw.

Targets, fixed before the runs: the LSTM's median return >= 200, the MLP's median below it.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results
from stats import interval_text, median_interval

EXPERIMENT = "ppo_stateless_cartpole"
SEEDS = [100, 101, 102, 103, 104]
EVAL_EPISODES, EVAL_SEED = 20, 50_000
TARGET = 200.0
SIDES = {"lstm": [], "mlp": ["model.use_lstm=false"]}


def run(side: str, seed: int, runs: Path) -> dict[str, Any]:
    from rich.console import Console

    from rl_app.policy.evaluate import evaluate
    from rl_app.training.run import train

    quiet = Console(file=io.StringIO())
    began = time.monotonic()
    summary = train(EXPERIMENT, [f"seed={seed}", *SIDES[side]], runs_root=runs, console=quiet)
    seconds = time.monotonic() - began
    report = evaluate(str(summary.run_dir), episodes=EVAL_EPISODES, seed=EVAL_SEED, console=quiet)
    row = {
        "seed": seed,
        "return": report["return"]["mean"],
        "timesteps": summary.timesteps,
        "best_eval_return": summary.best_eval_return,
        "seconds": round(seconds, 1),
    }
    print(f"{side} seed {seed}: {row}", flush=True)
    return row


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Memory: LSTM against MLP on CartPole without velocities, {results['date']}",
        "",
        f"`{EXPERIMENT}` as shipped and with `model.use_lstm=false`; each run's final policy evaluated on "
        f"{EVAL_EPISODES} deterministic episodes (seeds {EVAL_SEED}+); medians over held-out seeds "
        f"{SEEDS[0]}-{SEEDS[-1]}, bootstrap 95 % intervals. Targets, fixed before the runs: the LSTM's "
        f"median >= {TARGET:g}, the MLP's below it.",
        "",
        "| model | return of the final policy | env steps trained | seconds per run | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for side, case in results["sides"].items():
        target = f">= {TARGET:g}" if side == "lstm" else f"< {TARGET:g}"
        lines.append(
            f"| {side} | {interval_text(case['return'])} | {interval_text(case['timesteps'], 0)} | "
            f"{interval_text(case['seconds'], 0)} | {target} | {'yes' if case['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, help="only the first N held-out seeds (a quick look)")
    args = parser.parse_args()
    seeds = SEEDS[: args.seeds] if args.seeds else SEEDS
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    runs = Path(tempfile.mkdtemp(prefix="rl_app-memory-"))
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for seed in seeds:  # interleaved: drift on a shared machine hits both alike
        for side in SIDES:
            rows[side].append(run(side, seed, runs))
    sides = {}
    for side, side_rows in rows.items():
        summary = median_interval([r["return"] for r in side_rows])
        sides[side] = {
            "runs": side_rows,
            "return": summary,
            "timesteps": median_interval([r["timesteps"] for r in side_rows]),
            "seconds": median_interval([r["seconds"] for r in side_rows]),
            "met": summary["median"] >= TARGET if side == "lstm" else summary["median"] < TARGET,
        }
    results = {"date": stamp, "experiment": EXPERIMENT, "seeds": seeds, "target": TARGET, "sides": sides}
    write_results(f"memory-{stamp}", results, markdown(results))


if __name__ == "__main__":
    main()
