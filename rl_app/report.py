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


def _run_title(run_dir: Path) -> str:
    import json

    try:
        meta = json.loads((run_dir / "metadata.json").read_text())
        return f"{meta.get('experiment', run_dir.parent.name)} / {run_dir.name}"
    except (OSError, ValueError):
        return f"{run_dir.parent.name} / {run_dir.name}"


def plot_comparison(run_dirs: list[Path], out_png: Path) -> Path:
    """Several runs on one chart: evaluation return where a run has one, else training return."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for run_dir in run_dirs:
        rows = read_progress(run_dir / "progress.csv")
        evals = [r for r in rows if not math.isnan(r["eval_return_mean"])]
        key, points = ("eval_return_mean", evals) if evals else ("return_mean", rows)
        points = [r for r in points if not math.isnan(r[key])]
        label = f"{_run_title(run_dir)} ({'evaluation' if evals else 'training'})"
        line = ax.plot(
            [r["timesteps"] for r in points],
            [r[key] for r in points],
            lw=2,
            marker="o" if evals else None,  # evaluations are sparse: show each one
            ms=5,
            label=label,
        )[0]
        if not evals and points:
            ax.fill_between(
                [r["timesteps"] for r in points],
                [r["return_min"] for r in points],
                [r["return_max"] for r in points],
                alpha=0.12,
                color=line.get_color(),
            )
    ax.set_xlabel("environment timesteps")
    ax.set_ylabel("mean episode return")
    ax.set_title(f"{len(run_dirs)} runs compared")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def report_runs(run_dirs: list[Path], out: Path | None = None) -> list[Path]:
    """Redraw each run's reward curve; with several runs also a comparison PNG. Returns the PNGs."""
    from rl_app.errors import UserError

    for run_dir in run_dirs:
        if not (run_dir / "progress.csv").is_file():
            raise UserError(f"run '{run_dir}' has no progress.csv (not a run folder, or nothing trained yet)")
    written = [
        plot_reward_curve(run_dir / "progress.csv", run_dir / "reward_curve.png", _run_title(run_dir))
        for run_dir in run_dirs
    ]
    if len(run_dirs) > 1:
        written.append(plot_comparison(run_dirs, out or Path("comparison.png")))
    for path in written:
        print(f"wrote {path}")
    return written
