"""Offline RL learning figures (make bench-offline): each shipped offline experiment trained as shipped
on held-out seeds from the recordings of `make offline-data`, its final policy evaluated in the real
env on episodes no run saw, against the target fixed here before the runs.

Targets: bc_cartpole's median return >= 450; iql_pendulum's median return above the mean return of
the data it learns from (the behaviour policy with its random actions, from the recording's manifest).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results
from offline_data import make
from stats import interval_text, median_interval

REPO = Path(__file__).resolve().parents[1]
EVAL_EPISODES, EVAL_SEED = 20, 50_000  # evaluation episodes of each final policy, seeds no run used
CASES = {
    "bc_cartpole": {"dataset": "cartpole_expert", "seeds": list(range(100, 110)), "target": 450.0},
    "iql_pendulum": {"dataset": "pendulum_mixed", "seeds": [100, 101, 102], "target": "data"},
}


def run_case(name: str, seeds: list[int], data_dir: Path, runs: Path) -> dict[str, Any]:
    from rich.console import Console

    from rl_app.policy.evaluate import evaluate
    from rl_app.training.run import train

    case = CASES[name]
    dataset = make(str(case["dataset"]), data_dir)
    manifest = json.loads((dataset / "manifest.json").read_text())
    target = manifest["return_mean"] if case["target"] == "data" else float(case["target"])
    returns, seconds = [], []
    for seed in seeds:
        began = time.monotonic()
        summary = train(
            name,
            [f"seed={seed}", f"offline.input={dataset}"],
            runs_root=runs,
            console=Console(file=io.StringIO()),
        )
        seconds.append(time.monotonic() - began)
        report = evaluate(
            str(summary.run_dir), episodes=EVAL_EPISODES, seed=EVAL_SEED, console=Console(file=io.StringIO())
        )
        returns.append(report["return"]["mean"])
        print(f"{name} seed {seed}: return {returns[-1]:.1f} ({seconds[-1]:.0f} s)", flush=True)
    summary_stats = median_interval(returns)
    return {
        "seeds": seeds,
        "returns": returns,
        "train_seconds": seconds,
        "return": summary_stats,
        "target": target,
        "data_return_mean": manifest["return_mean"],
        "data_transitions": manifest["transitions"],
        "met": summary_stats["median"] >= target,
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Offline RL, {results['date']}",
        "",
        f"Each run trained as shipped on its seed, its final policy evaluated on {EVAL_EPISODES} "
        f"deterministic episodes (seeds {EVAL_SEED}+); medians over seeds, bootstrap 95 % intervals.",
        "",
        "| experiment | seeds | data's mean return | return of the learned policy | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, case in results["cases"].items():
        lines.append(
            f"| {name} | {case['seeds'][0]}-{case['seeds'][-1]} ({len(case['seeds'])}) | "
            f"{case['data_return_mean']:.1f} | {interval_text(case['return'])} | >= {case['target']:.1f} | "
            f"{'yes' if case['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", choices=[*CASES, []], help="default: all")
    parser.add_argument("--seeds", type=int, help="only the first N held-out seeds (a quick look)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data")
    args = parser.parse_args()
    import tempfile

    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    results: dict[str, Any] = {"date": stamp, "eval_episodes": EVAL_EPISODES, "cases": {}}
    runs = Path(tempfile.mkdtemp(prefix="rl_app-offline-"))  # kept: Ray logs into the runs until exit
    for name in args.cases or CASES:
        seeds = CASES[name]["seeds"][: args.seeds] if args.seeds else CASES[name]["seeds"]
        results["cases"][name] = run_case(name, seeds, args.data_dir, runs)  # type: ignore[arg-type]
    write_results(f"offline-{stamp}", results, markdown(results))


if __name__ == "__main__":
    main()
