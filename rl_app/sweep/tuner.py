"""Ray Tune wiring of a sweep: search algorithm, scheduler, trial resources, checkpoints, the Tuner."""

from __future__ import annotations

from typing import Any

from ray import tune

from rl_app.cluster.resources import TrialResources
from rl_app.config import ExperimentConfig, validate_experiment
from rl_app.config.schema import SweepSection
from rl_app.config.sweep import asha_max_t, metric_name, trial_data
from rl_app.console.sweep import SweepProgress
from rl_app.runs.layout import experiment_dict
from rl_app.runs.progress import METRIC_COLUMNS
from rl_app.runs.remote import StorageFolder
from rl_app.sweep.space import num_samples, tune_domain

# Scheduler time units: our name -> the key of a trial result.
TIME_ATTRS = {"timesteps": "timesteps", "iterations": "training_iteration"}


def _search_algorithm(sweep: SweepSection, seed: int, concurrent: int) -> Any:
    if sweep.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        return ConcurrencyLimiter(OptunaSearch(seed=seed), max_concurrent=concurrent)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # Tune applies TuneConfig.max_concurrent_trials to Searchers only; a generator passed as
    # the search algorithm must carry the limit itself, or grid and random sweeps ignore it.
    return BasicVariantGenerator(random_state=seed, max_concurrent=concurrent)


def _scheduler(experiment: ExperimentConfig) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    sweep = experiment.sweep
    assert sweep is not None
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
        assert spec.perturbation_interval is not None  # the schema requires it for pbt
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


def trainable(experiment: ExperimentConfig, name: str, source: str, resources: TrialResources) -> Any:
    """The trial class with its experiment bound and the resources RLlib asks for each trial."""
    from rl_app.rllib.config import algorithm_config, trial_resources
    from rl_app.training.backends import require_rllib
    from rl_app.training.trial import ExperimentTrial

    require_rllib(experiment, "a sweep")
    data = trial_data(experiment_dict(experiment))
    config = algorithm_config(validate_experiment(data, source), resources.plan, source)
    return tune.with_resources(
        tune.with_parameters(
            ExperimentTrial,
            experiment=data,
            name=name,
            plan=resources.plan,
            evaluate_at_end=metric_name(experiment) == "eval_return",
        ),
        trial_resources(config),
    )


def _checkpoint_config(experiment: ExperimentConfig, metric_key: str) -> Any:
    """Keep each trial's best checkpoints by the metric; with PBT, the most recent ones.

    PBT restores a lagging trial from the latest checkpoint of a leading one, so that
    checkpoint must survive; keeping by score can delete it under PBT (Tune then fails
    the trial with "checkpoint does not exist on storage anymore").
    """
    sweep, keep = experiment.sweep, experiment.checkpoint.keep
    assert sweep is not None
    by_score: dict[str, Any] = {}
    if sweep.scheduler.type != "pbt":
        by_score = {"checkpoint_score_attribute": metric_key, "checkpoint_score_order": sweep.mode}
    return tune.CheckpointConfig(
        num_to_keep=keep if by_score else max(keep, 4),
        checkpoint_frequency=experiment.checkpoint.every,
        checkpoint_at_end=True,
        **by_score,
    )


def new_tuner(
    experiment: ExperimentConfig,
    name: str,
    source: str,
    folder: StorageFolder,
    resources: TrialResources,
    callbacks: list[Any] | None = None,
) -> Any:
    """A Tuner for the sweep of ``experiment``, writing trials into ``folder``; ``callbacks`` besides
    the progress table (they are kept in the sweep state for a resume)."""
    sweep = experiment.sweep
    assert sweep is not None
    metric_key = METRIC_COLUMNS[metric_name(experiment)]
    seed = sweep.seed if sweep.seed is not None else (experiment.seed or 0)
    return tune.Tuner(
        trainable(experiment, name, source, resources),
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
            name=folder.local.name,
            storage_path=folder.path.rsplit("/", 1)[0],
            storage_filesystem=tune_filesystem(folder),
            callbacks=[SweepProgress(list(sweep.space)), *(callbacks or [])],
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            checkpoint_config=_checkpoint_config(experiment, metric_key),
            verbose=0,
        ),
    )


def tune_filesystem(folder: StorageFolder) -> Any:
    """The filesystem Tune writes the sweep to: the storage's, or Tune's default for a local folder."""
    return folder.storage.fs if folder.mirrors else None


def restored_tuner(
    experiment: ExperimentConfig, name: str, source: str, folder: StorageFolder, resources: TrialResources
) -> Any:
    """The Tuner of the sweep in ``folder``: finished and errored trials kept, unfinished ones continued."""
    return tune.Tuner.restore(
        folder.path,
        trainable=trainable(experiment, name, source, resources),
        resume_unfinished=True,
        resume_errored=False,
        storage_filesystem=tune_filesystem(folder),
    )
