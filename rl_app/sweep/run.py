"""``rl_app sweep``: a Ray Tune sweep over an experiment's ``sweep:`` section, start to report.

It writes ``runs/<exp>/<timestamp>/``: Tune's own trial folders (config, metrics,
checkpoints), plus ``results.csv``, ``curves.png``, ``hyperparameters.png``,
``sweep.json`` and ``<exp>_best.yaml``, which ``rl_app train`` trains directly.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from rl_app.config import ExperimentConfig, load_experiment, validate_experiment
from rl_app.config.loader import read_yaml
from rl_app.config.sweep import metric_name
from rl_app.console.progress import format_value, sweep_console, trial_table
from rl_app.console.tables import warner
from rl_app.errors import UserError
from rl_app.runs.files import read_json, write_json
from rl_app.runs.layout import (
    EXPERIMENT_FILE,
    check_runs_root,
    experiment_dict,
    new_run_dir,
    package_versions,
    write_experiment,
)
from rl_app.runs.progress import METRIC_COLUMNS
from rl_app.runs.remote import StorageFolder, folder_at_uri
from rl_app.runs.storage import Storage, is_uri, open_storage
from rl_app.sweep.results import (
    TrialRow,
    collect_trials,
    write_best_experiment,
    write_results_csv,
    write_trial_experiments,
)
from rl_app.sweep.space import count_trials
from rl_app.tracking.target import tracking_target
from rl_app.training.backends import require_rllib
from rl_app.training.plan import check_experiment_env

SWEEP_FILE = "sweep.json"


@dataclass
class SweepSummary:
    sweep_dir: Path
    status: str  # finished | interrupted
    trials: list[TrialRow]
    metric: str
    best: TrialRow | None
    best_experiment: Path | None
    elapsed_s: float
    files: list[Path] = field(default_factory=list)


@dataclass
class SweepPlan:
    """What ``rl_app sweep`` will run, checked before Ray starts or anything is written."""

    name: str
    experiment: ExperimentConfig
    source: str
    storage: Storage  # where Tune writes the trials: the storage URI, or the local runs folder
    folder: StorageFolder | None = None  # set when resuming


def _open_sweep(location: str, runs_root: Path) -> StorageFolder:
    """The sweep at a local folder, or at ``<storage>/<exp>/<stamp>`` (its files fetched locally)."""
    if is_uri(location):
        folder = folder_at_uri(location, runs_root, "sweep")
        folder.pull((SWEEP_FILE, EXPERIMENT_FILE), required=SWEEP_FILE, what="sweep")
        return folder
    local = Path(location)
    if not (local / SWEEP_FILE).is_file():
        what = "does not exist" if not local.exists() else f"is not a sweep folder (no {SWEEP_FILE})"
        raise UserError(f"sweep '{location}' {what}")
    storage_uri = read_json(local / SWEEP_FILE).get("storage")
    return StorageFolder(open_storage(storage_uri or str(local.resolve().parent.parent)), local)


def plan_sweep(
    name: str | None, overrides: tuple[str, ...], resume: str | None, runs_root: Path
) -> SweepPlan:
    """Load and check everything (storage included) before Ray starts or anything is written."""
    if resume is not None:
        if overrides:
            raise UserError("--resume continues a sweep as it was started; --set cannot change it")
        folder = _open_sweep(resume, runs_root)
        meta = read_json(folder.local / SWEEP_FILE)
        source = str(folder.local / EXPERIMENT_FILE)
        experiment = validate_experiment(read_yaml(folder.local / EXPERIMENT_FILE), source)
        return SweepPlan(str(meta["experiment"]), experiment, source, folder.storage, folder)
    if name is None:
        raise UserError("sweep needs an experiment name, or --resume SWEEP_FOLDER")
    loaded = load_experiment(name, overrides)
    if loaded.config.sweep is None:
        raise UserError(
            f"{loaded.source}: has no sweep section (add sweep.space, e.g. "
            "'training.lr: {loguniform: [1.0e-4, 1.0e-3]}')"
        )
    require_rllib(loaded.config, "a sweep")
    if loaded.config.offline is not None:
        raise UserError(
            f"{loaded.source}: sweeps of offline algorithms are not supported yet (Ray Data's readers "
            "would compete with the trials for CPUs); train each setting with rl_app train"
        )
    check_experiment_env(loaded.config, loaded.source)
    if loaded.config.storage is None:
        check_runs_root(runs_root)
    storage = open_storage(loaded.config.storage or str(runs_root))
    return SweepPlan(loaded.name, loaded.config, loaded.source, storage)


def first_evaluation_after_stop(experiment: ExperimentConfig) -> str | None:
    """Why the trials would stop before their first scheduled evaluation, if they would."""
    assert experiment.sweep is not None
    stop = experiment.sweep.stop or experiment.stop
    interval = experiment.evaluation.interval
    if stop.iterations is not None and stop.iterations < interval:
        return (
            f"trials stop at iteration {stop.iterations}, before their first evaluation "
            f"(iteration {interval})"
        )
    per_iteration = experiment.training.train_batch_size_per_learner
    if stop.timesteps is not None and per_iteration and stop.timesteps < interval * per_iteration:
        return (
            f"trials stop at {stop.timesteps:,} timesteps, before their first evaluation "
            f"(iteration {interval}, {interval * per_iteration:,} timesteps)"
        )
    return None


def run_sweep(
    name: str | None,
    overrides: tuple[str, ...] | list[str] = (),
    *,
    resume: str | None = None,
    storage: str | None = None,
    address: str | None = None,
    token_file: str | None = None,
    runs_root: Path = Path("runs"),
    track: bool = False,
    tracking_uri: str | None = None,
    verbose: bool = False,
    console: Console | None = None,
) -> SweepSummary:
    """Run (or resume) the sweep of experiment ``name``; write the results; return the summary."""
    import logging

    from rl_app.cluster.resources import plan_trial_resources
    from rl_app.cluster.session import ray_session
    from rl_app.library_logs import capture_library_logs, write_library_logs
    from rl_app.sweep.tuner import new_tuner, restored_tuner

    if not verbose:
        capture_library_logs()  # before the env check makes the first env (MuJoCo warns then)

    # Save Tune's sweep state every 2 s (default: 10 s): a killed driver loses at most that much.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")
    # Reusing actors would save PBT a restart per exploit; trials here rebuild RLlib instead.
    warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
    console = console or sweep_console()
    overrides = (*overrides, *([f"storage={storage}"] if storage else []))
    plan = plan_sweep(name, tuple(overrides), resume, runs_root)
    experiment, sweep = plan.experiment, plan.experiment.sweep
    assert sweep is not None
    metric = metric_name(experiment)
    num_trials = count_trials(sweep)
    recorded = read_json(plan.folder.local / SWEEP_FILE).get("mlflow") if plan.folder else None
    if plan.folder is not None and track and not recorded:
        raise UserError("--track: this sweep was started without tracking; --resume continues it as started")
    tracking_to = tracking_target(
        experiment, plan.name, track=track, uri=tracking_uri, runs_root=runs_root, recorded=recorded
    )
    began = time.monotonic()
    with ray_session(address, verbose=verbose, token_file=token_file) as cluster:
        if not verbose:
            logging.getLogger("ray.tune").setLevel(logging.CRITICAL)  # crashes are reported by our callback
        resources = plan_trial_resources(experiment, num_trials, cluster.num_cpus, cluster.num_gpus)
        folder = plan.folder
        if folder is None:
            folder = StorageFolder(plan.storage, new_run_dir(runs_root, plan.name))
            write_experiment(folder.local, experiment)
            write_json(
                folder.local / SWEEP_FILE,
                {
                    "experiment": plan.name,
                    "experiment_file": plan.source,
                    "overrides": list(overrides),
                    "storage": folder.storage.uri if folder.mirrors else None,
                    "metric": metric,
                    "mode": sweep.mode,
                    "trials": num_trials,
                    "resources": resources.describe(num_trials),
                    "argv": sys.argv,
                    "versions": package_versions(),
                    "started_at": datetime.now(UTC).isoformat(),
                },
            )
            folder.push(EXPERIMENT_FILE, SWEEP_FILE)
        if not verbose:
            write_library_logs(folder.local)
        scheduler = sweep.scheduler.type.upper()
        console.print(
            f"[bold]{plan.name}[/bold]: sweeping {', '.join(sweep.space)} of {experiment.algorithm} on "
            f"{experiment.env.id}; {sweep.search} search, {scheduler} scheduler, {sweep.mode} {metric}"
        )
        console.print(f"Resources: {resources.describe(num_trials)}")
        late = first_evaluation_after_stop(experiment) if metric == "eval_return" else None
        if late:
            console.print(f"[yellow]warning:[/yellow] {late}; each trial is evaluated once when it stops")
        mirrored = f" (trials and checkpoints in {folder.describe()})" if folder.mirrors else ""
        console.print(f"Sweep folder: {folder.local}{mirrored}")
        tracking = None
        if tracking_to is not None:
            from rl_app.tracking.sweep import SweepTracking

            console.print(f"Tracking: {tracking_to.describe()}")
            data = experiment_dict(experiment)
            tracking = SweepTracking(tracking_to, folder.local / SWEEP_FILE, plan.name, data, warner(console))
        if plan.folder is None:
            callbacks = [tracking.callback()] if tracking else []
            tuner = new_tuner(experiment, plan.name, plan.source, folder, resources, callbacks)
        else:
            tuner = restored_tuner(experiment, plan.name, plan.source, folder, resources)
            console.print("Resuming: finished trials are kept, unfinished ones continue from checkpoints")
        tuner.fit()
        rows = collect_trials(folder, METRIC_COLUMNS[metric], sweep.mode)
    summary = _report(plan, folder, rows, metric, time.monotonic() - began, console)
    if tracking is not None:
        published = [*summary.files, *([summary.best_experiment] if summary.best_experiment else [])]
        for line in tracking.finish(summary.status, [*published, folder.local / "summary.json"]):
            warner(console)(line)
        if tracking.run_id is not None:
            console.print(
                f"MLflow run {tracking.run_id} (a child run per trial) in {tracking.target.describe()}"
            )
        folder.push(SWEEP_FILE)  # now with the MLflow run id
    return summary


def _report(
    plan: SweepPlan,
    folder: StorageFolder,
    rows: list[TrialRow],
    metric: str,
    elapsed_s: float,
    console: Console,
) -> SweepSummary:
    from rl_app.console.plots import plot_hyperparameters, plot_trial_curves

    experiment = plan.experiment
    sweep = experiment.sweep
    assert sweep is not None
    keys = list(sweep.space)
    sweep_dir = folder.local
    write_trial_experiments(experiment, rows, folder)
    files = [
        write_results_csv(rows, keys, metric, sweep_dir / "results.csv"),
        plot_trial_curves(rows, metric, sweep_dir / "curves.png", f"{plan.name}: {len(rows)} trials"),
        plot_hyperparameters(rows, sweep.space, metric, sweep_dir / "hyperparameters.png"),
    ]
    ranked = [r for r in rows if math.isfinite(r.score)]
    best = ranked[0] if ranked else None
    best_file = write_best_experiment(experiment, plan.name, best, metric, sweep_dir) if best else None
    status = "interrupted" if any(r.status == "unfinished" for r in rows) else "finished"
    table_rows = [
        {
            "trial": f"{r.rank}. {r.trial.rsplit('_', 1)[-1]}",
            "status": r.status,
            "crashes": r.failures,
            "iter": r.iterations,
            "timesteps": r.timesteps,
            "return": r.return_mean,
            "eval_return": r.eval_return_mean,
            "values": r.values,
        }
        for r in rows
    ]
    console.print(trial_table(f"ranked by {metric} ({sweep.mode})", table_rows, keys))
    counts = {s: sum(r.status == s for r in rows) for s in ("finished", "pruned", "error", "unfinished")}
    console.print(
        f"[bold]{status}[/bold]: {len(rows)} trials in {elapsed_s:.0f}s ("
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + ")"
    )
    if best is not None:
        sampled = ", ".join(f"{k}={format_value(v)}" for k, v in best.values.items())
        console.print(f"Best: trial {best.trial}, {metric} {best.score:.1f}: {sampled}")
        console.print(f"Best checkpoint: {best.checkpoint}")
        console.print(f"Train it: rl_app train {best_file}")
    if status == "interrupted":
        console.print(f"Resume: rl_app sweep --resume {sweep_dir}")
    console.print(f"Results: {', '.join(str(f) for f in files)}")
    summary = SweepSummary(sweep_dir, status, rows, metric, best, best_file, elapsed_s, files)
    write_json(
        sweep_dir / "summary.json",
        {
            "status": status,
            "metric": metric,
            "elapsed_s": elapsed_s,
            "best": None
            if best is None
            else {k: v for k, v in vars(best).items() if k not in ("history", "fs_path")},
            "best_experiment": str(best_file) if best_file else None,
            "trials": counts,
        },
    )
    published = [*files, *([best_file] if best_file else []), sweep_dir / "summary.json"]
    folder.push(*(path.name for path in published))
    return summary
