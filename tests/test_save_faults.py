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

from rl_app.runs.checkpoints import list_checkpoints, read_info, verify_checkpoint
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


def in_private_mount_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``sh -c script`` in a mount namespace of its own (root can mount a tmpfs there that no other
    process sees, and it is gone when the script ends); skipped where that is not allowed."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs root and unshare -m to mount a tmpfs of its own")
    env = {
        **os.environ,
        "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments"),
        "RL_APP": f"{sys.executable} -m rl_app",
    }
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip


def train_on_a_tmpfs(
    tmp_path: Path, size: str, overrides: list[str], meanwhile: str = ""
) -> tuple[subprocess.CompletedProcess, Path]:
    """``rl_app train ppo_cartpole`` with its runs folder on a tmpfs of ``size`` of its own; the
    shell in ``meanwhile`` runs beside it (``$pid`` is the driver's); the run is copied off the
    tmpfs before the namespace, and the tmpfs, go away. The result and the copied run folder."""
    sets = " ".join(f"--set '{item}'" for item in [*overrides, "evaluation.interval=0"])
    script = f"""
        mkdir disk copy && mount -t tmpfs -o size={size} tmpfs disk || exit 99
        $RL_APP train ppo_cartpole --runs-dir disk {sets} &
        pid=$!
        {meanwhile}
        wait $pid
        code=$?
        cp -a disk/. copy/
        exit $code
    """
    result = in_private_mount_namespace(script, tmp_path)
    (run_dir,) = (tmp_path / "copy" / "ppo_cartpole").iterdir()
    return result, run_dir


def assert_refused_checkpoint(
    result: subprocess.CompletedProcess, run_dir: Path, os_error: str
) -> list[Path]:
    """One line, exit 2, naming the OS error and the checkpoint kept; every checkpoint left sound
    and no half-written one; progress.csv has every iteration trained. The checkpoints left."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert os_error in result.stderr and "cannot write checkpoint iter_" in result.stderr
    kept = list_checkpoints(run_dir)
    assert kept and f"the latest complete checkpoint, {kept[-1].name}, is kept and resumable" in result.stderr
    for checkpoint in kept:
        verify_checkpoint(checkpoint)  # every file its marker lists, at its size and CRC-32
    assert not list((run_dir / "checkpoints").glob(".partial-*"))
    assert iterations(run_dir) == list(range(1, len(kept) + 2))  # with the one whose save failed
    return kept


def test_a_disk_that_fills_for_real_stops_the_run_in_one_line_and_keeps_every_complete_checkpoint(
    tmp_path: Path,
) -> None:
    # 3 MB hold the run folder and two or three checkpoints of a [256, 256] model.
    overrides = [
        "stop.iterations=12",
        "checkpoint.every=1",
        "checkpoint.keep=12",
        "model.fcnet_hiddens=[256, 256]",
    ]
    result, run_dir = train_on_a_tmpfs(tmp_path, "3m", overrides)
    assert_refused_checkpoint(result, run_dir, "No space left on device")
    resumed = train(None, [], resume=str(run_dir), runs_root=tmp_path)  # off the full disk
    assert resumed.status == "finished" and iterations(run_dir) == list(range(1, 13))


def test_a_checkpoints_folder_made_read_only_mid_run_stops_the_run_in_one_line(tmp_path: Path) -> None:
    # The driver is stopped between iterations while its checkpoints folder is bind-mounted
    # read-only over itself (a remount of a folder with files open for writing is refused by the
    # kernel), then let go on; its next save meets a read-only file system.
    overrides = [
        "stop.iterations=50",
        "checkpoint.every=1",
        "checkpoint.keep=5",
        "training.train_batch_size_per_learner=2048",
    ]
    meanwhile = """
        until [ -e disk/ppo_cartpole/*/checkpoints/iter_000002/rl_app_checkpoint.json ]; do sleep 0.01; done
        kill -STOP $pid
        folder=$(echo disk/ppo_cartpole/*/checkpoints)
        mount --bind "$folder" "$folder" && mount -o remount,bind,ro "$folder" || exit 98
        kill -CONT $pid
    """
    result, run_dir = train_on_a_tmpfs(tmp_path, "64m", overrides, meanwhile)
    kept = assert_refused_checkpoint(result, run_dir, "Read-only file system")
    assert kept[-1].name == "iter_000002"  # the save of iteration 3 was the first to meet it
