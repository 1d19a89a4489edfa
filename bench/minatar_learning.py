"""MinAtar Breakout against a published figure at equal env steps (make bench-learning-minatar).

``ppo_minatar_breakout`` as shipped (gymnax-blines' PPO settings for Breakout-MinAtar, in gymnax's
setting: no sticky actions, episodes of at most 1,000 steps) trains on each held-out seed of SEEDS
in a fresh process. At each of MARKS (at the first iteration past it: 8,192 steps an iteration) its
policy plays EVAL_EPISODES episodes, reset with seeds 1000, 1001, ..., with sampled actions, as
gymnax-blines evaluated its agent.

The published figure: gymnax-blines' PPO log for Breakout-MinAtar (PUBLISHED, with SOURCE), one
seed, the mean of 164 evaluation episodes with sampled actions at each point.

Target, fixed before the runs: the median over SEEDS of the mean return at TARGET_MARK steps >=
TARGET, the published value there. Three seeds: the intervals are wide, and said to be.

    python bench/minatar_learning.py [--seeds 100,101,102]
    python bench/minatar_learning.py --render bench/results/minatar-learning-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, RESULTS, run_worker, write_results
from parity import Case, ours
from stats import interval_text, median_interval

EXPERIMENT = "ppo_minatar_breakout"
SEEDS = (100, 101, 102)
MARKS = (320_000, 640_000, 1_280_000, 2_560_000, 3_200_000, 5_120_000)
EVAL_EPISODES = 50
SOURCE = (
    "gymnax-blines (github.com/RobertTLange/gymnax-blines), agents/Breakout-MinAtar/ppo.yaml and the "
    "evaluation log kept in agents/Breakout-MinAtar/ppo.pkl (commit c7dd018): PPO, one seed, "
    "the mean of 164 evaluation episodes with sampled actions"
)
PUBLISHED = {320_000: 8.37, 640_000: 15.45, 3_200_000: 15.54, 5_120_000: 21.95}
TARGET_MARK, TARGET = 5_120_000, 21.95


def case(seeds: tuple[int, ...]) -> Case:
    return Case(EXPERIMENT, marks=MARKS, seeds=seeds, eval_episodes=EVAL_EPISODES, modes=("sampled",))


def run_seed(seed: int) -> dict[str, Any]:
    """One seed's training and evaluations, in a fresh process (this script's ``--worker``)."""
    return run_worker(__file__, str(seed))


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mark: each seed's mean return, their median with its interval, the published value."""
    rows = []
    for index, mark in enumerate(MARKS):
        means = [sum(run["marks"][index]["sampled"]) / EVAL_EPISODES for run in runs]
        rows.append(
            {
                "mark": mark,
                "steps": [run["marks"][index]["steps"] for run in runs],
                "minutes": [round(run["marks"][index]["wall_s"] / 60, 1) for run in runs],
                "per_seed": means,
                "median": median_interval(means),
                "published": PUBLISHED.get(mark),
            }
        )
    return rows


def plot(results: dict[str, Any], out: Path) -> None:
    from rl_app.console.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    rows = results["summary"]
    for index, seed in enumerate(results["seeds"]):
        values = [row["per_seed"][index] for row in rows]
        ax.plot(MARKS, values, ":", color="grey", lw=1, label="each seed" if index == 0 else None)
        ax.annotate(
            f"seed {seed}", (MARKS[-1], values[-1]), xytext=(4, 0), textcoords="offset points", fontsize=7
        )
    ax.plot(
        MARKS,
        [row["median"]["median"] for row in rows],
        "o-",
        color="tab:blue",
        label="rl_app, median of seeds",
    )
    ax.fill_between(
        MARKS,
        [row["median"]["low"] for row in rows],
        [row["median"]["high"] for row in rows],
        color="tab:blue",
        alpha=0.15,
        label="bootstrap 95 % interval",
    )
    ax.plot(
        list(PUBLISHED),
        list(PUBLISHED.values()),
        "s--",
        color="tab:orange",
        label="gymnax-blines PPO (one seed)",
    )
    ax.axhline(TARGET, color="tab:red", ls=":", label=f"target at {TARGET_MARK:,} steps ({TARGET:g})")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e6:g}M")
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"mean return, {EVAL_EPISODES} episodes, sampled actions")
    ax.set_title(f"{EXPERIMENT}: seeds {', '.join(map(str, results['seeds']))} on {results['cores']} CPUs")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    seeds = ", ".join(map(str, results["seeds"]))
    lines = [
        f"# MinAtar Breakout against a published figure, {results['date']}",
        "",
        f"`{EXPERIMENT}` as shipped, held-out seeds {seeds}, on {results['cores']} CPUs. At each mark (the "
        f"first iteration past it) the policy played {EVAL_EPISODES} episodes with sampled actions; each "
        "seed's figure is their mean, and the table gives the median over seeds with a bootstrap 95 % "
        f"interval (with {len(results['seeds'])} seeds, about their range). Published: {SOURCE}. Target, "
        f"fixed before the runs: the median at {TARGET_MARK:,} steps >= {TARGET:g}.",
        "",
        "| env steps | rl_app median [95 % interval] | per seed | minutes, evaluations included (median) "
        "| published | rl_app / published |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["summary"]:
        published, median = row["published"], row["median"]
        ratio = ""
        if published:
            low, high = median["low"] / published, median["high"] / published
            ratio = f"{median['median'] / published:.2f}x [{low:.2f}, {high:.2f}]"
        minutes = sorted(row["minutes"])[len(row["minutes"]) // 2]
        lines.append(
            f"| {row['mark']:,} | {interval_text(median)} | {', '.join(f'{v:.1f}' for v in row['per_seed'])} "
            f"| {minutes:.1f} | {published if published is not None else ''} | {ratio} |"
        )
    lines += [
        "",
        f"Target: median {results['target']['median']:.1f} at {TARGET_MARK:,} steps against >= {TARGET:g}: "
        f"**{'met' if results['target']['met'] else 'missed'}**.",
        "",
        f"Curve: `{results['png']}`.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", help="comma-separated seeds (default: SEEDS)")
    parser.add_argument("--render", type=Path, help="rewrite the markdown and plot of a results JSON")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(ours(case((args.worker,)), args.worker)))
        return 0
    if args.render:
        results = json.loads(args.render.read_text())
        plot(results, REPO / results["png"])
        args.render.with_suffix(".md").write_text(markdown(results))
        return 0

    from rl_app.config import load_experiment

    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    tuned = set(load_experiment(EXPERIMENT).config.tuning_seeds) & set(seeds)
    if tuned:
        print(f"{EXPERIMENT}: seeds {sorted(tuned)} are its tuning seeds", file=sys.stderr)
        return 2
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    runs = []
    for seed in seeds:
        print(f"{EXPERIMENT}: seed {seed}", file=sys.stderr, flush=True)
        runs.append({"seed": seed, **run_seed(seed)})
    summary = summarize(runs)
    final = next(row for row in summary if row["mark"] == TARGET_MARK)["median"]["median"]
    png = RESULTS / f"minatar-learning-{stamp}.png"
    results = {
        "date": stamp,
        "cores": os.cpu_count(),
        "experiment": EXPERIMENT,
        "seeds": list(seeds),
        "eval_episodes": EVAL_EPISODES,
        "published": {"source": SOURCE, "points": {str(k): v for k, v in PUBLISHED.items()}},
        "target": {"mark": TARGET_MARK, "value": TARGET, "median": final, "met": final >= TARGET},
        "png": str(png.relative_to(REPO)),
        "runs": runs,
        "summary": summary,
    }
    write_results(f"minatar-learning-{stamp}", results, markdown(results))
    plot(results, png)
    return 0 if results["target"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
