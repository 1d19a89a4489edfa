"""Plots users would rather look at than read: reward curves as PNG."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def read_progress(progress_csv: Path) -> list[dict[str, float]]:
    with progress_csv.open(newline="") as handle:
        return [
            {k: float(v) if v != "" else math.nan for k, v in row.items()} for row in csv.DictReader(handle)
        ]


def plot_reward_curve(progress_csv: Path, out_png: Path, title: str) -> Path:
    """Episode return vs timesteps: the mean line with the min/max band, eval returns as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_progress(progress_csv) if not math.isnan(r["return_mean"])]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if rows:
        steps = [r["timesteps"] for r in rows]
        ax.fill_between(
            steps,
            [r["return_min"] for r in rows],
            [r["return_max"] for r in rows],
            alpha=0.2,
            label="episode return min-max",
        )
        ax.plot(steps, [r["return_mean"] for r in rows], lw=2, label="episode return mean")
        evals = [r for r in rows if not math.isnan(r["eval_return_mean"])]
        if evals:
            ax.plot(
                [r["timesteps"] for r in evals],
                [r["eval_return_mean"] for r in evals],
                "o",
                label="evaluation return mean",
            )
    ax.set_xlabel("environment timesteps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no episode finished yet", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
