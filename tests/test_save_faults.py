"""A signal in the middle of a checkpoint save, at each of its moments: SIGKILL leaves the latest
complete checkpoint loadable and resumable; SIGTERM still ends with a complete final checkpoint."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SMALL_PPO

from rl_app.runs.checkpoints import list_checkpoints, read_info
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

# Runs `rl_app train` with the second checkpoint save struck by a signal at one moment:
#   rllib_files    RLlib's files are written, ours (state, marker) are not
#   marker         everything but the marker is written
#   rename         the folder is complete under its .partial- name, not yet renamed
#   prune          renamed into place; an older checkpoint is about to be deleted (at the second
#                  save, or the third if keep's best-scoring rule kept the first)
# SIGKILL goes to the whole process group (the driver and the Ray processes it started).
STRIKE = """
import os, shutil, signal, sys
moment, signum = sys.argv[1], getattr(signal, sys.argv[2])
from rl_app.runs import checkpoints
from rl_app.training import loop
from rl_app.training.backends import AlgorithmBackend
saves, renamed = [], []

def strike():
    if signum == signal.SIGKILL:
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signum)

def save(learner, folder, replay_buffer, real=AlgorithmBackend.save):
    saves.append(folder)
    real(learner, folder, replay_buffer)
    if moment == "rllib_files" and len(saves) == 2:
        strike()

def write_marker(folder, info, real=checkpoints.write_marker):
    if moment == "marker" and len(saves) == 2:
        strike()
    real(folder, info)

def replace(src, dst, real=os.replace):
    if moment == "rename" and len(saves) == 2 and ".partial-" in str(src):
        strike()
    real(src, dst)
    if ".partial-" in str(src):
        renamed.append(dst)

def rmtree(path, *args, real=shutil.rmtree, **kwargs):
    if moment == "prune" and len(renamed) >= 2 and os.path.basename(str(path)).startswith("iter_"):
        strike()
    real(path, *args, **kwargs)

AlgorithmBackend.save = save
loop.write_marker = write_marker
checkpoints.os.replace = replace
checkpoints.shutil.rmtree = rmtree
from rl_app.cli import main
sys.exit(main(sys.argv[3:]))
"""
MOMENTS = ["rllib_files", "marker", "rename", "prune"]


def iterations(run_dir: Path) -> list[int]:
    with (run_dir / "progress.csv").open() as handle:
        return [int(row["iteration"]) for row in csv.DictReader(handle)]


def train_in_a_child(
    tmp_path: Path, script: str, script_args: list[str], overrides: list[str]
) -> tuple[subprocess.CompletedProcess, Path]:
    """``rl_app train ppo_cartpole`` (SMALL_PPO plus ``overrides``) run by ``script`` in a
    process of its own; the result and the run folder."""
    sets = [arg for item in [*SMALL_PPO, *overrides] for arg in ("--set", item)]
    command = ["train", "ppo_cartpole", "--runs-dir", str(tmp_path), *sets]
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    result = subprocess.run(
        [sys.executable, "-c", script, *script_args, *command],
        env=env, capture_output=True, text=True, timeout=300, start_new_session=True,
    )  # fmt: skip
    (run_dir,) = (tmp_path / "ppo_cartpole").iterdir()
    return result, run_dir


def train_struck(tmp_path: Path, moment: str, signal_name: str) -> tuple[subprocess.CompletedProcess, Path]:
    overrides = ["stop.iterations=3", "checkpoint.every=1", "checkpoint.keep=1"]
    return train_in_a_child(tmp_path, STRIKE, [moment, signal_name], overrides)


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigkill_during_a_checkpoint_save_leaves_a_complete_checkpoint_to_resume(
    moment: str, tmp_path: Path
) -> None:
    result, run_dir = train_struck(tmp_path, moment, "SIGKILL")
    assert result.returncode == -9, result.stdout + result.stderr
    latest = list_checkpoints(run_dir)[-1]
    # Before the rename the save never happened; after it, the new checkpoint is the latest.
    assert read_info(latest).iteration in ((2, 3) if moment == "prune" else (1,)), moment
    resumed = train(None, [], resume=str(run_dir), runs_root=tmp_path)
    assert resumed.status == "finished" and iterations(run_dir) == [1, 2, 3]
    assert read_info(list_checkpoints(run_dir)[-1]).iteration == 3
    assert not list((run_dir / "checkpoints").glob(".partial-*"))  # the next save cleared the leftover


@pytest.mark.parametrize("moment", ["rllib_files", "rename"])
def test_sigterm_during_a_checkpoint_save_still_ends_with_that_checkpoint_complete(
    moment: str, tmp_path: Path
) -> None:
    result, run_dir = train_struck(tmp_path, moment, "SIGTERM")
    assert result.returncode == 130, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    # The cut save, redone as the final checkpoint (keep: 1 also keeps the best-scoring one).
    assert read_info(list_checkpoints(run_dir)[-1]).iteration == 2
    resumed = train(None, [], resume=str(run_dir), runs_root=tmp_path)
    assert resumed.status == "finished" and iterations(run_dir) == [1, 2, 3]


# Lowers this process's file-size limit (RLIMIT_FSIZE) once the first checkpoint is complete: from
# then on the kernel refuses every write past the limit (EFBIG), as a full disk refuses with ENOSPC.
# The Ray processes started before are not limited; Python ignores SIGXFSZ, so writes fail, not kill.
DISK_LIMIT = """
import resource, sys
from rl_app.training import loop
limit = int(sys.argv[1])

def write_marker(folder, info, real=loop.write_marker):
    real(folder, info)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

loop.write_marker = write_marker
from rl_app.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_disk_refusing_writes_mid_run_keeps_the_last_complete_checkpoint_resumable(tmp_path: Path) -> None:
    overrides = [
        "stop.iterations=4", "checkpoint.every=1", "checkpoint.keep=3",
        "model.fcnet_hiddens=[256, 256]",  # the model's files are over the limit, the logs not
    ]  # fmt: skip
    result, run_dir = train_in_a_child(tmp_path, DISK_LIMIT, [str(64 * 1024)], overrides)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert "cannot write checkpoint iter_000002" in result.stderr and "File too large" in result.stderr
    assert "the latest complete checkpoint, iter_000001, is kept and resumable" in result.stderr
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000001"]
    assert not list((run_dir / "checkpoints").glob(".partial-*"))
    assert iterations(run_dir) == [1, 2]  # progress.csv is whole: every iteration trained
    resumed = train(None, [], resume=str(run_dir), runs_root=tmp_path)  # room on the disk again
    assert resumed.status == "finished" and iterations(run_dir) == [1, 2, 3, 4]
