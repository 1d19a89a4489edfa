"""One sweep trial: a Ray Tune ``Trainable`` that drives the training loop of one sampled experiment.

A trial is ``rl_app train`` with overrides: the sampled values are set into the
experiment, validated by our schema, built by the same RLlib mapping, and stepped,
saved and restored by the same :class:`~rl_app.training.loop.TrainingLoop`, so its
checkpoints are ones ``rl_app evaluate``/``export``/``train --init-from`` take.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ray import tune

from rl_app.cluster.resources import ResourcePlan
from rl_app.config import ExperimentConfig, validate_experiment
from rl_app.config.data import with_values
from rl_app.runs.checkpoints import verify_checkpoint


def trial_experiment(data: dict[str, Any], values: dict[str, Any], source: str) -> ExperimentConfig:
    """The validated experiment of one trial: ``data`` with the sampled ``values`` set."""
    return validate_experiment(with_values(data, values), source)


def fallback_checkpoint(result: Any) -> Any:
    """A complete checkpoint (one with our marker) next to the missing one ``result`` names, as the
    same kind of (checkpoint, metrics) result with its iteration read from the marker: the newest
    one at or before the missing one's iteration, else the oldest after it; None without one.

    At or before first, as Tune's own resume does: the trial continues from the state Tune's sweep
    state recorded, repeating the iterations after it, so a trial never trains past its stop rule
    from a newer checkpoint whose result Tune already counted."""
    import json

    import pyarrow.fs as pafs

    from rl_app.runs.checkpoints import MARKER

    missing = getattr(result, "checkpoint", None)
    if missing is None:
        return None
    fs, trial_dir = missing.filesystem, missing.path.rstrip("/").rsplit("/", 1)[0]
    found = fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True))
    complete: list[tuple[int, str]] = []
    for info in found:
        if info.type != pafs.FileType.Directory or not info.base_name.startswith("checkpoint_"):
            continue
        try:
            with fs.open_input_stream(f"{info.path}/{MARKER}") as handle:
                complete.append((int(json.loads(bytes(handle.read()))["iteration"]), info.path))
        except (OSError, ValueError, KeyError):
            continue  # no marker: not complete
    if not complete:
        return None
    recorded = int(result.metrics.get("training_iteration", 0))
    before = [entry for entry in complete if entry[0] <= recorded]
    iteration, folder = max(before) if before else min(complete)
    checkpoint = tune.Checkpoint(path=folder, filesystem=fs)
    from rl_app.ray_adapter import training_result

    return training_result(result, checkpoint, {**result.metrics, "training_iteration": iteration})


class ExperimentTrial(tune.Trainable):
    """Trains ``experiment`` (plain data, no sweep section) with Tune's sampled ``config`` set into it."""

    def setup(  # type: ignore[override]
        self,
        config: dict[str, Any],
        *,
        experiment: dict[str, Any],
        name: str,
        plan: ResourcePlan,
        evaluate_at_end: bool = False,
    ) -> None:
        from rl_app.library_logs import capture_library_logs
        from rl_app.training.backends import prepare_backend
        from rl_app.training.loop import TrainingLoop

        capture_library_logs()
        source = f"sweep trial {self.trial_id}"
        trial = trial_experiment(experiment, config, source)
        _, build_backend = prepare_backend(trial, plan, source)
        self.loop = TrainingLoop(build_backend(), trial, name)
        # Ranked by eval_return: a trial that stops before its first scheduled evaluation
        # is evaluated once at its end rather than ranked last without a score.
        self.evaluate_at_end = evaluate_at_end

    def step(self) -> dict[str, Any]:
        step = self.loop.step()
        result: dict[str, Any] = dict(step.metrics.values())
        del result["iteration"]  # Tune counts training_iteration itself
        result["evaluated"] = not math.isnan(step.metrics.eval_return_mean)
        if step.stop_reason is not None and self.evaluate_at_end and math.isnan(self.loop.latest_eval_return):
            self.loop.evaluate()
            result["evaluated"] = True
        # Schedulers need the metric in every result: the latest evaluation until the next one
        # (``evaluated`` marks the results that measured it; plots and CSVs show only those).
        result["eval_return_mean"] = self.loop.latest_eval_return
        if step.stop_reason is not None:
            result["stop_reason"] = step.stop_reason
            result["done"] = True
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.loop.save(Path(checkpoint_dir))
        # Returning None makes Tune hand load_checkpoint() the folder itself.

    def load_checkpoint(self, checkpoint: str) -> None:  # type: ignore[override]
        # Tune's restore is the one load no resolve_checkpoint has checked: refuse a damaged one.
        verify_checkpoint(Path(checkpoint))
        self.loop.load(Path(checkpoint))

    def restore(self, checkpoint_path: Any) -> None:
        """Tune's restore, or, when the checkpoint Tune's saved sweep state names was pruned after
        that state was written (the sweep driver killed between two of its 2-second saves), a
        complete sibling of it: a resumed sweep then continues the trial instead of failing it."""
        try:
            super().restore(checkpoint_path)
        except ValueError as exc:
            replacement = fallback_checkpoint(checkpoint_path) if "anymore" in str(exc) else None
            if replacement is None:
                raise
            super().restore(replacement)

    def cleanup(self) -> None:
        self.loop.backend.stop()
