"""``progress.csv``: one row of :class:`IterationMetrics` per training iteration."""

from __future__ import annotations

import csv
import math
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

# The sweep metrics (and the plots' choice of curve) by name, as progress.csv columns.
METRIC_COLUMNS = {"return": "return_mean", "eval_return": "eval_return_mean"}


@dataclass
class IterationMetrics:
    """The numbers of one training iteration that we report and log."""

    iteration: int
    timesteps: int
    episodes: int
    return_mean: float
    return_min: float
    return_max: float
    episode_len_mean: float
    eval_return_mean: float
    steps_per_s: float
    iteration_s: float
    elapsed_s: float
    evaluation_s: float = math.nan  # of iteration_s, the seconds spent evaluating (NaN: not timed)
    cpu_percent: float = math.nan
    memory_mb: float = math.nan
    system_memory_percent: float = math.nan
    gpu_util_percent: float = math.nan
    gpu_memory_mb: float = math.nan
    env_failures: float = math.nan  # env step()/reset() failures so far (envs recreated, episodes dropped)
    runner_restarts: float = math.nan  # crashed remote env runners recreated so far
    runners_alive: float = math.nan  # remote env runners sampling now (none: sampling on the driver)
    # Several agents: each policy's mean episode return (the sum over the agents it acts for).
    policy_returns: dict[str, float] = field(default_factory=dict)
    eval_policy_returns: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # events of the iteration for the live line

    def values(self) -> dict[str, float]:
        """Every number by its progress.csv column, each policy's returns as ``return_mean/<policy>``
        and ``eval_return_mean/<policy>``."""
        found = {k: v for k, v in asdict(self).items() if k in CSV_FIELDS}
        for policy, value in self.policy_returns.items():
            found[f"return_mean/{policy}"] = value
        for policy, value in self.eval_policy_returns.items():
            found[f"eval_return_mean/{policy}"] = value
        return found


PER_POLICY = ("policy_returns", "eval_policy_returns")
CSV_FIELDS = [name for name in IterationMetrics.__dataclass_fields__ if name not in (*PER_POLICY, "notes")]


def policy_columns(policies: list[str]) -> list[str]:
    """The progress.csv columns of the policies of several agents, after :data:`CSV_FIELDS`."""
    return [f"return_mean/{p}" for p in policies] + [f"eval_return_mean/{p}" for p in policies]


def number_or_nan(value: Any) -> float:
    """``value`` as a float when it is a number (numpy's float32 too: RLlib's episode returns take the
    rewards' dtype), else NaN (results leave out what they lack)."""
    return float(value) if isinstance(value, numbers.Real) else math.nan


def finite_sum(total: float, value: float) -> float:
    """``total + value``, ignoring a NaN ``value`` (a number not measured)."""
    return total if math.isnan(value) else total + value


def finite_max(current: float, value: float) -> float:
    """The larger of the two, ignoring a NaN ``value``."""
    return current if math.isnan(value) else max(current, value)


def read_progress(progress_csv: Path) -> list[dict[str, float]]:
    """Every row of a progress.csv as numbers (empty cells are NaN)."""
    with progress_csv.open(newline="") as handle:
        return [
            {k: float(v) if v != "" else math.nan for k, v in row.items()} for row in csv.DictReader(handle)
        ]


@dataclass
class StartPoint:
    """Where a resumed run picks up: what the kept part of ``progress.csv`` says."""

    iteration: int = 0
    timesteps: int = 0
    elapsed_s: float = 0.0
    best_return: float = -math.inf
    best_eval_return: float = -math.inf
    last_return: float = math.nan
    evaluation_s: float = 0.0  # the kept rows' evaluation seconds (rows from before it was timed: none)
    rows: list[dict[str, str]] = field(default_factory=list)


def start_point_from_progress(progress_csv: Path, up_to_iteration: int) -> StartPoint:
    """The rows of ``progress.csv`` up to the checkpoint's iteration; later ones are redone."""
    start = StartPoint(iteration=up_to_iteration)
    if not progress_csv.is_file():
        return start
    with progress_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if int(row["iteration"]) > up_to_iteration:
                break
            start.rows.append(row)
            start.timesteps = int(row["timesteps"])
            start.elapsed_s = float(row["elapsed_s"])
            start.last_return = float(row["return_mean"] or "nan")
            start.best_return = finite_max(start.best_return, start.last_return)
            start.best_eval_return = finite_max(
                start.best_eval_return, float(row["eval_return_mean"] or "nan")
            )
            start.evaluation_s = finite_sum(start.evaluation_s, float(row.get("evaluation_s") or "nan"))
    return start


class ProgressWriter:
    """Writes ``progress.csv`` anew: the kept rows of a resumed run first, then one row per iteration."""

    def __init__(
        self, handle: TextIO, kept_rows: list[dict[str, str]], policies: list[str] | None = None
    ) -> None:
        self.handle = handle
        self.fields = CSV_FIELDS + policy_columns(policies or [])
        self.writer = csv.DictWriter(handle, fieldnames=self.fields, restval="", extrasaction="ignore")
        self.writer.writeheader()
        self.writer.writerows({k: row.get(k, "") for k in self.fields} for row in kept_rows)
        handle.flush()

    def write(self, metrics: IterationMetrics) -> None:
        self.writer.writerow(metrics.values())
        self.handle.flush()
