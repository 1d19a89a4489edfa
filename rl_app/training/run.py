"""``rl_app train``: a run folder around the training loop, with progress, checkpoints, resume and signals."""

from __future__ import annotations

import math
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from rl_app.algorithms import algorithm_spec
from rl_app.config import ExperimentConfig
from rl_app.console.tables import output_console, warner
from rl_app.errors import UserError, first_line
from rl_app.runs.checkpoints import (
    CheckpointError,
    checkpoint_name,
    checkpoints_dir,
    fallback_note,
    latest_checkpoint,
    read_info,
    save_checkpoint,
    set_aside,
)
from rl_app.runs.files import read_json, write_json
from rl_app.runs.layout import new_run_dir, write_experiment, write_run_metadata, write_status
from rl_app.runs.progress import (
    IterationMetrics,
    ProgressWriter,
    StartPoint,
    finite_max,
    finite_sum,
    start_point_from_progress,
)
from rl_app.runs.remote import RunMirror, StorageFolder
from rl_app.tracking.target import tracking_target
from rl_app.training.plan import Plan, plan_new_run, plan_resume

if TYPE_CHECKING:
    from rl_app.console.progress import ProgressPrinter
    from rl_app.tracking.run import RunTracking
    from rl_app.training.loop import TrainingLoop


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
    evaluation_s: float = math.nan  # the seconds spent evaluating, over the run's iterations
    resumed_from: str | None = None


class Interrupted(BaseException):
    """SIGTERM (or SIGINT) arrived; training stops after a final checkpoint.

    A BaseException, like KeyboardInterrupt: the signal can arrive inside an env step, where
    RLlib's env runner turns any Exception into a RuntimeError about a failed env."""


@contextmanager
def _interrupts_raise() -> Iterator[None]:
    """The first SIGINT/SIGTERM stops training after a final checkpoint; a second one stops at once
    (the half-written checkpoint is never picked up: its marker is missing)."""
    received: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        if len(received) > 1:
            raise KeyboardInterrupt(f"{received[-1]} again: stopped without a final checkpoint")
        raise Interrupted(received[-1])

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class TrainingRun:
    """Drives the loop for one run folder: progress.csv, TensorBoard, checkpoints, mirror, summary."""

    def __init__(
        self,
        loop: TrainingLoop,
        run_dir: Path,
        printer: ProgressPrinter,
        mirror: RunMirror | None = None,
        start: StartPoint | None = None,
        tracking: RunTracking | None = None,
    ) -> None:
        from rl_app.console.plots import RewardCurveProcess

        self.loop, self.run_dir, self.printer, self.mirror = loop, run_dir, printer, mirror
        self.start = start or StartPoint()
        self.tracking = tracking
        self.status = "failed"
        self.reward_curve = RewardCurveProcess()

    @property
    def experiment(self) -> ExperimentConfig:
        return self.loop.experiment

    def _checkpoint(self) -> Path:
        spec = self.experiment.checkpoint
        try:
            path, pruned = save_checkpoint(self.run_dir, self.loop.iteration, spec.keep, self.loop.save)
        except OSError as exc:  # a full disk, a folder turned read-only: say so, keep what is complete
            name = checkpoint_name(self.loop.iteration)
            shutil.rmtree(checkpoints_dir(self.run_dir) / f".partial-{name}", ignore_errors=True)
            latest = latest_checkpoint(self.run_dir)
            raise CheckpointError(
                f"cannot write checkpoint {name} into {self.run_dir}: {exc.strerror or exc}; "
                f"the latest complete checkpoint, {latest.name if latest else 'none'}, is kept and resumable"
            ) from None
        if self.mirror is not None:
            self.mirror.sync(
                "progress.csv", "status.json", "tensorboard", checkpoint=path, pruned=tuple(pruned)
            )
        return path

    def run(self) -> RunSummary:
        """Step the loop until a stop rule fires or we are interrupted."""
        from rl_app.console.telemetry import SystemMonitor, TensorBoardLog

        start = self.start
        best, best_eval, last = start.best_return, start.best_eval_return, start.last_return
        metrics: IterationMetrics | None = None
        last_checkpoint = latest_checkpoint(self.run_dir)
        status, reason = "failed", "error"
        monitor, tensorboard = SystemMonitor(), TensorBoardLog(self.run_dir)
        every = self.experiment.checkpoint.every
        faults, evaluation_s = (0.0, 0.0), start.evaluation_s
        saved = start.iteration  # the iteration of the newest complete checkpoint this process wrote
        with (self.run_dir / "progress.csv").open("w", newline="") as handle, _interrupts_raise():
            progress = ProgressWriter(handle, start.rows, self.loop.policies)
            self.printer.header()
            try:
                while True:
                    step = self.loop.step()
                    metrics = step.metrics
                    for key, value in monitor.sample().items():
                        setattr(metrics, key, value)
                    progress.write(metrics)
                    values = metrics.values()
                    tensorboard.log(metrics.timesteps, values, step.result)
                    if self.tracking is not None:
                        self.tracking.iteration(metrics.timesteps, values, step.result)
                    self.printer.iteration(metrics)
                    for notice in step.notices:
                        self.printer.console.print(
                            f"[yellow]warning:[/yellow] iteration {metrics.iteration}: {notice}"
                        )
                    faults = self._new_faults(metrics, faults)
                    best = finite_max(best, metrics.return_mean)
                    best_eval = finite_max(best_eval, metrics.eval_return_mean)
                    evaluation_s = finite_sum(evaluation_s, metrics.evaluation_s)
                    last = metrics.return_mean
                    if metrics.iteration % every == 0:
                        last_checkpoint = self._checkpoint()
                        saved = metrics.iteration
                    if step.stop_reason:
                        status, reason = "finished", step.stop_reason
                        break
            except (KeyboardInterrupt, Interrupted) as exc:
                status, reason = "interrupted", f"interrupted ({exc or 'SIGINT'})"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {first_line(exc, default='')}"
                raise
            finally:
                # The final checkpoint, unless this iteration was just saved (and uploaded) above;
                # a save that a signal cut short is written again (one the disk refused is not).
                unsaved = metrics is not None and metrics.iteration != saved
                if metrics is not None and (
                    metrics.iteration % every != 0 or (unsaved and status == "interrupted")
                ):
                    last_checkpoint = self._checkpoint()
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
                    elapsed_s=self.loop.elapsed_s,
                    evaluation_s=evaluation_s,
                )
                # The summary takes a moment and imports matplotlib, which a signal raised
                # inside would turn into an ImportError: further signals wait (handlers return on exit).
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_IGN)
                self._finish(summary)
        return summary

    def _new_faults(self, metrics: IterationMetrics, before: tuple[float, float]) -> tuple[float, float]:
        """Say which faults this iteration survived; the counts so far."""
        now = tuple(0.0 if math.isnan(v) else v for v in (metrics.env_failures, metrics.runner_restarts))
        said = []
        if now[0] > before[0]:
            said.append(f"{now[0] - before[0]:.0f} env failure(s), envs recreated and their episodes dropped")
        if now[1] > before[1]:
            said.append(f"{now[1] - before[1]:.0f} crashed env runner(s) recreated")
        if said:
            self.printer.console.print(
                f"[yellow]warning:[/yellow] iteration {metrics.iteration}: {'; '.join(said)} "
                f"({now[0]:.0f} env failures, {now[1]:.0f} runner restarts in all)"
            )
        return now[0], now[1]

    def _finish(self, summary: RunSummary) -> None:
        """The summary and status written, the reward curve asked for (:meth:`complete` waits)."""
        self.status = summary.status
        try:
            # A return never measured is -inf in memory; JSON has no infinity, so readers get null.
            fields = {
                k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in asdict(summary).items()
            }
            write_json(self.run_dir / "summary.json", {**fields, "experiment": self.loop.name})
            write_status(self.run_dir, summary.status, stop_reason=summary.stop_reason)
        except OSError as exc:  # the disk that refused a checkpoint may refuse these too
            self._cannot_write_summary(exc)
            return
        self.reward_curve.draw(
            self.run_dir / "progress.csv",
            self.run_dir / "reward_curve.png",
            f"{self.loop.name} ({self.experiment.algorithm} on {self.experiment.env.id})",
        )

    def complete(self) -> None:
        """After the run (and Ray's shutdown, which the curve's drawing overlaps): the reward curve
        written, then the run's final files mirrored."""
        try:
            drawn = self.reward_curve.wait()
        except OSError as exc:
            self._cannot_write_summary(exc)
            drawn = None
        else:
            if drawn is not None and self.mirror is not None:
                self.mirror.sync(
                    "progress.csv", "summary.json", "status.json", "reward_curve.png", "tensorboard"
                )
        if self.tracking is not None:
            for line in self.tracking.finish(self.status):
                warner(self.printer.console)(f"{line}; rl_app track {self.run_dir} sends it later")
            if self.tracking.run_id is not None:
                self.printer.console.print(
                    f"MLflow run {self.tracking.run_id} in {self.tracking.target.describe()}"
                )
            if self.mirror is not None:  # metadata.json now holds the MLflow run id
                self.mirror.sync("metadata.json")

    def _cannot_write_summary(self, exc: OSError) -> None:
        self.reward_curve.close()
        self.printer.console.print(f"[yellow]warning:[/yellow] cannot write the run summary: {exc}")


def train(
    name: str | None,
    overrides: tuple[str, ...] | list[str] = (),
    *,
    resume: str | None = None,
    force_config: bool = False,
    allow_version_mismatch: bool = False,
    init_from: str | None = None,
    storage: str | None = None,
    address: str | None = None,
    token_file: str | None = None,
    runs_root: Path = Path("runs"),
    track: bool = False,
    tracking_uri: str | None = None,
    verbose: bool = False,
    console: Console | None = None,
) -> RunSummary:
    """Train experiment ``name`` (or resume run ``resume``); return the summary."""
    from rl_app.cluster.resources import plan_resources
    from rl_app.cluster.session import ray_session, this_machine
    from rl_app.library_logs import capture_library_logs, library_log_note, write_library_logs
    from rl_app.rllib.config import algorithm_build_modules
    from rl_app.runs.storage import open_storage

    if not verbose:
        capture_library_logs()  # before the env check makes the first env (MuJoCo warns then)
    console = console or output_console()
    overrides = tuple(overrides)
    if storage:
        overrides = (*overrides, f"storage={storage}")
    if resume is not None:
        plan = plan_resume(resume, name, overrides, force_config, runs_root, allow_version_mismatch)
    elif name is None:
        raise UserError("train needs an experiment name, or --resume RUN")
    else:
        plan = plan_new_run(name, overrides, init_from, runs_root, allow_version_mismatch)
    experiment = plan.experiment
    recorded = read_json(plan.run_dir / "metadata.json").get("mlflow") if plan.run_dir else None
    tracking_to = tracking_target(
        experiment, plan.name, track=track, uri=tracking_uri, runs_root=runs_root, recorded=recorded
    )
    storage_handle = open_storage(experiment.storage) if experiment.storage and plan.mirror is None else None

    session = (
        ray_session(
            address, verbose=verbose, preload=algorithm_build_modules(experiment), token_file=token_file
        )
        if algorithm_spec(experiment.algorithm).backend == "rllib"
        else this_machine()  # the tabular baseline runs in this process: no Ray to start
    )
    # Closed after the session (Ray shut down): it waits for what overlapped the shutdown.
    with ExitStack() as after_ray, session as cluster:
        from rl_app.console.progress import ProgressPrinter
        from rl_app.training.backends import prepare_backend
        from rl_app.training.loop import TrainingLoop

        resource_plan = plan_resources(experiment, cluster.num_cpus, cluster.num_gpus)
        resolved, build_backend = prepare_backend(experiment, resource_plan, plan.source)
        start = StartPoint()
        if plan.resume_checkpoint is not None:
            assert plan.run_dir is not None
            run_dir, mirror = plan.run_dir, plan.mirror
            start = start_point_from_progress(
                run_dir / "progress.csv", read_info(plan.resume_checkpoint).iteration
            )
        else:
            run_dir = new_run_dir(runs_root, plan.name)
            mirror = StorageFolder(storage_handle, run_dir) if storage_handle is not None else None
            write_experiment(run_dir, experiment)
            write_run_metadata(
                run_dir,
                experiment_name=plan.name,
                experiment_file=plan.experiment_file,
                resolved=resolved,
                overrides=plan.overrides,
                resources={**asdict(resource_plan), "cluster_address": cluster.address},
                argv=sys.argv,
                storage=mirror.storage.uri if mirror else None,
            )
        if not verbose:
            write_library_logs(run_dir)
        write_status(run_dir, "running")
        if mirror is not None:
            mirror.push("metadata.json", "experiment.yaml", "config.yaml", "command.txt", "status.json")
        resources = resource_plan.describe()
        if algorithm_spec(experiment.algorithm).backend == "tabular":
            resources = "tabular, numpy on the driver: no env runners, no learner"
        else:
            from rl_app.rllib.config import describe_rllib_setup

            resources += f"; {describe_rllib_setup(experiment, resource_plan)}"
        _print_start(console, plan, resources, resolved.get("replay_schedule"), run_dir, mirror)
        if tracking_to is not None:
            console.print(f"Tracking: {tracking_to.describe()}")
        loop = TrainingLoop(build_backend(), experiment, plan.name)
        try:
            if plan.resume_checkpoint is not None:
                # Renamed out of the way (never deleted) only now that the run starts, so the
                # checkpoints it writes next are not confused with them.
                kept_aside = {damage: set_aside(damage) for damage, _ in plan.damaged}
                if kept_aside:
                    warner(console)(fallback_note(plan.resume_checkpoint, plan.damaged, kept_aside))
                loop.load(plan.resume_checkpoint)
                console.print(
                    f"Resumed from {plan.resume_checkpoint.name}: iteration {start.iteration}, "
                    f"{start.timesteps:,} timesteps"
                )
            if plan.init_checkpoint is not None:
                loop.backend.warm_start(plan.init_checkpoint)
                console.print(f"Weights initialised from {plan.init_checkpoint}")
            printer = ProgressPrinter(console, experiment.stop.timesteps, experiment.stop.time_s)
            syncing = RunMirror(mirror, warner(console)) if mirror else None
            tracking = None
            if tracking_to is not None:
                from rl_app.tracking.run import RunTracking

                tracking = RunTracking(tracking_to, run_dir, warner(console), start.rows)
            training_run = TrainingRun(loop, run_dir, printer, syncing, start, tracking)
            after_ray.callback(training_run.complete)
            summary = training_run.run()
        finally:
            loop.backend.stop()
    if plan.resume_checkpoint is not None:
        summary.resumed_from = str(plan.resume_checkpoint)
    _print_summary(console, summary)
    note = None if verbose else library_log_note(summary.run_dir)
    if note:
        console.print(note)
    return summary


def _print_start(
    console: Console,
    plan: Plan,
    resources: str,
    replay_schedule: str | None,
    run_dir: Path,
    mirror: StorageFolder | None,
) -> None:
    experiment = plan.experiment
    console.print(
        f"[bold]{plan.name}[/bold]: {experiment.algorithm} on {experiment.env.id}, seed {experiment.seed}"
    )
    console.print(f"Resources: {resources}")
    if replay_schedule is not None:
        console.print(f"Replay: {replay_schedule}")
    console.print(f"Run folder: {run_dir}" + (f" (mirrored to {mirror.describe()})" if mirror else ""))
    for text in plan.warnings:
        warner(console)(text)


def _print_summary(console: Console, summary: RunSummary) -> None:
    evaluated = (
        f", best evaluation return {summary.best_eval_return:.1f}"
        if math.isfinite(summary.best_eval_return)
        else ""
    )
    trained = f"best mean return {summary.best_return:.1f}" if math.isfinite(summary.best_return) else ""
    best = f"{trained}{evaluated}".removeprefix(", ") or "no returns yet"
    console.print(
        f"[bold]{summary.status}[/bold]: {summary.stop_reason}; {best} after "
        f"{summary.iterations} iterations, {summary.timesteps:,} timesteps, {summary.elapsed_s:.0f}s"
    )
    console.print(f"Checkpoint: {summary.last_checkpoint}")
