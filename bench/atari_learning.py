"""An Atari agent that visibly learns on a small machine (make bench-learning-atari): ppo_breakout
trained for a fixed hour of wall clock on this machine's CPUs, its curve and its final policy.

The run trains ``ppo_breakout`` as shipped (CleanRL's ppo_atari settings, not tuned here) with seed
SEED, stopping at BUDGET_S seconds of training. Its final policy then plays EVAL_EPISODES whole games
(five lives, the real score, no reward clipping) with sampled actions, as RL Zoo evaluates its Atari
agents; a uniformly random policy plays the same games for scale. The curve is the run's evaluation
return (8 games every 25 iterations) against env steps and minutes.

Target, fixed before the run: the final policy's median score over the EVAL_EPISODES games >= TARGET
(random play scores about 1.7, the DQN paper's figure). One seed: the interval is over the games of
one run, not over runs, and says nothing of the seed-to-seed spread.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, write_results
from stats import interval_text, median_interval

EXPERIMENT = "ppo_breakout"
SEED = 100
BUDGET_S = 3600
EVAL_EPISODES, EVAL_SEED = 20, 50_000
TARGET = 10.0


def random_scores(episodes: int, seed: int) -> list[float]:
    """Whole games of uniformly random play on the evaluation env, from the evaluation's seeds."""
    import numpy as np

    from rl_app.config import load_experiment
    from rl_app.envs import make_env

    env = make_env(load_experiment(EXPERIMENT).config.env, evaluation=True)
    rng = np.random.default_rng(seed)
    scores = []
    try:
        for episode in range(episodes):
            env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
                total += float(reward)
                done = terminated or truncated
            scores.append(total)
    finally:
        env.close()
    return scores


def curve(progress_csv: Path) -> list[dict[str, float]]:
    with progress_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    points = []
    for row in rows:
        value = float(row["eval_return_mean"] or "nan")
        if not math.isnan(value):
            points.append(
                {
                    "timesteps": int(row["timesteps"]),
                    "minutes": round(float(row["elapsed_s"]) / 60, 2),
                    "eval_return_mean": value,
                }
            )
    return points


def plot(points: list[dict[str, float]], random_median: float, out: Path) -> None:
    from rl_app.console.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot([p["timesteps"] for p in points], [p["eval_return_mean"] for p in points], "o-", label=EXPERIMENT)
    ax.axhline(random_median, color="grey", ls="--", label=f"random play ({random_median:g})")
    ax.axhline(TARGET, color="tab:red", ls=":", label=f"target ({TARGET:g})")
    if points and points[-1]["timesteps"] and points[-1]["minutes"]:
        per_step = points[-1]["minutes"] / points[-1]["timesteps"]
        top = ax.secondary_xaxis("top", functions=(lambda x: x * per_step, lambda m: m / per_step))
        top.set_xlabel("minutes of training (at the run's mean rate)")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("score, whole game (mean of 8 games)")
    ax.set_title(f"{EXPERIMENT}: Breakout on {os.cpu_count()} CPUs, seed {SEED}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    final, random = results["final"], results["random"]
    lines = [
        f"# Atari learning on {results['cores']} CPUs, {results['date']}",
        "",
        *(
            [
                f"The training is an earlier run of this bench ({results['from_run']}); its final policy "
                "was evaluated again here.",
                "",
            ]
            if results.get("from_run")
            else []
        ),
        f"`{EXPERIMENT}` as shipped, seed {SEED}, trained for {results['budget_s'] // 60} minutes of wall "
        f"clock: {results['timesteps']:,} env steps in {results['iterations']} iterations. The final policy "
        f"played {EVAL_EPISODES} whole games (sampled actions, the real score); random play the same games. "
        f"Medians with bootstrap 95 % intervals over those games (one run: no seed-to-seed spread). Target, "
        f"fixed before the run: the final median >= {TARGET:g}.",
        "",
        "| policy | median score | mean | target | met |",
        "|---|---|---|---|---|",
        f"| {EXPERIMENT} after {results['budget_s'] // 60} min | {interval_text(final['summary'])} | "
        f"{final['mean']:.1f} | >= {TARGET:g} | {'yes' if results['met'] else 'no'} |",
        f"| random | {interval_text(random['summary'])} | {random['mean']:.1f} | | |",
        "",
        f"Curve: `{results['png']}` (the run's evaluations: 8 games every 25 iterations).",
        "",
        "| env steps | minutes | evaluation score (mean of 8 games) |",
        "|---|---|---|",
    ]
    lines += [
        f"| {p['timesteps']:,} | {p['minutes']:.0f} | {p['eval_return_mean']:.1f} |" for p in results["curve"]
    ]
    return "\n".join(lines) + "\n"


def trained_run(budget_s: int) -> tuple[Path, int, int, float]:
    """Train the experiment for ``budget_s`` seconds: (run folder, env steps, iterations, seconds)."""
    from rich.console import Console

    from rl_app.training.run import train

    runs = Path(tempfile.mkdtemp(prefix="rl_app-atari-"))
    began = time.monotonic()
    summary = train(
        EXPERIMENT, [f"seed={SEED}", f"stop.time_s={budget_s}"], runs_root=runs, console=Console()
    )
    return summary.run_dir, summary.timesteps, summary.iterations, time.monotonic() - began


def earlier_run(run_dir: Path) -> tuple[Path, int, int, float]:
    """An earlier run of this bench, as its progress.csv ends: (run folder, env steps, iterations,
    seconds)."""
    with (run_dir / "progress.csv").open() as handle:
        last = list(csv.DictReader(handle))[-1]
    return run_dir, int(last["timesteps"]), int(last["iteration"]), float(last["elapsed_s"])


def main() -> None:
    from rich.console import Console

    from rl_app.policy.evaluate import evaluate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=int, default=BUDGET_S, help="seconds of training (a quick look)")
    parser.add_argument(
        "--from-run",
        type=Path,
        help="no training: evaluate the final policy of this earlier run of the bench (its run folder) again",
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    run_dir, timesteps, iterations, trained_s = (
        earlier_run(args.from_run) if args.from_run else trained_run(args.budget_s)
    )
    quiet = Console(file=io.StringIO())
    report = evaluate(str(run_dir), episodes=EVAL_EPISODES, seed=EVAL_SEED, explore=True, console=quiet)
    scores = [float(e["episode_return"]) for e in report["per_episode"]]
    baseline = random_scores(EVAL_EPISODES, EVAL_SEED)
    points = curve(run_dir / "progress.csv")
    png = RESULTS / f"atari-learning-{stamp}.png"
    RESULTS.mkdir(exist_ok=True)
    shutil.copy(run_dir / "progress.csv", RESULTS / f"atari-learning-{stamp}-progress.csv")
    final = median_interval(scores)
    results = {
        "date": stamp,
        "experiment": EXPERIMENT,
        "seed": SEED,
        "cores": os.cpu_count(),
        "budget_s": args.budget_s,
        "seconds": round(trained_s, 1),
        "timesteps": timesteps,
        "iterations": iterations,
        "from_run": str(args.from_run) if args.from_run else None,
        "checkpoint": report["checkpoint"],
        "target": TARGET,
        "final": {
            "scores": scores,
            "lengths": [e["length"] for e in report["per_episode"]],
            "summary": final,
            "mean": sum(scores) / len(scores),
        },
        "random": {
            "scores": baseline,
            "summary": median_interval(baseline),
            "mean": sum(baseline) / len(baseline),
        },
        "met": final["median"] >= TARGET,
        "curve": points,
        "png": f"bench/results/{png.name}",
    }
    write_results(f"atari-learning-{stamp}", results, markdown(results))
    plot(points, results["random"]["summary"]["median"], png)


if __name__ == "__main__":
    main()
