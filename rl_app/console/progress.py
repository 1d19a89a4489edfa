"""Live training progress: a line per iteration (at most one a second), and the final summary."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console

from rl_app.runs.progress import IterationMetrics


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _fmt_return(value: float) -> str:
    return "     n/a" if math.isnan(value) else f"{value:8.1f}"


# Short iterations (ppo_cartpole's): a line for each would scroll the screen away.
MIN_SECONDS_BETWEEN_LINES = 1.0


class ProgressPrinter:
    """Prints a line per iteration (iteration, timesteps, return, steps/s, elapsed, ETA), at most
    one a second; an iteration with an evaluation always gets its line. progress.csv keeps NaN
    where no episode ended; only this line carries the latest return forward."""

    def __init__(self, console: Console, stop_timesteps: int | None, stop_time_s: float | None):
        self.console = console
        self.stop_timesteps = stop_timesteps
        self.stop_time_s = stop_time_s
        self.started = time.monotonic()
        self._last_line: float | None = None
        # Episodes longer than an iteration leave most iterations without a return of their
        # own; the line shows the latest one, marked "~" and dimmed as carried forward.
        self._latest_return = math.nan

    def eta_s(self, metrics: IterationMetrics) -> float:
        remaining = []
        if self.stop_timesteps and metrics.timesteps and metrics.elapsed_s > 0:
            rate = metrics.timesteps / metrics.elapsed_s
            remaining.append(max(0.0, self.stop_timesteps - metrics.timesteps) / rate)
        if self.stop_time_s:
            remaining.append(max(0.0, self.stop_time_s - metrics.elapsed_s))
        return min(remaining) if remaining else math.inf

    def header(self) -> None:
        self.console.print(
            "[bold] iter   timesteps     return   eval ret   steps/s   elapsed      ETA[/bold]"
        )

    def _return_cell(self, value: float) -> str:
        if math.isnan(value) and not math.isnan(self._latest_return):
            return f"[dim]~{self._latest_return:7.1f}[/dim]"
        if not math.isnan(value):
            self._latest_return = value
        return _fmt_return(value)

    def iteration(self, metrics: IterationMetrics) -> None:
        returned = self._return_cell(metrics.return_mean)
        now = time.monotonic()
        recent = self._last_line is not None and now - self._last_line < MIN_SECONDS_BETWEEN_LINES
        if recent and math.isnan(metrics.eval_return_mean) and not metrics.notes:
            return
        self._last_line = now
        self.console.print(
            f"{metrics.iteration:5d} {metrics.timesteps:11,d}   {returned}"
            f"   {_fmt_return(metrics.eval_return_mean)} {metrics.steps_per_s:9,.0f}"
            f"   {_fmt_duration(metrics.elapsed_s):>7}  {_fmt_duration(self.eta_s(metrics)):>7}"
            f"{_policy_cells(metrics)}{''.join(f'   ({note})' for note in metrics.notes)}",
            highlight=False,
        )


def _policy_cells(metrics: IterationMetrics) -> str:
    """Several policies: each one's training return (one policy's is the return column's)."""
    if len(metrics.policy_returns) < 2:
        return ""
    return "   " + "  ".join(f"{policy} {value:.2f}" for policy, value in metrics.policy_returns.items())


def sweep_console() -> Console:
    """A console for sweep tables: the terminal's width, or 140 columns in logs (rich's 80 truncates)."""
    import sys

    return Console(highlight=False, width=None if sys.stdout.isatty() else 140)


def format_value(value: object) -> str:
    """A sampled hyperparameter as a table cell: 4 significant digits for floats."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def trial_table(title: str, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    """A rich table of trials: id, status, crashes, iteration, timesteps, returns, sampled values."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    crashes = any(row.get("crashes") for row in rows)
    table.add_column("trial", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for column in ("crashes", "iter", "steps", "return", "eval"):
        if column != "crashes" or crashes:
            table.add_column(column, justify="right", no_wrap=True)
    for key in keys:
        table.add_column(key.rsplit(".", 1)[-1], justify="right")  # 'lr' for 'training.lr': tables are narrow
    for row in rows:
        table.add_row(
            str(row["trial"]),
            str(row["status"]),
            *([str(row.get("crashes") or "")] if crashes else []),
            str(row.get("iter", "")),
            f"{row['timesteps']:,}" if isinstance(row.get("timesteps"), int) else "",
            _fmt_return(float(row.get("return", math.nan))).strip(),
            _fmt_return(float(row.get("eval_return", math.nan))).strip(),
            *(format_value(row["values"].get(k, "")) for k in keys),
        )
    return table
