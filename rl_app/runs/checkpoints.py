"""Checkpoint lifecycle: atomic saves, keep the last K plus the best, find and check the latest.

A checkpoint is ``checkpoints/iter_NNNNNN/`` (or a folder Tune hands a sweep trial): what
the training loop writes into it (RLlib's checkpoint, the replay buffer, our loop state)
and our marker ``rl_app_checkpoint.json`` (iteration, timesteps, returns, algorithm, and
the size and CRC-32 of every other file), written last, so only a checkpoint that has it is
complete, on local disk and on remote storage alike, and one whose files changed after it
was written (bit rot, a bad copy) is known as damaged before anything tries to load it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_app.errors import UserError

CHECKPOINT_NAME = re.compile(r"^iter_(\d{6,})$")
MARKER = "rl_app_checkpoint.json"
# A damaged checkpoint is renamed to this (never deleted), which no listing takes for a checkpoint.
SET_ASIDE_SUFFIX = ".damaged"


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or for something else."""


class DamagedCheckpoint(CheckpointError):
    """A complete checkpoint whose marker is unreadable or whose files are not those it lists."""

    def __init__(self, checkpoint: Path, detail: str) -> None:
        super().__init__(f"checkpoint '{checkpoint}' is damaged: {detail}")
        self.detail = detail


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
    # ray, torch, gymnasium and rl_app as installed when it was written (empty in older markers)
    versions: dict[str, str] = field(default_factory=dict)
    # The env's observation space (rl_app.envs.spaces.describe) where the module's Box is its
    # flattening; None for a Box, and in older markers.
    observation_space: dict[str, Any] | None = None
    # Several agents: each policy's observation space, described as ``observation_space`` is
    # (None where it is a Box); None for one agent.
    policies: dict[str, dict[str, Any] | None] | None = None

    @property
    def score(self) -> float:
        """Evaluation return when there is one, else the training return; -inf when neither."""
        for value in (self.eval_return_mean, self.return_mean):
            if value is not None and math.isfinite(value):
                return value
        return -math.inf


STAMPED_PACKAGES = ("ray", "torch", "gymnasium", "rl_app")


def installed_versions() -> dict[str, str]:
    """The versions a checkpoint written now is stamped with."""
    from importlib import metadata

    found = {}
    for name in STAMPED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def check_ray_version(checkpoint: Path, info: CheckpointInfo, allow_mismatch: bool = False) -> None:
    """Refuse a checkpoint written by another Ray: RLlib restores only on the version that wrote it."""
    written, installed = info.versions.get("ray"), installed_versions().get("ray")
    if written and installed and written != installed and not allow_mismatch:
        raise CheckpointError(
            f"checkpoint '{checkpoint}' was written with Ray {written}, this is Ray {installed}; "
            "RLlib restores checkpoints only on the Ray version that wrote them "
            "(--allow-version-mismatch to try anyway)"
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
        return CheckpointInfo(**{k: data[k] for k in CheckpointInfo.__dataclass_fields__ if k in data})
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint '{checkpoint}' is incomplete or not an rl_app checkpoint (no {MARKER})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DamagedCheckpoint(checkpoint, f"{MARKER} unreadable ({exc})") from None


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


def checkpoints_to_keep(infos: dict[str, CheckpointInfo], keep: int) -> set[str]:
    """The newest ``keep`` plus the best-scoring one."""
    by_iteration = sorted(infos, key=lambda name: infos[name].iteration)
    kept = set(by_iteration[-keep:])
    if infos:
        kept.add(max(by_iteration, key=lambda name: (infos[name].score, infos[name].iteration)))
    return kept


def _files(folder: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MARKER:
            yield path.relative_to(folder).as_posix(), path


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_marker(folder: Path, info: CheckpointInfo) -> None:
    """Mark ``folder`` as a complete checkpoint: call this after everything else is written.
    The marker lists every file with its size and CRC-32, which :func:`verify_checkpoint` checks."""
    files = {name: [path.stat().st_size, _crc32(path)] for name, path in _files(folder)}
    (folder / MARKER).write_text(json.dumps({**asdict(info), "files": files}, indent=2) + "\n")


def verify_checkpoint(checkpoint: Path) -> None:
    """DamagedCheckpoint naming the first file that is missing or differs from when the marker was
    written. Markers older than the file list are taken as they are (loading is their check)."""
    read_info(checkpoint)
    files = json.loads((checkpoint / MARKER).read_text()).get("files")
    if not isinstance(files, dict):
        return
    for name, listed in files.items():
        try:
            size, crc = (int(value) for value in listed)
        except (TypeError, ValueError):
            raise DamagedCheckpoint(checkpoint, f"{MARKER} lists {name} as {listed!r}") from None
        path = checkpoint / name
        if not path.is_file():
            raise DamagedCheckpoint(checkpoint, f"{name} is missing")
        actual = path.stat().st_size
        if actual != size:
            raise DamagedCheckpoint(checkpoint, f"{name} has {actual:,} bytes, {size:,} when written")
        if _crc32(path) != crc:
            raise DamagedCheckpoint(checkpoint, f"{name} differs from when it was written (CRC-32)")


def set_aside(checkpoint: Path) -> Path:
    """Rename a damaged checkpoint out of the listing (``iter_000010.damaged``, ``.damaged-2``, ...)."""
    target = checkpoint.with_name(checkpoint.name + SET_ASIDE_SUFFIX)
    count = 1
    while target.exists():
        count += 1
        target = checkpoint.with_name(f"{checkpoint.name}{SET_ASIDE_SUFFIX}-{count}")
    os.replace(checkpoint, target)
    return target


def newest_sound_checkpoint(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint of a run whose files are as written, and the newer ones
    that are damaged, each with why (newest first)."""
    damaged = []
    for checkpoint in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(checkpoint)
        except CheckpointError as exc:
            if checkpoint.is_dir():  # else pruned meanwhile by the run writing it: not damage
                damaged.append((checkpoint, exc.detail if isinstance(exc, DamagedCheckpoint) else str(exc)))
            continue
        return checkpoint, damaged
    return None, damaged


def fallback_note(
    chosen: Path | None,
    damaged: list[tuple[Path, str]],
    kept_aside: dict[Path, Path] | None = None,
    chosen_as: str = "the newest",
) -> str:
    """One line on the damaged checkpoints passed over (and where each was kept aside), and the one
    used instead (``chosen_as``: the newest, or a trial's best)."""
    moved = kept_aside or {}
    parts = [
        f"{checkpoint.name} is damaged ({why})"
        + (f", kept aside as {moved[checkpoint].name}" if checkpoint in moved else "")
        for checkpoint, why in damaged
    ]
    using = f"using {chosen.name}, {chosen_as} whose files are as written" if chosen else "none other to use"
    return f"{'; '.join(parts)}; {using}"


def save_checkpoint(
    run_dir: Path, iteration: int, keep: int, write: Callable[[Path], object]
) -> tuple[Path, list[str]]:
    """Save ``checkpoints/iter_NNNNNN`` with ``write(folder)``, then prune; returns it and the pruned names.

    ``write`` fills the folder and writes the marker last. It writes into a hidden
    ``.partial-`` folder that is renamed into place once complete, so a process killed
    mid-save leaves nothing that looks finished.
    """
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(iteration)
    if not is_complete(final):
        partial = root / f".partial-{final.name}"
        shutil.rmtree(partial, ignore_errors=True)
        write(partial)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
    infos = {}
    for checkpoint in list_checkpoints(run_dir):
        with contextlib.suppress(DamagedCheckpoint):  # one whose marker is unreadable is kept as it is
            infos[checkpoint.name] = read_info(checkpoint)
    pruned = sorted(set(infos) - checkpoints_to_keep(infos, keep))
    for name in pruned:
        shutil.rmtree(root / name, ignore_errors=True)
    return final, pruned


def resolve_checkpoint(path: Path, warn: Callable[[str], None] | None = None) -> Path:
    """A checkpoint folder from a checkpoint, a run folder (its newest complete checkpoint whose
    files are as written; ``warn`` hears of damaged newer ones) or a sweep trial folder (its best
    complete checkpoint)."""
    if not path.exists():
        raise CheckpointError(f"'{path}' does not exist (expected a run folder or a checkpoint)")
    if (path / MARKER).exists() or CHECKPOINT_NAME.match(path.name):
        verify_checkpoint(path)  # named explicitly: a damaged one is refused, not replaced
        return path
    if (path / "metadata.json").is_file() or checkpoints_dir(path).is_dir():
        chosen, damaged = newest_sound_checkpoint(path)
        if damaged and warn is not None:
            warn(fallback_note(chosen, damaged))
        if chosen is None:
            raise CheckpointError(
                f"run '{path}' has no checkpoint whose files are as written ({damaged[0][1]})"
                if damaged
                else _no_checkpoint_yet(path)
            )
        return chosen
    trial_checkpoints = [p for p in path.glob("checkpoint_*") if (p / MARKER).is_file()]
    if trial_checkpoints:  # a sweep trial: Tune's checkpoint_NNNNNN folders, with our marker
        infos, damaged = {}, []
        for checkpoint in trial_checkpoints:
            try:
                verify_checkpoint(checkpoint)
                infos[checkpoint] = read_info(checkpoint)
            except DamagedCheckpoint as exc:
                damaged.append((checkpoint, exc.detail))
        chosen = max(infos, key=lambda p: (infos[p].score, infos[p].iteration)) if infos else None
        if damaged and warn is not None:
            warn(fallback_note(chosen, damaged, chosen_as="the best"))
        if chosen is None:
            raise CheckpointError(
                f"trial '{path}' has no checkpoint whose files are as written ({damaged[0][1]})"
            )
        return chosen
    runs = sorted(p.parent for p in path.glob("*/metadata.json"))
    if runs:
        raise CheckpointError(
            f"'{path}' is a folder of {len(runs)} runs, not a run; the latest is {runs[-1]}"
        )
    raise CheckpointError(f"'{path}' is neither a run folder nor an rl_app checkpoint")


def _no_checkpoint_yet(run_dir: Path) -> str:
    """Why a run has no checkpoint: still running (and when the first one comes), or none was kept."""
    from rl_app.runs.layout import experiment_data, run_status

    if run_status(run_dir) != "running":
        return f"run '{run_dir}' has no complete checkpoint"
    data = experiment_data(run_dir)
    try:
        every = int((data.get("checkpoint") or {}).get("every", 10)) if data else None
    except (ValueError, TypeError, AttributeError):
        every = None
    if every is None:
        return f"run '{run_dir}' is still running and has no checkpoint yet"
    return (
        f"run '{run_dir}' is still running and has no checkpoint yet; "
        f"its first comes at iteration {every} (checkpoint.every)"
    )
