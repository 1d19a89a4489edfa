"""Train a named experiment: the iteration loop, stop rules, checkpoints, resume, signals."""

from __future__ import annotations

import csv
import math
import pickle
import random
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rl_app.checkpoints import (
    CheckpointError,
    checkpoint_info,
    latest_checkpoint,
    read_info,
    save_checkpoint,
)
from rl_app.config import load_experiment
from rl_app.config.loader import apply_overrides, read_yaml, validate_experiment
from rl_app.errors import UserError, first_line
from rl_app.progress import CSV_FIELDS, IterationMetrics, ProgressPrinter
from rl_app.runs import (
    RunMirror,
    experiment_dict,
    locate_checkpoint,
    new_run_dir,
    open_run,
    read_json,
    write_experiment,
    write_json,
    write_run_metadata,
    write_status,
)

# Changing these when resuming is expected (train longer, keep more checkpoints).
RESUMABLE_CHANGES = ("stop", "checkpoint", "description", "storage")
RNG_STATE = "rng_state.pkl"


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
    resumed_from: str | None = None


@dataclass
class StartPoint:
    """Where a resumed run picks up: what the kept part of ``progress.csv`` says."""

    iteration: int = 0
    timesteps: int = 0
    elapsed_s: float = 0.0
    best_return: float = -math.inf
    best_eval_return: float = -math.inf
    last_return: float = math.nan
    rows: list[dict[str, str]] = field(default_factory=list)


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


def _finite_max(current: float, value: float) -> float:
    return current if math.isnan(value) else max(current, value)


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
            start.best_return = _finite_max(start.best_return, start.last_return)
            start.best_eval_return = _finite_max(
                start.best_eval_return, float(row["eval_return_mean"] or "nan")
            )
    return start


def _save_rng_state(checkpoint: Path) -> None:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    with (checkpoint / RNG_STATE).open("wb") as handle:
        pickle.dump(state, handle)


def _restore_rng_state(checkpoint: Path) -> None:
    import numpy as np
    import torch

    try:
        with (checkpoint / RNG_STATE).open("rb") as handle:
            state = pickle.load(handle)
    except FileNotFoundError:
        return
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class TrainingRun:
    """One run's loop: train, record, checkpoint, mirror, until a stop rule or a signal."""

    def __init__(
        self,
        algo: Any,
        experiment: Any,
        experiment_name: str,
        run_dir: Path,
        printer: ProgressPrinter,
        mirror: RunMirror | None = None,
        start: StartPoint | None = None,
    ) -> None:
        self.algo, self.experiment, self.name = algo, experiment, experiment_name
        self.run_dir, self.printer, self.mirror = run_dir, printer, mirror
        self.start = start or StartPoint()

    def _checkpoint(self, metrics: IterationMetrics) -> Path:
        spec = self.experiment.checkpoint
        info = checkpoint_info(
            self.experiment,
            self.name,
            iteration=metrics.iteration,
            timesteps=metrics.timesteps,
            return_mean=metrics.return_mean,
            eval_return_mean=metrics.eval_return_mean,
        )
        path, pruned = save_checkpoint(self.algo, self.run_dir, info, spec.keep, extra=_save_rng_state)
        if self.mirror is not None:
            self.mirror.push_checkpoint(path, pruned)
            self.mirror.push("progress.csv", "status.json", "tensorboard")
        return path

    def run(self) -> RunSummary:
        """Call ``algo.train()`` until a stop rule fires or we are interrupted."""
        from rl_app.telemetry import SystemMonitor, TensorBoardLog

        start = self.start
        began = time.monotonic() - start.elapsed_s
        best, best_eval, last = start.best_return, start.best_eval_return, start.last_return
        metrics: IterationMetrics | None = None
        previous_timesteps = start.timesteps
        last_checkpoint = latest_checkpoint(self.run_dir)
        status, reason = "failed", "error"
        monitor, tensorboard = SystemMonitor(), TensorBoardLog(self.run_dir)
        evaluated = self.experiment.evaluation.interval > 0
        progress_csv = self.run_dir / "progress.csv"
        with progress_csv.open("w", newline="") as handle, _interrupts_raise():
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, restval="")
            writer.writeheader()
            writer.writerows({k: row.get(k, "") for k in CSV_FIELDS} for row in start.rows)
            handle.flush()
            self.printer.header()
            try:
                while True:
                    result = self.algo.train()
                    metrics = metrics_from_result(result, previous_timesteps, time.monotonic() - began)
                    for key, value in monitor.sample().items():
                        setattr(metrics, key, value)
                    previous_timesteps = metrics.timesteps
                    writer.writerow(asdict(metrics))
                    handle.flush()
                    tensorboard.log(metrics.timesteps, asdict(metrics), result)
                    self.printer.iteration(metrics)
                    best = _finite_max(best, metrics.return_mean)
                    best_eval = _finite_max(best_eval, metrics.eval_return_mean)
                    last = metrics.return_mean
                    if metrics.iteration % self.experiment.checkpoint.every == 0:
                        last_checkpoint = self._checkpoint(metrics)
                    found = stop_reason(self.experiment.stop, metrics, evaluated)
                    if found:
                        status, reason = "finished", found
                        break
            except (KeyboardInterrupt, Interrupted) as exc:
                status, reason = "interrupted", f"interrupted ({exc or 'SIGINT'})"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {first_line(exc, default='')}"
                raise
            finally:
                # The final checkpoint, unless this iteration was just saved (and uploaded) above.
                if metrics is not None and metrics.iteration % self.experiment.checkpoint.every != 0:
                    last_checkpoint = self._checkpoint(metrics)
                tensorboard.close()
                summary = RunSummary(
                    run_dir=self.run_dir,
                    status=status,
                    stop_reason=reason,
                    iterations=metrics.iteration if metrics else start.iteration,
                    timesteps=metrics.timesteps if metrics else start.timesteps,
                    best_return=best,
                    best_eval_return=best_eval,
                    final_return=last,
                    last_checkpoint=last_checkpoint,
                    elapsed_s=time.monotonic() - began,
                )
                self._finish(summary)
        return summary

    def _finish(self, summary: RunSummary) -> None:
        from rl_app.report import plot_reward_curve

        write_json(self.run_dir / "summary.json", {**asdict(summary), "experiment": self.name})
        write_status(self.run_dir, summary.status, stop_reason=summary.stop_reason)
        plot_reward_curve(
            self.run_dir / "progress.csv",
            self.run_dir / "reward_curve.png",
            f"{self.name} ({self.experiment.algorithm} on {self.experiment.env.id})",
        )
        if self.mirror is not None:
            self.mirror.push("progress.csv", "summary.json", "status.json", "reward_curve.png", "tensorboard")


def _differences(saved: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, with old → new."""
    found = []
    for key in sorted(set(saved) | set(new)):
        if not prefix and key in RESUMABLE_CHANGES:
            continue
        old, value = saved.get(key), new.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            found += _differences(old, value, f"{prefix}{key}.")
        elif old != value:
            found.append(f"{prefix}{key}: {old!r} -> {value!r}")
    return found


@dataclass
class Plan:
    """What ``train`` will do, all checked before anything is written."""

    name: str
    experiment: Any
    source: str
    experiment_file: Path
    overrides: tuple[str, ...]
    run_dir: Path | None = None  # set when resuming
    mirror: RunMirror | None = None
    resume_checkpoint: Path | None = None
    init_checkpoint: Path | None = None


def plan_resume(
    location: str, name: str | None, overrides: tuple[str, ...], force_config: bool, runs_root: Path
) -> Plan:
    """Check that run ``location`` can be resumed with this config; refuse silent config changes."""
    run_dir, mirror = open_run(location, runs_root)
    meta = read_json(run_dir / "metadata.json")
    saved_file = run_dir / "experiment.yaml"
    saved_data = read_yaml(saved_file)
    saved = validate_experiment(saved_data, str(saved_file))
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise CheckpointError(f"run '{location}' has no complete checkpoint to resume from")
    info = read_info(checkpoint)
    run_name = str(meta.get("experiment", run_dir.parent.name))
    if name is not None:
        loaded = load_experiment(name, overrides)
        candidate, source, experiment_file = loaded.config, loaded.source, loaded.path
    else:
        data = apply_overrides(saved_data, overrides)
        candidate, source = validate_experiment(data, str(saved_file), overrides), str(saved_file)
        experiment_file = Path(str(meta.get("experiment_file", saved_file)))
    if candidate.algorithm != info.algorithm:
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is from {info.algorithm}, not {candidate.algorithm}; "
            "a checkpoint restores only into the algorithm that wrote it"
        )
    changed = _differences(experiment_dict(saved), experiment_dict(candidate))
    if changed and not force_config:
        raise UserError(
            f"run '{location}' was trained with a different config ({'; '.join(changed[:3])}"
            f"{'; ...' if len(changed) > 3 else ''}); pass --force-config to resume with the new one"
        )
    return Plan(
        name=name or run_name,
        experiment=candidate,
        source=source,
        experiment_file=experiment_file,
        overrides=overrides,
        run_dir=run_dir,
        mirror=mirror,
        resume_checkpoint=checkpoint,
    )


def plan_new_run(name: str, overrides: tuple[str, ...], init_from: str | None, runs_root: Path) -> Plan:
    loaded = load_experiment(name, overrides)
    experiment = loaded.config
    plan = Plan(loaded.name, experiment, loaded.source, loaded.path, loaded.overrides)
    if init_from is not None:
        checkpoint = locate_checkpoint(init_from, runs_root)
        info = read_info(checkpoint)
        if (info.algorithm, info.env) != (experiment.algorithm, experiment.env.id):
            raise CheckpointError(
                f"--init-from {init_from}: checkpoint is {info.algorithm} on {info.env}, "
                f"this experiment is {experiment.algorithm} on {experiment.env.id}"
            )
        plan.init_checkpoint = checkpoint
    return plan


def warm_start(algo: Any, checkpoint: Path) -> None:
    """Load the policy weights of ``checkpoint`` into ``algo`` (optimizer and counters start fresh).

    The module is read from disk once, here on the driver. RLlib's ``set_state``
    puts the weights into Ray's object store once and every remote env runner
    fetches them from there.
    """
    from rl_app.checkpoints import load_module

    module_state = load_module(checkpoint).get_state()
    try:
        algo.set_state({"learner_group": {"learner": {"rl_module": {"default_policy": module_state}}}})
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"cannot load '{checkpoint}' into this experiment's model (different model config?): "
            f"{first_line(exc)}"
        ) from None


def train(
    name: str | None,
    overrides: tuple[str, ...] | list[str] = (),
    *,
    resume: str | None = None,
    force_config: bool = False,
    init_from: str | None = None,
    storage: str | None = None,
    address: str | None = None,
    runs_root: Path = Path("runs"),
    verbose: bool = False,
    console: Console | None = None,
) -> RunSummary:
    """Train experiment ``name`` (or resume run ``resume``); return the summary."""
    from rl_app.ray_session import ray_session
    from rl_app.resources import plan_resources
    from rl_app.rllib_adapter import (
        algorithm_build_modules,
        build_algorithm,
        build_algorithm_config,
        resolved_settings,
    )
    from rl_app.storage import open_storage

    console = console or Console(stderr=False)
    overrides = tuple(overrides)
    if storage:
        overrides = (*overrides, f"storage={storage}")
    if resume is not None:
        plan = plan_resume(resume, name, overrides, force_config, runs_root)
    elif name is None:
        raise UserError("train needs an experiment name, or --resume RUN")
    else:
        plan = plan_new_run(name, overrides, init_from, runs_root)
    experiment = plan.experiment
    storage_handle = open_storage(experiment.storage) if experiment.storage and plan.mirror is None else None

    with ray_session(address, verbose=verbose, preload=algorithm_build_modules(experiment)) as cluster:
        resource_plan = plan_resources(experiment, cluster.num_cpus, cluster.num_gpus)
        config = build_algorithm_config(experiment, resource_plan, plan.source)
        start = StartPoint()
        if plan.resume_checkpoint is not None:
            assert plan.run_dir is not None
            run_dir, mirror = plan.run_dir, plan.mirror
            start = start_point_from_progress(
                run_dir / "progress.csv", read_info(plan.resume_checkpoint).iteration
            )
            # Fresh env seeds, so the resumed part does not replay the first episodes again.
            config.debugging(seed=(experiment.seed or 0) + start.iteration)
        else:
            run_dir = new_run_dir(runs_root, plan.name)
            mirror = RunMirror(storage_handle, run_dir) if storage_handle is not None else None
            write_experiment(run_dir, experiment)
            write_run_metadata(
                run_dir,
                experiment_name=plan.name,
                experiment_file=plan.experiment_file,
                resolved=resolved_settings(experiment, config),
                overrides=plan.overrides,
                resources={**asdict(resource_plan), "cluster_address": cluster.address},
                argv=sys.argv,
                storage=mirror.storage.uri if mirror else None,
            )
        write_status(run_dir, "running")
        if mirror is not None:
            mirror.push("metadata.json", "experiment.yaml", "config.yaml", "command.txt", "status.json")
        console.print(
            f"[bold]{plan.name}[/bold]: {experiment.algorithm} on {experiment.env.id}, seed {experiment.seed}"
        )
        console.print(f"Resources: {resource_plan.describe()}")
        console.print(f"Run folder: {run_dir}" + (f" (mirrored to {mirror.describe()})" if mirror else ""))
        algo = build_algorithm(config)
        try:
            if plan.resume_checkpoint is not None:
                from rl_app.checkpoints import restore_algorithm

                restore_algorithm(algo, plan.resume_checkpoint)
                _restore_rng_state(plan.resume_checkpoint)
                console.print(
                    f"Resumed from {plan.resume_checkpoint.name}: iteration {start.iteration}, "
                    f"{start.timesteps:,} timesteps"
                )
            if plan.init_checkpoint is not None:
                warm_start(algo, plan.init_checkpoint)
                console.print(f"Weights initialised from {plan.init_checkpoint}")
            printer = ProgressPrinter(console, experiment.stop.timesteps, experiment.stop.time_s)
            summary = TrainingRun(algo, experiment, plan.name, run_dir, printer, mirror, start).run()
        finally:
            algo.stop()
    if plan.resume_checkpoint is not None:
        summary.resumed_from = str(plan.resume_checkpoint)
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
