"""Plots users would rather look at than read: reward curves as PNG."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_app.console.progress import format_value
from rl_app.runs.progress import METRIC_COLUMNS, read_progress

METRIC_LABELS = {"return": "mean episode return (training)", "eval_return": "mean evaluation return"}


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reward_curve_rows(progress_csv: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The progress rows with a training return, and those with an evaluation return: an iteration
    where no training episode ended can still have evaluated (a run's last, solving one often)."""
    progress = read_progress(progress_csv)
    return (
        [r for r in progress if not math.isnan(r["return_mean"])],
        [r for r in progress if not math.isnan(r["eval_return_mean"])],
    )


def plot_reward_curve(progress_csv: Path, out_png: Path, title: str) -> Path:
    """Episode return vs timesteps: the mean line with the min/max band, eval returns as dots."""
    plt = _pyplot()
    rows, evals = reward_curve_rows(progress_csv)
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
    if rows or evals:
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no episode finished yet", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


class RewardCurveProcess:
    """Draws a run's reward curve in a helper process started as training starts: matplotlib
    (slow to import) loads there meanwhile, and the drawing overlaps Ray's shutdown. Where the
    helper cannot start or fails, :meth:`wait` draws the curve in this process."""

    def __init__(self) -> None:
        self._asked: tuple[Path, Path, str] | None = None
        self._process: subprocess.Popen[str] | None = None
        with contextlib.suppress(OSError):  # no helper: wait() draws here
            self._process = subprocess.Popen(
                [sys.executable, "-m", "rl_app.console.plots"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )

    def draw(self, progress_csv: Path, out_png: Path, title: str) -> None:
        """Ask for the reward curve of ``progress_csv``; :meth:`wait` returns once it is written."""
        self._asked = (progress_csv, out_png, title)
        if self._process is None:
            return
        try:
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps([str(progress_csv), str(out_png), title]) + "\n")
            self._process.stdin.close()
        except OSError:  # the helper is gone: wait() draws here
            self.close()

    def wait(self, timeout_s: float = 60.0) -> Path | None:
        """The PNG asked for (None if nothing was), drawn here where the helper failed: this then
        raises what drawing raises (OSError for a disk that refuses it)."""
        if self._asked is None:
            self.close()
            return None
        if self._process is not None:
            try:
                if self._process.wait(timeout=timeout_s) == 0:
                    return self._asked[1]
            except subprocess.TimeoutExpired:
                self.close()
        return plot_reward_curve(*self._asked)

    def close(self) -> None:
        """Stop the helper if it still runs (a run that ends without asking for its curve)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()


def _draw_when_asked() -> int:
    """``python -m rl_app.console.plots``, :class:`RewardCurveProcess`'s helper: import matplotlib,
    then draw the reward curve asked for on stdin (one JSON line: progress.csv, PNG, title)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is for the training run
    _pyplot()
    asked = sys.stdin.readline()
    if not asked:  # the run ended without asking
        return 0
    progress_csv, out_png, title = json.loads(asked)
    plot_reward_curve(Path(progress_csv), Path(out_png), title)
    return 0


def _run_title(run_dir: Path) -> str:
    import json

    try:
        meta = json.loads((run_dir / "metadata.json").read_text())
        return f"{meta.get('experiment', run_dir.parent.name)} / {run_dir.name}"
    except (OSError, ValueError):
        return f"{run_dir.parent.name} / {run_dir.name}"


@dataclass
class Curve:
    """One run's line on the comparison chart."""

    label: str
    points: list[dict[str, float]]
    key: str  # eval_return_mean where the run evaluated, else return_mean
    identical_to: str | None = None  # an earlier run with exactly this curve (same seed)


def comparison_curves(run_dirs: list[Path]) -> list[Curve]:
    """Each run's curve: evaluation return where a run has one, else training return; a curve
    identical to an earlier run's says so (it would hide under it otherwise)."""
    curves: list[Curve] = []
    drawn: dict[tuple[tuple[float, float], ...], str] = {}
    for run_dir in run_dirs:
        rows = read_progress(run_dir / "progress.csv")
        evals = [r for r in rows if not math.isnan(r["eval_return_mean"])]
        key, points = ("eval_return_mean", evals) if evals else ("return_mean", rows)
        points = [r for r in points if not math.isnan(r[key])]
        title = _run_title(run_dir)
        curve = Curve(f"{title} ({'evaluation' if evals else 'training'})", points, key)
        first = drawn.setdefault(tuple((r["timesteps"], r[key]) for r in points), title)
        if first != title:
            curve.identical_to = first
            curve.label += f", identical to {first}"
        curves.append(curve)
    return curves


def plot_comparison(run_dirs: list[Path], out_png: Path) -> Path:
    """Several runs on one chart; identical curves dashed over the first, so each stays visible."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for curve in comparison_curves(run_dirs):
        evaluated = curve.key == "eval_return_mean"
        steps = [r["timesteps"] for r in curve.points]
        line = ax.plot(
            steps,
            [r[curve.key] for r in curve.points],
            lw=2,
            ls=(0, (4, 4)) if curve.identical_to else "-",
            marker="o" if evaluated else None,  # evaluations are sparse: show each one
            ms=5,
            label=curve.label,
        )[0]
        if not evaluated and curve.points:
            ax.fill_between(
                steps,
                [r["return_min"] for r in curve.points],
                [r["return_max"] for r in curve.points],
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
    """Redraw each run's reward curve; with several runs also a comparison PNG (default:
    ``<runs folder>/reports/<timestamp>/comparison.png``, next to the runs). Returns the PNGs."""
    from datetime import datetime

    from rl_app.errors import UserError

    for run_dir in run_dirs:
        if not (run_dir / "progress.csv").is_file():
            raise UserError(f"run '{run_dir}' has no progress.csv (not a run folder, or nothing trained yet)")
    written = [
        plot_reward_curve(run_dir / "progress.csv", run_dir / "reward_curve.png", _run_title(run_dir))
        for run_dir in run_dirs
    ]
    if len(run_dirs) > 1:
        if out is None:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            out = run_dirs[0].resolve().parent.parent / "reports" / stamp / "comparison.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        written.append(plot_comparison(run_dirs, out))
    for path in written:
        print(f"wrote {path}")
    return written


def _short_values(values: dict[str, Any]) -> str:
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={format_value(v)}" for key, v in values.items())


def plot_trial_curves(trials: list[Any], metric: str, out_png: Path, title: str, labelled: int = 8) -> Path:
    """Every sweep trial's learning curve on one chart; the best ``labelled`` named in the legend."""
    plt = _pyplot()
    key = METRIC_COLUMNS[metric]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for trial in sorted(trials, key=lambda t: t.rank, reverse=True):  # best drawn last, on top
        points = [h for h in trial.history if not math.isnan(h[key])]
        if not points:
            continue
        best = trial.rank == 1
        ax.plot(
            [h["timesteps"] for h in points],
            [h[key] for h in points],
            lw=3 if best else 1.3,
            alpha=1.0 if best else 0.75,
            ls="--" if trial.status in ("pruned", "error") else "-",
            marker="o" if metric == "eval_return" else None,  # evaluations are sparse: show each one
            ms=4,
            label=f"#{trial.rank} {_short_values(trial.values)}" if trial.rank <= labelled else None,
        )
    ax.set_xlabel("environment timesteps")
    ax.set_ylabel(METRIC_LABELS[metric])
    ax.set_title(f"{title} (dashed: pruned or errored)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: int(labels[i].split()[0][1:]))
        ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def plot_hyperparameters(trials: list[Any], space: dict[str, Any], metric: str, out_png: Path) -> Path:
    """One panel per swept key: each trial's final metric against its sampled value."""
    plt = _pyplot()
    keys = list(space)
    columns = min(3, len(keys))
    rows = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), dpi=110, squeeze=False)
    scored = [t for t in trials if math.isfinite(t.score)]
    for ax, key in zip(axes.flat, keys, strict=False):
        entry = space[key]
        if entry.kind not in ("choice", "grid"):
            xs = [float(t.values[key]) for t in scored]
            if entry.kind == "loguniform":
                ax.set_xscale("log")
        else:  # categorical: one position per listed value
            labels = [format_value(v) for v in entry.args]
            xs = [float(labels.index(format_value(t.values[key]))) for t in scored]
            ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize="small")
        ax.scatter(xs, [t.score for t in scored], c=[t.rank for t in scored], cmap="viridis_r", s=40)
        best = [t for t in scored if t.rank == 1]
        if best:
            ax.scatter(xs[scored.index(best[0])], best[0].score, s=160, facecolors="none", edgecolors="red")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    fig.suptitle(f"final {METRIC_LABELS[metric]} per trial (red circle: best)")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


if __name__ == "__main__":
    sys.exit(_draw_when_asked())
