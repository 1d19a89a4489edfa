"""The small read-only commands: ``list`` and ``show``."""

from __future__ import annotations

import yaml
from rich.console import Console
from rich.table import Table

from rl_app.config import available_experiments, experiments_dir, load_experiment
from rl_app.config.loader import _read_with_extends, experiment_path


def list_experiments(console: Console | None = None) -> None:
    """Print the shipped experiments with algorithm, env and description."""
    console = console or Console()
    table = Table(title=f"Experiments in {experiments_dir()}", title_justify="left")
    for column in ("name", "algorithm", "env", "description"):
        table.add_column(column)
    for name in available_experiments():
        data = _read_with_extends(experiment_path(name))
        env = data.get("env")
        env_id = env.get("id") if isinstance(env, dict) else env
        table.add_row(name, str(data.get("algorithm", "?")), str(env_id), str(data.get("description", "")))
    console.print(table)


def show_experiment(name: str, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Print the fully resolved config: schema defaults + YAML + overrides + RLlib defaults."""
    from rl_app.resources import local_cpu_count, local_gpu_count, plan_resources
    from rl_app.rllib_adapter import build_algorithm_config, resolved_settings

    loaded = load_experiment(name, overrides)
    plan = plan_resources(loaded.config, local_cpu_count(), local_gpu_count())
    config = build_algorithm_config(loaded.config, plan, loaded.source)
    print(f"# {name}: {loaded.source}{''.join(' --set ' + o for o in loaded.overrides)}")
    print(f"# resources on this machine: {plan.describe()}")
    print(yaml.safe_dump(resolved_settings(loaded.config, config), sort_keys=False), end="")
