"""Hyperparameter sweeps with Ray Tune: search space, search algorithm, scheduler, resources, results.

``rl_app sweep EXP`` turns the experiment's ``sweep:`` section into a ``Tuner`` over
:class:`rl_app.trial.ExperimentTrial` and writes ``runs/<exp>/<timestamp>/``:
Tune's own trial folders (config, metrics, checkpoints), plus ``results.csv``,
``curves.png``, ``hyperparameters.png``, ``sweep.json`` and ``<exp>_best.yaml``,
which ``rl_app train`` trains directly.
"""

from __future__ import annotations

import csv
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from ray import tune
from rich.console import Console

from rl_app.config import load_experiment
from rl_app.config.loader import read_yaml, validate_experiment, with_values
from rl_app.config.sweep import asha_max_t, metric_name, trial_data
from rl_app.errors import UserError
from rl_app.progress import format_value, sweep_console, trial_table
from rl_app.resources import ResourcePlan, plan_resources
from rl_app.runs import experiment_dict, new_run_dir, package_versions, read_json, write_json
from rl_app.storage import Storage, download, is_uri, open_storage, upload
from rl_app.trial import METRIC_KEYS, TIME_ATTRS

SWEEP_FILE = "sweep.json"
DEFAULT_SAMPLES = 8


@dataclass(frozen=True)
class SweepLocation:
    """Where a sweep lives: the local folder of our reports, and Tune's experiment folder.

    Without remote storage both are ``runs/<exp>/<stamp>``. With ``storage: s3://...`` Tune
    writes trials and checkpoints to ``<storage>/<exp>/<stamp>`` (trial actors upload their
    own checkpoints), and our reports are written locally and uploaded next to them.
    """

    local: Path
    storage: Storage | None = None

    @property
    def tune_path(self) -> str:
        if self.storage is None:
            return str(self.local.resolve())
        return self.storage.path(self.local.parent.name, self.local.name)

    @property
    def tune_fs(self) -> Any:
        return self.storage.fs if self.storage is not None else None

    def display(self, fs_path: str) -> str:
        """A path on Tune's filesystem as the user can use it: a local path or a URI."""
        if self.storage is None or not fs_path:
            return fs_path
        return self.storage.describe(fs_path[len(self.storage.root) :].strip("/"))

    def _fs(self) -> Any:
        import pyarrow.fs as pafs

        return self.tune_fs or pafs.LocalFileSystem()

    def read_text(self, fs_path: str) -> str | None:
        try:
            with self._fs().open_input_stream(fs_path) as handle:
                return bytes(handle.read()).decode(errors="replace")
        except OSError:  # missing included
            return None

    def write_text(self, fs_path: str, text: str) -> None:
        with self._fs().open_output_stream(fs_path) as handle:
            handle.write(text.encode())

    def publish(self, *files: Path) -> None:
        """Copy report files from the local folder to the storage (nothing to do when local)."""
        if self.storage is None:
            return
        for path in files:
            upload(path, self.storage, self.local.parent.name, self.local.name, path.name)


@dataclass(frozen=True)
class TrialResources:
    """How a sweep shares the cluster: trials at a time, and each trial's own resource plan."""

    concurrent: int
    cpus_per_trial: int
    gpus_per_trial: float
    plan: ResourcePlan
    requested: int | None = None  # max_concurrent_trials when it asked for more than fits

    def describe(self, num_trials: int) -> str:
        capped = f" (max_concurrent_trials {self.requested} capped to fit)" if self.requested else ""
        return (
            f"{num_trials} trials, {self.concurrent} at a time{capped}; each trial gets "
            f"{self.plan.describe()}"
        )


def plan_trial_resources(experiment: Any, num_trials: int, num_cpus: int, num_gpus: int) -> TrialResources:
    """Fit as many concurrent trials as the CPUs allow, then give each its share.

    The rule: a trial needs ``reserved_cpus`` (at least 1, for its learner and sampling
    in-process) plus its fixed env, evaluation and learner actors. Concurrency is
    ``min(max_concurrent_trials, trials, CPUs // that)``; with ``num_env_runners: auto``
    each trial then gets ``CPUs // concurrency`` cores and uses the spare ones as env
    runners. GPUs are split evenly (fractions of one) between concurrent trials.
    """
    runners, learners, sweep = experiment.env_runners, experiment.learners, experiment.sweep
    eval_runners = experiment.evaluation.num_env_runners if experiment.evaluation.interval else 0
    fixed = 0 if runners.num_env_runners == "auto" else runners.num_env_runners
    minimum = max(1, runners.reserved_cpus) + eval_runners + fixed + learners.num_learners
    if minimum > num_cpus:
        raise UserError(f"one trial needs {minimum} CPUs but the cluster has {num_cpus}")
    fits = num_cpus // minimum
    wanted = fits if sweep.max_concurrent_trials == "auto" else sweep.max_concurrent_trials
    concurrent = max(1, min(wanted, fits, num_trials))
    cpus = num_cpus // concurrent if runners.num_env_runners == "auto" else minimum
    use_gpu = learners.device != "cpu" and num_gpus > 0
    gpus = min(1.0, num_gpus / concurrent) if use_gpu else 0.0
    return TrialResources(
        concurrent=concurrent,
        cpus_per_trial=cpus,
        gpus_per_trial=gpus,
        plan=plan_resources(experiment, cpus, gpus),
        requested=wanted if wanted > fits and sweep.max_concurrent_trials != "auto" else None,
    )


def num_samples(sweep: Any) -> int:
    return int(sweep.num_samples or (1 if sweep.search == "grid" else DEFAULT_SAMPLES))


def count_trials(sweep: Any) -> int:
    """Trials the sweep will run: samples x grid points (Tune's variant generator), or samples."""
    if sweep.search == "optuna":
        return num_samples(sweep)
    grid = math.prod(len(entry.args) for entry in sweep.space.values() if entry.kind == "grid")
    return num_samples(sweep) * grid


def tune_domain(entry: Any) -> Any:
    """One space entry as a Ray Tune search-space object."""
    args = entry.args
    return {
        "choice": lambda: tune.choice(list(args)),
        "grid": lambda: tune.grid_search(list(args)),
        "uniform": lambda: tune.uniform(*args),
        "loguniform": lambda: tune.loguniform(*args),
        "randint": lambda: tune.randint(*args),
        "quniform": lambda: tune.quniform(*args),
    }[entry.kind]()


def _search_algorithm(sweep: Any, seed: int, concurrent: int) -> Any:
    if sweep.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        return ConcurrencyLimiter(OptunaSearch(seed=seed), max_concurrent=concurrent)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=seed)


def _scheduler(experiment: Any) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    sweep = experiment.sweep
    spec = sweep.scheduler
    time_attr = TIME_ATTRS[spec.time_attr]
    if spec.type == "asha":
        max_t = asha_max_t(experiment)
        assert max_t is not None  # check_sweep refused an ASHA sweep without one
        grace = spec.grace_period or max(1, int(max_t / spec.reduction_factor**2))
        return ASHAScheduler(
            time_attr=time_attr, max_t=max_t, grace_period=grace, reduction_factor=spec.reduction_factor
        )
    if spec.type == "pbt":
        return PopulationBasedTraining(
            time_attr=time_attr,
            perturbation_interval=spec.perturbation_interval,
            hyperparam_mutations={
                key: list(entry.args) if entry.kind == "choice" else tune_domain(entry)
                for key, entry in sweep.space.items()
            },
            quantile_fraction=spec.quantile_fraction,
            resample_probability=spec.resample_probability,
        )
    return FIFOScheduler()


def trial_name(trial: Any) -> str:
    """Trial folder names: ``trial_<id>``, short and in launch order."""
    return f"trial_{trial.trial_id}"


class SweepProgress(tune.Callback):
    """A trial table every ``interval_s`` and one line per event (start, done, crash, error)."""

    def __init__(self, keys: list[str], interval_s: float = 15.0) -> None:
        self.keys = keys
        self.interval_s = interval_s
        self._last_table = 0.0

    @property
    def console(self) -> Console:
        return sweep_console()

    def _values(self, trial: Any) -> str:
        return ", ".join(f"{k}={format_value(trial.config.get(k))}" for k in self.keys)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.console.print(f"trial {trial.trial_id} started: {self._values(trial)}")

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        if time.monotonic() - self._last_table >= self.interval_s:
            done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)
            running = sum(t.status == "RUNNING" for t in trials)
            title = f"trials: {done}/{len(trials)} done, {running} running"
            self.console.print(trial_table(title, [live_row(t) for t in trials], self.keys))
            self._last_table = time.monotonic()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        how = result.get("stop_reason") or "stopped early by the scheduler"
        self.console.print(
            f"trial {trial.trial_id} done after {result.get('training_iteration', 0)} iterations, "
            f"{result.get('timesteps', 0):,} timesteps: {how}"
        )

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.console.print(
            f"[yellow]trial {trial.trial_id} crashed[/yellow] (failure {trial.num_failures}), "
            f"retrying from its last checkpoint; details in {error_file(trial)}"
        )

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.console.print(
            f"[red]trial {trial.trial_id} errored[/red] after {trial.num_failures} failure(s); "
            f"details in {error_file(trial)}"
        )


def live_row(trial: Any) -> dict[str, Any]:
    result = trial.last_result or {}
    return {
        "trial": trial.trial_id.rsplit("_", 1)[-1],
        "status": trial.status.lower(),
        "crashes": trial.num_failures,
        "iter": result.get("training_iteration", ""),
        "timesteps": result.get("timesteps", ""),
        "return": result.get("return_mean", math.nan),
        "eval_return": result.get("eval_return_mean", math.nan),
        "values": trial.config,
    }


@dataclass
class TrialRow:
    """One trial's outcome, as results.csv and the plots show it."""

    trial: str
    status: str  # finished | pruned | error | unfinished
    failures: int
    values: dict[str, Any]
    score: float
    iterations: int
    timesteps: int
    return_mean: float
    eval_return_mean: float
    checkpoint: str
    trial_dir: str
    error: str
    history: list[dict[str, float]] = field(default_factory=list, repr=False)
    rank: int = 0
    fs_path: str = field(default="", repr=False)  # the trial folder on Tune's filesystem


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _status(trial: Any) -> str:
    if trial.status == "ERROR":
        return "error"
    if trial.status == "TERMINATED":
        return "finished" if "stop_reason" in (trial.last_result or {}) else "pruned"
    return "unfinished"


def error_file(trial: Any) -> str:
    """Tune's error.txt of ``trial`` in the sweep folder (not in Ray's session staging folder)."""
    return f"{trial.path}/error.txt"


EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b: \S")


def _error_line(trial: Any, location: SweepLocation) -> str:
    """The root cause of the trial's last failure: the first 'SomeError: message' line of it.

    Tune's error.txt holds a section per failure; in each, Python prints the original
    exception before the ones that wrap it (RLlib re-raises env errors as a bare RuntimeError).
    """
    text = location.read_text(error_file(trial))
    if not text:
        return ""
    last_failure = text.rsplit("Failure # ", 1)[-1]
    lines = [line.strip() for line in last_failure.splitlines() if line.strip()]
    causes = [line for line in lines if EXCEPTION_LINE.match(line)]
    return (causes or lines or [""])[0][:300]


def collect_trials(location: SweepLocation, metric_key: str, mode: str) -> list[TrialRow]:
    """Every trial of the sweep, ranked best first by ``metric_key``."""
    analysis = tune.ExperimentAnalysis(location.tune_path, storage_filesystem=location.tune_fs)
    frames = analysis.trial_dataframes
    rows = []
    for trial in analysis.trials:
        result = trial.last_result or {}
        frame = frames.get(trial.trial_id)
        history = []
        if frame is not None and "timesteps" in frame:
            history = frame[["timesteps", "return_mean", "eval_return_mean"]].astype(float).to_dict("records")
        best = analysis.get_best_checkpoint(trial, metric_key, mode) if trial.checkpoint else None
        checkpoint = best or trial.checkpoint
        rows.append(
            TrialRow(
                trial=trial.trial_id,
                status=_status(trial),
                failures=int(trial.num_failures),
                values=dict(trial.config),
                score=_float(result.get(metric_key)),
                iterations=int(result.get("training_iteration", 0)),
                timesteps=int(result.get("timesteps", 0)),
                return_mean=_float(result.get("return_mean")),
                eval_return_mean=_float(result.get("eval_return_mean")),
                checkpoint=location.display(checkpoint.path) if checkpoint else "",
                trial_dir=location.display(str(trial.path or "")),
                error=_error_line(trial, location) if trial.status == "ERROR" else "",
                history=history,
                fs_path=str(trial.path or ""),
            )
        )
    sign = 1.0 if mode == "max" else -1.0
    rows.sort(key=lambda r: (math.isfinite(r.score), sign * r.score if math.isfinite(r.score) else 0.0))
    rows.reverse()  # best first; trials without a score last
    for rank, row in enumerate(rows, start=1):
        row.rank = rank
    return rows


def write_results_csv(rows: list[TrialRow], keys: list[str], metric: str, out: Path) -> Path:
    fields = ["rank", "trial", "status", "failures", metric, "iterations", "timesteps", "return_mean",
              "eval_return_mean", *keys, "checkpoint", "trial_dir", "error"]  # fmt: skip
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {
                    "rank": row.rank,
                    "trial": row.trial,
                    "status": row.status,
                    "failures": row.failures,
                    metric: row.score,
                    "iterations": row.iterations,
                    "timesteps": row.timesteps,
                    "return_mean": row.return_mean,
                    "eval_return_mean": row.eval_return_mean,
                    **{k: format_value(row.values.get(k)) for k in keys},
                    "checkpoint": row.checkpoint,
                    "trial_dir": row.trial_dir,
                    "error": row.error,
                }
            )
    return out


def write_best_experiment(experiment: Any, name: str, best: TrialRow, metric: str, out_dir: Path) -> Path:
    """The best trial as a self-contained experiment file that ``rl_app train`` takes."""
    data = {k: v for k, v in experiment_dict(experiment).items() if k != "sweep"}
    data = with_values(data, best.values)
    sampled = ", ".join(f"{k}={format_value(v)}" for k, v in best.values.items())
    data["description"] = (
        f"Best trial {best.trial} of sweep {name} ({out_dir}): {metric} {best.score:.1f} "
        f"after {best.timesteps:,} timesteps with {sampled}. Best checkpoint: {best.checkpoint}"
    )
    path = out_dir / f"{name}_best.yaml"
    validate_experiment(data, str(path))
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


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
    name: str
    experiment: Any
    source: str
    storage: Storage | None = None
    location: SweepLocation | None = None  # set when resuming


def _trainable(experiment: Any, name: str, source: str, resources: TrialResources) -> Any:
    from rl_app.rllib_adapter import build_algorithm_config
    from rl_app.trial import ExperimentTrial

    data = trial_data(experiment_dict(experiment))
    config = build_algorithm_config(validate_experiment(data, source), resources.plan, source)
    # RLlib sizes the trial's placement group: the trial process plus its env runner actors.
    bundles = config.algo_class.default_resource_request(config)
    return tune.with_resources(
        tune.with_parameters(ExperimentTrial, experiment=data, name=name, plan=resources.plan), bundles
    )


def _checkpoint_config(experiment: Any, metric_key: str) -> Any:
    """Keep each trial's best checkpoints by the metric; with PBT, the most recent ones.

    PBT restores a lagging trial from the latest checkpoint of a leading one, so that
    checkpoint must survive; keeping by score can delete it under PBT (Tune then fails
    the trial with "checkpoint does not exist on storage anymore").
    """
    sweep, keep = experiment.sweep, experiment.checkpoint.keep
    by_score = {}
    if sweep.scheduler.type != "pbt":
        by_score = {"checkpoint_score_attribute": metric_key, "checkpoint_score_order": sweep.mode}
    return tune.CheckpointConfig(
        num_to_keep=keep if by_score else max(keep, 4),
        checkpoint_frequency=experiment.checkpoint.every,
        checkpoint_at_end=True,
        **by_score,
    )


def _tuner(
    experiment: Any, name: str, source: str, location: SweepLocation, resources: TrialResources
) -> Any:
    sweep = experiment.sweep
    metric_key = METRIC_KEYS[metric_name(experiment)]
    seed = sweep.seed if sweep.seed is not None else (experiment.seed or 0)
    return tune.Tuner(
        _trainable(experiment, name, source, resources),
        param_space={key: tune_domain(entry) for key, entry in sweep.space.items()},
        tune_config=tune.TuneConfig(
            metric=metric_key,
            mode=sweep.mode,
            search_alg=_search_algorithm(sweep, seed, resources.concurrent),
            scheduler=_scheduler(experiment),
            num_samples=num_samples(sweep),
            max_concurrent_trials=resources.concurrent,
            reuse_actors=False,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_name,
        ),
        run_config=tune.RunConfig(
            name=location.local.name,
            storage_path=location.tune_path.rsplit("/", 1)[0],
            storage_filesystem=location.tune_fs,
            callbacks=[SweepProgress(list(sweep.space))],
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            checkpoint_config=_checkpoint_config(experiment, metric_key),
            verbose=0,
        ),
    )


def _open_sweep(location: str, runs_root: Path) -> SweepLocation:
    """The sweep at a local folder, or at ``<storage>/<exp>/<stamp>`` (its files fetched locally)."""
    if not is_uri(location):
        folder = Path(location)
        if not (folder / SWEEP_FILE).is_file():
            what = "does not exist" if not folder.exists() else f"is not a sweep folder (no {SWEEP_FILE})"
            raise UserError(f"sweep '{location}' {what}")
        storage_uri = read_json(folder / SWEEP_FILE).get("storage")
        return SweepLocation(folder, open_storage(storage_uri) if storage_uri else None)
    base, sep, query = location.partition("?")
    parts = base.rstrip("/").rsplit("/", 2)
    if len(parts) != 3 or not (parts[1] and parts[2] and is_uri(parts[0])):
        raise UserError(f"sweep '{location}' must be STORAGE/<experiment>/<timestamp>")
    root_uri, name, stamp = parts
    swept = SweepLocation(runs_root / name / stamp, open_storage(root_uri + sep + query))
    assert swept.storage is not None
    for file in (SWEEP_FILE, "experiment.yaml"):
        download(swept.storage, swept.local / file, name, stamp, file)
    return swept


def plan_sweep(
    name: str | None, overrides: tuple[str, ...], resume: str | None, runs_root: Path
) -> SweepPlan:
    """Load and check everything (storage included) before Ray starts or anything is written."""
    if resume is not None:
        if overrides:
            raise UserError("--resume continues a sweep as it was started; --set cannot change it")
        location = _open_sweep(resume, runs_root)
        meta = read_json(location.local / SWEEP_FILE)
        source = str(location.local / "experiment.yaml")
        experiment = validate_experiment(read_yaml(location.local / "experiment.yaml"), source)
        return SweepPlan(str(meta["experiment"]), experiment, source, location.storage, location)
    if name is None:
        raise UserError("sweep needs an experiment name, or --resume SWEEP_FOLDER")
    loaded = load_experiment(name, overrides)
    if loaded.config.sweep is None:
        raise UserError(
            f"{loaded.source}: has no sweep section (add sweep.space, e.g. "
            "'training.lr: {loguniform: [1.0e-4, 1.0e-3]}')"
        )
    storage = open_storage(loaded.config.storage) if loaded.config.storage else None
    return SweepPlan(loaded.name, loaded.config, loaded.source, storage)


def run_sweep(
    name: str | None,
    overrides: tuple[str, ...] | list[str] = (),
    *,
    resume: str | None = None,
    storage: str | None = None,
    address: str | None = None,
    runs_root: Path = Path("runs"),
    verbose: bool = False,
    console: Console | None = None,
) -> SweepSummary:
    """Run (or resume) the sweep of experiment ``name``; write the results; return the summary."""
    import logging

    from rl_app.ray_session import ray_session

    # Save Tune's sweep state every 2 s (default: 10 s): a killed driver loses at most that much.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")
    # Reusing actors would save PBT a restart per exploit; trials here rebuild RLlib instead.
    warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
    console = console or sweep_console()
    overrides = (*overrides, *([f"storage={storage}"] if storage else []))
    plan = plan_sweep(name, tuple(overrides), resume, runs_root)
    experiment, sweep = plan.experiment, plan.experiment.sweep
    metric = metric_name(experiment)
    num_trials = count_trials(sweep)
    began = time.monotonic()
    with ray_session(address, verbose=verbose) as cluster:
        if not verbose:
            logging.getLogger("ray.tune").setLevel(logging.CRITICAL)  # crashes are reported by our callback
        resources = plan_trial_resources(experiment, num_trials, cluster.num_cpus, cluster.num_gpus)
        location = plan.location
        if location is None:
            location = SweepLocation(new_run_dir(runs_root, plan.name), plan.storage)
            (location.local / "experiment.yaml").write_text(
                yaml.safe_dump(experiment_dict(experiment), sort_keys=False)
            )
            write_json(
                location.local / SWEEP_FILE,
                {
                    "experiment": plan.name,
                    "experiment_file": plan.source,
                    "overrides": list(overrides),
                    "storage": plan.storage.uri if plan.storage else None,
                    "metric": metric,
                    "mode": sweep.mode,
                    "trials": num_trials,
                    "resources": resources.describe(num_trials),
                    "argv": sys.argv,
                    "versions": package_versions(),
                    "started_at": datetime.now(UTC).isoformat(),
                },
            )
            location.publish(location.local / "experiment.yaml", location.local / SWEEP_FILE)
        scheduler = sweep.scheduler.type.upper()
        console.print(
            f"[bold]{plan.name}[/bold]: sweeping {', '.join(sweep.space)} of {experiment.algorithm} on "
            f"{experiment.env.id}; {sweep.search} search, {scheduler} scheduler, {sweep.mode} {metric}"
        )
        console.print(f"Resources: {resources.describe(num_trials)}")
        mirrored = (
            f" (trials and checkpoints in {location.display(location.tune_path)})" if plan.storage else ""
        )
        console.print(f"Sweep folder: {location.local}{mirrored}")
        if plan.location is None:
            tuner = _tuner(experiment, plan.name, plan.source, location, resources)
        else:
            tuner = tune.Tuner.restore(
                location.tune_path,
                trainable=_trainable(experiment, plan.name, plan.source, resources),
                resume_unfinished=True,
                resume_errored=False,
                storage_filesystem=location.tune_fs,
            )
            console.print("Resuming: finished trials are kept, unfinished ones continue from checkpoints")
        tuner.fit()
        rows = collect_trials(location, METRIC_KEYS[metric], sweep.mode)
    return _report(plan, experiment, location, rows, metric, time.monotonic() - began, console)


def _report(
    plan: SweepPlan,
    experiment: Any,
    location: SweepLocation,
    rows: list[TrialRow],
    metric: str,
    elapsed_s: float,
    console: Console,
) -> SweepSummary:
    from rl_app.report import plot_hyperparameters, plot_trial_curves

    keys = list(experiment.sweep.space)
    sweep_dir = location.local
    for row in rows:
        if row.fs_path:
            # What evaluate and export read for the env config of this trial's checkpoints.
            trial_experiment = with_values(trial_data(experiment_dict(experiment)), row.values)
            location.write_text(
                f"{row.fs_path}/experiment.yaml", yaml.safe_dump(trial_experiment, sort_keys=False)
            )
    files = [
        write_results_csv(rows, keys, metric, sweep_dir / "results.csv"),
        plot_trial_curves(rows, metric, sweep_dir / "curves.png", f"{plan.name}: {len(rows)} trials"),
        plot_hyperparameters(rows, experiment.sweep.space, metric, sweep_dir / "hyperparameters.png"),
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
    console.print(trial_table(f"ranked by {metric} ({experiment.sweep.mode})", table_rows, keys))
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
    location.publish(*files, *([best_file] if best_file else []), sweep_dir / "summary.json")
    return summary
