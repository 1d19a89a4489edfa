"""What ``rl_app train`` will do, checked before Ray starts or anything is written: a new run
(optionally warm-started) or the resume of an existing one, refusing silent config changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_app.config import ExperimentConfig, load_experiment, validate_experiment
from rl_app.config.data import apply_overrides
from rl_app.config.loader import read_yaml
from rl_app.errors import ConfigError, UserError
from rl_app.runs.checkpoints import (
    CheckpointError,
    check_ray_version,
    newest_sound_checkpoint,
    read_info,
)
from rl_app.runs.files import read_json
from rl_app.runs.layout import EXPERIMENT_FILE, as_trained, check_runs_root, experiment_dict
from rl_app.runs.remote import StorageFolder, open_checkpoint, open_run

# Changing these when resuming is expected (train longer, keep more checkpoints).
RESUMABLE_CHANGES = ("stop", "checkpoint", "description", "storage", "tuning_seeds", "tracking")


def config_differences(saved: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, with old → new."""
    found = []
    for key in sorted(set(saved) | set(new)):
        if not prefix and key in RESUMABLE_CHANGES:
            continue
        old, value = saved.get(key), new.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            found += config_differences(old, value, f"{prefix}{key}.")
        elif old != value:
            found.append(f"{prefix}{key}: {old!r} -> {value!r}")
    return found


@dataclass
class Plan:
    """What ``train`` will do, all checked before anything is written."""

    name: str
    experiment: ExperimentConfig
    source: str
    experiment_file: Path
    overrides: tuple[str, ...]
    run_dir: Path | None = None  # set when resuming
    mirror: StorageFolder | None = None
    resume_checkpoint: Path | None = None
    init_checkpoint: Path | None = None
    # Newer checkpoints of the run that are damaged (each with why): set aside when the run starts.
    damaged: list[tuple[Path, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # said when the run starts


def check_experiment_env(experiment: ExperimentConfig, source: str) -> None:
    """Make the experiment's env once (reset, one step): a broken env is one line here, before Ray
    starts or anything is written, not a traceback from a remote env runner."""
    from rl_app.envs import check_env
    from rl_app.envs.multi_agent import (
        MappingError,
        check_multi_agent_env,
        is_multi_agent_env,
        multi_agent_section,
    )

    section = multi_agent_section(experiment)
    if section is not None and not is_multi_agent_env(experiment.env.id):
        message = f"needs several agents; '{experiment.env.id}' is a single-agent env"
        raise ConfigError(source, message, key="multi_agent")
    if section is not None:
        from rl_app.algorithms import algorithm_spec

        spec = algorithm_spec(experiment.algorithm)
        if spec.offline or spec.backend != "rllib":
            what = "learns from one agent's recordings" if spec.offline else "trains one agent"
            raise ConfigError(source, f"{experiment.algorithm} {what} here", key="multi_agent")
        if experiment.env_runners.observation_filter is not None:
            message = "normalises one agent's observations here, not several agents'"
            raise ConfigError(source, message, key="env_runners.observation_filter")
    try:
        if section is not None:
            check_multi_agent_env(experiment.env, section)
        else:
            check_env(experiment.env)
    except MappingError as exc:
        raise ConfigError(source, f"does not fit '{experiment.env.id}': {exc}", key="multi_agent") from None
    except ValueError as exc:
        raise ConfigError(source, f"'{experiment.env.id}' {exc}", key="env") from None
    if experiment.offline is not None:
        from rl_app.policy.record import check_recording

        check_recording(experiment.offline.input, experiment.env, source)


def plan_resume(
    location: str,
    name: str | None,
    overrides: tuple[str, ...],
    force_config: bool,
    runs_root: Path,
    allow_version_mismatch: bool = False,
) -> Plan:
    """Check that run ``location`` can be resumed with this config; refuse silent config changes."""
    run_dir, mirror = open_run(location, runs_root)
    meta = read_json(run_dir / "metadata.json")
    saved_file = run_dir / EXPERIMENT_FILE
    saved_data = as_trained(run_dir, read_yaml(saved_file))
    saved = validate_experiment(saved_data, str(saved_file))
    checkpoint, damaged = newest_sound_checkpoint(run_dir)
    if checkpoint is None:
        why = f" whose files are as written ({damaged[0][1]})" if damaged else ""
        raise CheckpointError(f"run '{location}' has no complete checkpoint{why} to resume from")
    info = read_info(checkpoint)
    check_ray_version(checkpoint, info, allow_version_mismatch)
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
    changed = config_differences(experiment_dict(saved), experiment_dict(candidate))
    if changed and not force_config:
        raise UserError(
            f"run '{location}' was trained with a different config ({'; '.join(changed[:3])}"
            f"{'; ...' if len(changed) > 3 else ''}); pass --force-config to resume with the new one"
        )
    check_experiment_env(candidate, source)
    return Plan(
        name=name or run_name,
        experiment=candidate,
        source=source,
        experiment_file=experiment_file,
        overrides=overrides,
        run_dir=run_dir,
        mirror=mirror,
        resume_checkpoint=checkpoint,
        damaged=damaged,
    )


def plan_new_run(
    name: str,
    overrides: tuple[str, ...],
    init_from: str | None,
    runs_root: Path,
    allow_version_mismatch: bool = False,
) -> Plan:
    """Load and check the experiment (and the ``--init-from`` checkpoint) of a new run."""
    loaded = load_experiment(name, overrides)
    experiment = loaded.config
    check_experiment_env(experiment, loaded.source)
    plan = Plan(loaded.name, experiment, loaded.source, loaded.path, loaded.overrides)
    if init_from is not None:
        checkpoint, info = open_checkpoint(init_from, runs_root, allow_version_mismatch, plan.warnings.append)
        if (info.algorithm, info.env) != (experiment.algorithm, experiment.env.id):
            raise CheckpointError(
                f"--init-from {init_from}: checkpoint is {info.algorithm} on {info.env}, "
                f"this experiment is {experiment.algorithm} on {experiment.env.id}"
            )
        plan.init_checkpoint = checkpoint
    check_runs_root(runs_root)  # the run folder is local even when mirrored to --storage
    return plan
