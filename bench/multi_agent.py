"""Several agents (make bench-multi-agent): the two shipped multi-agent experiments as shipped, on
seeds held out from their tuning, each final policy evaluated on episodes no run saw.

- ppo_simple_spread (cooperative: three agents, one shared policy): the return of 100 deterministic
  episodes, beside a random policy and a hand-written controller (bench/spread_controller.py) on
  the same episodes.
- ppo_tictactoe_selfplay (self-play): 200 games against a random player, the learner first and
  second in turn: its win and loss rates.

Targets, fixed before the held-out runs (below): TARGETS.
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
from spread_controller import controller_returns
from stats import interval_text, median_interval, paired_difference

SPREAD, TICTACTOE = "ppo_simple_spread", "ppo_tictactoe_selfplay"
SEEDS = {SPREAD: [100, 101, 102], TICTACTOE: [100, 101, 102, 103, 104]}
EPISODES = {SPREAD: 100, TICTACTOE: 200}
EVAL_SEED = 50_000
TARGETS = {
    SPREAD: {"return": -62.0},  # median over the held-out seeds (random actions -84, standing still -76)
    TICTACTOE: {"win_rate": 0.70, "loss_rate": 0.25},  # medians, against a random player
}


def _train_and_evaluate(name: str, seed: int, runs: Path, random_policy: str) -> dict[str, Any]:
    from rich.console import Console

    from rl_app.policy.evaluate import evaluate
    from rl_app.training.run import train

    quiet = Console(file=io.StringIO())
    began = time.monotonic()
    summary = train(name, [f"seed={seed}"], runs_root=runs, console=quiet)
    seconds = time.monotonic() - began
    episodes = EPISODES[name]
    trained = evaluate(str(summary.run_dir), episodes=episodes, seed=EVAL_SEED, console=quiet)
    against = evaluate(
        str(summary.run_dir),
        episodes=episodes,
        seed=EVAL_SEED,
        console=quiet,
        random_policies=(random_policy,),
    )
    return {
        "seed": seed,
        "timesteps": summary.timesteps,
        "seconds": round(seconds, 1),
        "trained": trained,
        "random": against,
    }


def spread_row(seed: int, runs: Path) -> dict[str, Any]:
    found = _train_and_evaluate(SPREAD, seed, runs, "shared")
    row = {
        "seed": seed,
        "return": found["trained"]["return"]["mean"],
        "random_return": found["random"]["return"]["mean"],
        "timesteps": found["timesteps"],
        "seconds": found["seconds"],
    }
    print(f"{SPREAD} seed {seed}: {row}", flush=True)
    return row


def tictactoe_row(seed: int, runs: Path) -> dict[str, Any]:
    found = _train_and_evaluate(TICTACTOE, seed, runs, "opponent")
    policies = found["random"]["policies"]
    row = {
        "seed": seed,
        "win_rate": policies["learner"]["win_rate"],
        "loss_rate": policies["opponent"]["win_rate"],  # the random player's wins
        "timesteps": found["timesteps"],
        "seconds": found["seconds"],
    }
    print(f"{TICTACTOE} seed {seed}: {row}", flush=True)
    return row


def markdown(results: dict[str, Any]) -> str:
    spread, tictactoe = results[SPREAD], results[TICTACTOE]
    lines = [f"# Several agents, {results['date']}", ""]
    if spread:
        target = TARGETS[SPREAD]["return"]
        lines += [
            f"`{SPREAD}` as shipped on held-out seeds {', '.join(map(str, spread['seeds']))}; "
            f"each final policy (one, shared by the three agents) on {EPISODES[SPREAD]} deterministic "
            f"episodes (seeds {EVAL_SEED}+), "
            "the sum of the agents' returns; medians with bootstrap 95 % intervals. Beside it on the same "
            "episodes: the agents acting at random, and a hand-written controller that assigns each agent "
            "a landmark and steers to it (bench/spread_controller.py).",
            "",
            "| policy | return | env steps | seconds per run |",
            "|---|---|---|---|",
            f"| rl_app (PPO, shared policy) | {interval_text(spread['return'])} | "
            f"{interval_text(spread['timesteps'], 0)} | {interval_text(spread['seconds'], 0)} |",
            f"| random actions | {interval_text(spread['random_return'])} | | |",
            f"| hand-written controller | {spread['controller_return']:.1f} | | |",
            "",
            f"Trained minus random, paired by seed: {interval_text(spread['over_random'])}. "
            f"Target, fixed before the run: a median return of at least {target:g} "
            f"({'met' if spread['met'] else 'missed'}).",
            "",
        ]
    if tictactoe:
        target = TARGETS[TICTACTOE]
        lines += [
            f"`{TICTACTOE}` as shipped on held-out seeds {', '.join(map(str, tictactoe['seeds']))}; "
            "each final learner against a random player (legal moves only) in "
            f"{EPISODES[TICTACTOE]} games, first and second in turn.",
            "",
            "| games won | games lost | env steps | seconds per run |",
            "|---|---|---|---|",
            f"| {interval_text(tictactoe['win_rate'], 2)} | {interval_text(tictactoe['loss_rate'], 2)} | "
            f"{interval_text(tictactoe['timesteps'], 0)} | {interval_text(tictactoe['seconds'], 0)} |",
            "",
            f"Targets, fixed before the run: wins at least {target['win_rate']:.0%} and losses at most "
            f"{target['loss_rate']:.0%} (medians; {'met' if tictactoe['met'] else 'missed'}).",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=[SPREAD, TICTACTOE], help="one of the two experiments")
    parser.add_argument("--seeds", type=int, help="only the first N held-out seeds (a quick look)")
    args = parser.parse_args()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    runs = Path(tempfile.mkdtemp(prefix="rl_app-multi-agent-"))
    results: dict[str, Any] = {"date": stamp, "targets": TARGETS, SPREAD: None, TICTACTOE: None}
    if args.only in (None, SPREAD):
        seeds = SEEDS[SPREAD][: args.seeds] if args.seeds else SEEDS[SPREAD]
        rows = [spread_row(seed, runs) for seed in seeds]
        returns = [r["return"] for r in rows]
        summary = median_interval(returns)
        results[SPREAD] = {
            "seeds": seeds,
            "runs": rows,
            "return": summary,
            "random_return": median_interval([r["random_return"] for r in rows]),
            "over_random": paired_difference(returns, [r["random_return"] for r in rows]),
            "controller_return": controller_returns(EPISODES[SPREAD], EVAL_SEED)["mean"],
            "timesteps": median_interval([r["timesteps"] for r in rows]),
            "seconds": median_interval([r["seconds"] for r in rows]),
            "met": summary["median"] >= TARGETS[SPREAD]["return"],
        }
    if args.only in (None, TICTACTOE):
        seeds = SEEDS[TICTACTOE][: args.seeds] if args.seeds else SEEDS[TICTACTOE]
        rows = [tictactoe_row(seed, runs) for seed in seeds]
        wins = median_interval([r["win_rate"] for r in rows])
        losses = median_interval([r["loss_rate"] for r in rows])
        results[TICTACTOE] = {
            "seeds": seeds,
            "runs": rows,
            "win_rate": wins,
            "loss_rate": losses,
            "timesteps": median_interval([r["timesteps"] for r in rows]),
            "seconds": median_interval([r["seconds"] for r in rows]),
            "met": wins["median"] >= TARGETS[TICTACTOE]["win_rate"]
            and losses["median"] <= TARGETS[TICTACTOE]["loss_rate"],
        }
    write_results(f"multi-agent-{stamp}", results, markdown(results))


if __name__ == "__main__":
    main()
