"""Checkpoint lifecycle: atomic saves, keep the last K plus the best, find and check the latest.

A checkpoint is ``checkpoints/iter_NNNNNN/``: RLlib's own checkpoint (learner and
optimizer state, env runner and connector state, iteration and metrics) plus our
``rl_app_checkpoint.json`` (iteration, timesteps, returns, algorithm) and, for
off-policy algorithms, ``replay_buffer.pkl``. The JSON is written last, so only a
checkpoint that has it is complete, on local disk and on remote storage alike.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_app.errors import UserError, first_line

CHECKPOINT_NAME = re.compile(r"^iter_(\d{6,})$")
MARKER = "rl_app_checkpoint.json"
REPLAY_BUFFER = "replay_buffer.pkl"
# RLlib's buffer state leaves out its sampling RNG; we keep it alongside, so a resumed
# run draws the minibatches the uninterrupted one would have drawn.
BUFFER_RNG = "rl_app_rng_state"
MODULE_PATH = ("learner_group", "learner", "rl_module", "default_policy")


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or for something else."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What our marker file records about a checkpoint."""

    iteration: int
    timesteps: int
    return_mean: float
    eval_return_mean: float
    algorithm: str
    env: str
    experiment: str
    replay_buffer: bool

    @property
    def score(self) -> float:
        """Evaluation return when there is one, else the training return; -inf when neither."""
        for value in (self.eval_return_mean, self.return_mean):
            if value is not None and math.isfinite(value):
                return value
        return -math.inf


def checkpoint_info(
    experiment: Any, name: str, *, iteration: int, timesteps: int, return_mean: float, eval_return_mean: float
) -> CheckpointInfo:
    """The marker of a checkpoint of ``experiment`` (run or sweep trial) at this point of training."""
    return CheckpointInfo(
        iteration=iteration,
        timesteps=timesteps,
        return_mean=return_mean,
        eval_return_mean=eval_return_mean,
        algorithm=experiment.algorithm,
        env=experiment.env.id,
        experiment=name,
        replay_buffer=experiment.checkpoint.replay_buffer,
    )


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def read_info(checkpoint: Path) -> CheckpointInfo:
    """The marker of ``checkpoint``; a checkpoint without a readable one is incomplete."""
    marker = checkpoint / MARKER
    try:
        data = json.loads(marker.read_text())
        return CheckpointInfo(**{k: data[k] for k in CheckpointInfo.__dataclass_fields__})
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is incomplete or not an rl_app checkpoint (no {MARKER})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint '{checkpoint}' is corrupt: {MARKER} unreadable ({exc})") from None


def is_complete(checkpoint: Path) -> bool:
    return (
        checkpoint.is_dir()
        and CHECKPOINT_NAME.match(checkpoint.name) is not None
        and (checkpoint / MARKER).is_file()
    )


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (half-written ones are never listed)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete(p)]
    return sorted(found, key=lambda p: int(CHECKPOINT_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return max(found, key=lambda p: read_info(p).score) if found else None


def checkpoints_to_keep(infos: dict[str, CheckpointInfo], keep: int) -> set[str]:
    """The newest ``keep`` plus the best-scoring one."""
    by_iteration = sorted(infos, key=lambda name: infos[name].iteration)
    kept = set(by_iteration[-keep:])
    if infos:
        kept.add(max(by_iteration, key=lambda name: (infos[name].score, infos[name].iteration)))
    return kept


def write_checkpoint(
    algo: Any, folder: Path, info: CheckpointInfo, extra: Callable[[Path], None] | None = None
) -> None:
    """Write RLlib's checkpoint of ``algo``, the replay buffer, ``extra``'s files, and the marker last."""
    algo.save_to_path(str(folder.resolve()))
    buffer = getattr(algo, "local_replay_buffer", None)
    if info.replay_buffer and buffer is not None:
        state = {**buffer.get_state(), BUFFER_RNG: _rng_state(buffer)}
        with (folder / REPLAY_BUFFER).open("wb") as handle:
            pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)
    if extra is not None:
        extra(folder)
    (folder / MARKER).write_text(json.dumps(asdict(info), indent=2) + "\n")


def save_checkpoint(
    algo: Any,
    run_dir: Path,
    info: CheckpointInfo,
    keep: int,
    extra: Callable[[Path], None] | None = None,
) -> tuple[Path, list[str]]:
    """Save ``algo`` as ``checkpoints/iter_NNNNNN``, then prune; returns the path and what was pruned.

    Everything is written into a hidden ``.partial-`` folder that is renamed into
    place once complete, so a process killed mid-save leaves nothing that looks
    finished. ``extra`` may add files to the folder before it is marked complete.
    """
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(info.iteration)
    if not is_complete(final):
        partial = root / f".partial-{final.name}"
        shutil.rmtree(partial, ignore_errors=True)
        write_checkpoint(algo, partial, info, extra)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
    infos = {p.name: read_info(p) for p in list_checkpoints(run_dir)}
    pruned = sorted(set(infos) - checkpoints_to_keep(infos, keep))
    for name in pruned:
        shutil.rmtree(root / name, ignore_errors=True)
    return final, pruned


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder from a checkpoint path or a run folder (its latest complete checkpoint)."""
    if not path.exists():
        raise CheckpointError(f"'{path}' does not exist (expected a run folder or a checkpoint)")
    if (path / MARKER).exists() or CHECKPOINT_NAME.match(path.name):
        read_info(path)
        return path
    if (path / "metadata.json").is_file() or checkpoints_dir(path).is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"run '{path}' has no complete checkpoint")
        return latest
    raise CheckpointError(f"'{path}' is neither a run folder nor an rl_app checkpoint")


def _rng_state(buffer: Any) -> dict[str, Any] | None:
    rng = getattr(buffer, "rng", None)
    return rng.bit_generator.state if rng is not None else None


def restore_algorithm(algo: Any, checkpoint: Path) -> None:
    """Restore everything RLlib saved, and the replay buffer when there is one."""
    try:
        algo.restore_from_path(str(checkpoint.resolve()))
    except Exception as exc:  # RLlib raises many kinds for damaged files
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is corrupt or truncated: {type(exc).__name__}: {_first_line(exc)}"
        ) from None
    buffer_file = checkpoint / REPLAY_BUFFER
    buffer = getattr(algo, "local_replay_buffer", None)
    if buffer is not None and buffer_file.is_file():
        try:
            with buffer_file.open("rb") as handle:
                state = pickle.load(handle)
            rng_state = state.pop(BUFFER_RNG, None)
            buffer.set_state(state)
            if rng_state is not None and hasattr(buffer, "rng"):
                buffer.rng.bit_generator.state = rng_state
        except Exception as exc:
            raise CheckpointError(f"replay buffer '{buffer_file}' is corrupt: {_first_line(exc)}") from None


def load_module(checkpoint: Path) -> Any:
    """The trained RLModule of ``checkpoint``, read from disk once, on this process."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    module_dir = checkpoint.joinpath(*MODULE_PATH)
    if not module_dir.is_dir():
        raise CheckpointError(f"checkpoint '{checkpoint}' has no policy module ({'/'.join(MODULE_PATH)})")
    try:
        return RLModule.from_checkpoint(str(module_dir.resolve()))
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is corrupt or truncated: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    return first_line(exc, default="no details")[:300]
