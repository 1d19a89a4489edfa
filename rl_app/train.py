"""Train a named experiment: the iteration loop, stop rules, checkpoints, signals."""

from __future__ import annotations

import csv
import math
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from rl_app.checkpoints import save_checkpoint
from rl_app.config import load_experiment
from rl_app.progress import CSV_FIELDS, IterationMetrics, ProgressPrinter
from rl_app.runs import new_run_dir, write_json, write_run_metadata


@dataclass
class RunSummary:
    run_dir: Path
    status: str  # finished | interrupted | failed
    stop_reason: str
    iterations: int
    timesteps: int
    best_return: float
    best_eval_return: float
    final_return: float
    last_checkpoint: Path | None
    elapsed_s: float


class Interrupted(Exception):
    """SIGTERM (or SIGINT) arrived; training stops after a final checkpoint."""


@contextmanager
def _interrupts_raise() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def metrics_from_result(
    result: dict[str, Any], previous_timesteps: int, elapsed_s: float
) -> IterationMetrics:
    """Pick our reported numbers out of one RLlib ``Algorithm.train()`` result."""
    runners = result.get("env_runners", {})
    evaluation = result.get("evaluation", {}).get("env_runners", {})
    timesteps = int(
        result.get("num_env_steps_sampled_lifetime") or runners.get("num_env_steps_sampled_lifetime") or 0
    )
    iteration_s = float(result.get("time_this_iter_s") or 0.0)
    return IterationMetrics(
        iteration=int(result["training_iteration"]),
        timesteps=timesteps,
        episodes=int(runners.get("num_episodes_lifetime") or 0),
        return_mean=_number(runners.get("episode_return_mean")),
        return_min=_number(runners.get("episode_return_min")),
        return_max=_number(runners.get("episode_return_max")),
        episode_len_mean=_number(runners.get("episode_len_mean")),
        eval_return_mean=_number(evaluation.get("episode_return_mean")),
        steps_per_s=(timesteps - previous_timesteps) / iteration_s if iteration_s > 0 else 0.0,
        iteration_s=iteration_s,
        elapsed_s=elapsed_s,
    )


def stop_reason(stop: Any, metrics: IterationMetrics, evaluated: bool) -> str | None:
    """The first stop criterion of the experiment that ``metrics`` meets, if any.

    With evaluation on, the return criterion is judged on the evaluation return
    (deterministic episodes), not on the noisier training episodes.
    """
    judged, label = (
        (metrics.eval_return_mean, "evaluation") if evaluated else (metrics.return_mean, "training")
    )
    if stop.return_ is not None and judged >= stop.return_:
        return f"mean {label} return {judged:.1f} >= {stop.return_:g}"
    if stop.timesteps is not None and metrics.timesteps >= stop.timesteps:
        return f"timesteps {metrics.timesteps:,} >= {stop.timesteps:,}"
    if stop.iterations is not None and metrics.iteration >= stop.iterations:
        return f"iterations {metrics.iteration} >= {stop.iterations}"
    if stop.time_s is not None and metrics.elapsed_s >= stop.time_s:
        return f"time {metrics.elapsed_s:.0f}s >= {stop.time_s:g}s"
    return None


def run_training_loop(algo: Any, experiment: Any, run_dir: Path, printer: ProgressPrinter) -> RunSummary:
    """Call ``algo.train()`` until a stop rule fires or we are interrupted."""
    started = time.monotonic()
    every, keep = experiment.checkpoint.every, experiment.checkpoint.keep
    best, best_eval, last = -math.inf, -math.inf, None
    metrics: IterationMetrics | None = None
    last_checkpoint: Path | None = None
    status, reason = "failed", "error"
    progress_csv = run_dir / "progress.csv"
    with progress_csv.open("w", newline="") as handle, _interrupts_raise():
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        printer.header()
        try:
            while True:
                result = algo.train()
                metrics = metrics_from_result(
                    result, metrics.timesteps if metrics else 0, time.monotonic() - started
                )
                writer.writerow(asdict(metrics))
                handle.flush()
                printer.iteration(metrics)
                if not math.isnan(metrics.return_mean):
                    best = max(best, metrics.return_mean)
                last = metrics.return_mean
                if metrics.iteration % every == 0:
                    last_checkpoint = save_checkpoint(algo, run_dir, metrics.iteration, keep)
                if not math.isnan(metrics.eval_return_mean):
                    best_eval = max(best_eval, metrics.eval_return_mean)
                found = stop_reason(experiment.stop, metrics, evaluated=experiment.evaluation.interval > 0)
                if found:
                    status, reason = "finished", found
                    break
        except (KeyboardInterrupt, Interrupted) as exc:
            status, reason = "interrupted", f"interrupted ({exc or 'SIGINT'})"
        finally:
            if metrics is not None:
                last_checkpoint = save_checkpoint(algo, run_dir, metrics.iteration, keep)
    return RunSummary(
        run_dir=run_dir,
        status=status,
        stop_reason=reason,
        iterations=metrics.iteration if metrics else 0,
        timesteps=metrics.timesteps if metrics else 0,
        best_return=best,
        best_eval_return=best_eval,
        final_return=last if last is not None else math.nan,
        last_checkpoint=last_checkpoint,
        elapsed_s=time.monotonic() - started,
    )


def train(
    name: str,
    overrides: tuple[str, ...] | list[str] = (),
    *,
    address: str | None = None,
    runs_root: Path = Path("runs"),
    verbose: bool = False,
    console: Console | None = None,
) -> RunSummary:
    """Train experiment ``name``; write its run folder under ``runs_root``; return the summary."""
    from rl_app.ray_session import ray_session
    from rl_app.report import plot_reward_curve
    from rl_app.resources import plan_resources
    from rl_app.rllib_adapter import build_algorithm_config, resolved_settings

    console = console or Console(stderr=False)
    loaded = load_experiment(name, overrides)
    experiment = loaded.config
    with ray_session(address, verbose=verbose) as cluster:
        plan = plan_resources(experiment, cluster.num_cpus, cluster.num_gpus)
        config = build_algorithm_config(experiment, plan, loaded.source)
        run_dir = new_run_dir(runs_root, name)
        write_run_metadata(
            run_dir,
            experiment_name=name,
            experiment_file=loaded.path,
            resolved=resolved_settings(experiment, config),
            overrides=loaded.overrides,
            resources={**asdict(plan), "cluster_address": cluster.address},
            argv=sys.argv,
        )
        console.print(
            f"[bold]{name}[/bold]: {experiment.algorithm} on {experiment.env.id}, seed {experiment.seed}"
        )
        console.print(f"Resources: {plan.describe()}")
        console.print(f"Run folder: {run_dir}")
        algo = config.build_algo()
        try:
            printer = ProgressPrinter(console, experiment.stop.timesteps, experiment.stop.time_s)
            summary = run_training_loop(algo, experiment, run_dir, printer)
        finally:
            algo.stop()
    write_json(run_dir / "summary.json", {**asdict(summary), "experiment": name})
    plot_reward_curve(
        run_dir / "progress.csv", run_dir / "reward_curve.png", f"{name} ({experiment.algorithm})"
    )
    evaluated = (
        f", best evaluation return {summary.best_eval_return:.1f}"
        if math.isfinite(summary.best_eval_return)
        else ""
    )
    console.print(
        f"[bold]{summary.status}[/bold]: {summary.stop_reason}; best mean return "
        f"{summary.best_return:.1f}{evaluated} after {summary.iterations} iterations, "
        f"{summary.timesteps:,} timesteps, {summary.elapsed_s:.0f}s"
    )
    console.print(f"Checkpoint: {summary.last_checkpoint}")
    return summary
