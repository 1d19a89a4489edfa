"""The small read-only commands: ``list``, ``show`` and ``runs``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from rl_app.config import available_experiments, experiments_dir, load_experiment
from rl_app.config.loader import experiment_path, read_with_extends
from rl_app.console.tables import Column, fitted_table, output_console


def list_experiments(console: Console | None = None) -> None:
    """Print the shipped experiments with algorithm, env and description."""
    console = console or Console()
    table = Table(title=f"Experiments in {experiments_dir()}", title_justify="left")
    for column in ("name", "algorithm", "env", "description"):
        table.add_column(column)
    for name in available_experiments():
        data = read_with_extends(experiment_path(name))
        env = data.get("env")
        env_id = env.get("id") if isinstance(env, dict) else env
        table.add_row(name, str(data.get("algorithm", "?")), str(env_id), str(data.get("description", "")))
    console.print(table)


def show_experiment(name: str, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Print the fully resolved config: schema defaults + YAML + overrides + RLlib defaults."""
    from rl_app.cluster.resources import local_cpu_count, local_gpu_count, plan_resources
    from rl_app.library_logs import capture_rllib_logs
    from rl_app.training.backends import prepare_backend

    capture_rllib_logs()  # the env made for its spaces, RLlib's config: their warnings are not ours
    loaded = load_experiment(name, overrides)
    plan = plan_resources(loaded.config, local_cpu_count(), local_gpu_count())
    resolved, _ = prepare_backend(loaded.config, plan, loaded.source)
    print(f"# {name}: {loaded.source}{''.join(' --set ' + o for o in loaded.overrides)}")
    print(f"# resources on this machine: {plan.describe()}")
    print(yaml.safe_dump(resolved, sort_keys=False), end="")


RUN_COLUMNS = [
    Column("run"),
    Column("env", optional=True),
    Column("status"),
    Column("iter", "right", optional=True),
    Column("timesteps", "right", optional=True),
    Column("best return", "right"),
    Column("checkpoint", optional=True),
]


def list_runs(runs_root: Path, console: Console | None = None, as_json: bool = False) -> None:
    """Print every run under ``runs_root``: experiment, env, status, best return, timesteps, checkpoint
    (``as_json``: one JSON list, for scripts)."""
    from rl_app.errors import UserError
    from rl_app.runs.listing import find_runs

    if not runs_root.is_dir():
        raise UserError(f"runs folder '{runs_root}' does not exist (train something first, or --runs-dir)")
    found = find_runs(runs_root)
    if as_json:
        print(json.dumps([row.as_json(runs_root) for row in found], indent=2))
        return
    console = console or output_console()
    rows = [
        [
            str(row.path.relative_to(runs_root)),
            row.env,
            row.status,
            str(row.iterations),
            f"{row.timesteps:,}",
            "" if math.isnan(row.best_return) else f"{row.best_return:.1f}",
            row.last_checkpoint,
        ]
        for row in found
    ]
    columns = RUN_COLUMNS
    if any(row.mlflow_run_id for row in found):
        columns = [*RUN_COLUMNS, Column("mlflow run", optional=True)]
        for cells, row in zip(rows, found, strict=True):
            cells.append(row.mlflow_run_id)
    console.print(fitted_table(f"Runs in {runs_root}", columns, rows, console.width))
