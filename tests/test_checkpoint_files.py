"""A checkpoint's marker lists its files; damage after the marker was written is found before loading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rl_app.runs.checkpoints import (
    MARKER,
    CheckpointError,
    CheckpointInfo,
    list_checkpoints,
    newest_sound_checkpoint,
    resolve_checkpoint,
    set_aside,
    verify_checkpoint,
    write_marker,
)


def make_checkpoint(run_dir: Path, iteration: int) -> Path:
    folder = run_dir / "checkpoints" / f"iter_{iteration:06d}"
    (folder / "learner").mkdir(parents=True)
    (folder / "learner" / "state.pkl").write_bytes(bytes(range(256)) * 40 + bytes([iteration]))
    (folder / "loop_state.pkl").write_bytes(b"loop")
    info = CheckpointInfo(iteration, 100 * iteration, math.nan, math.nan, "PPO", "CartPole-v1", "x", False)
    write_marker(folder, info)
    return folder


def flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: flip_one_bit(c / "learner" / "state.pkl"), "learner/state.pkl differs from when"),
        (lambda c: (c / "loop_state.pkl").write_bytes(b"lo"), "loop_state.pkl has 2 bytes, 4 when written"),
        (lambda c: (c / "learner" / "state.pkl").unlink(), "learner/state.pkl is missing"),
    ],
    ids=["one_bit_flipped", "truncated", "missing"],
)
def test_damage_after_the_marker_is_named(tmp_path: Path, damage, message: str) -> None:
    checkpoint = make_checkpoint(tmp_path, 1)
    verify_checkpoint(checkpoint)
    damage(checkpoint)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(checkpoint)


def test_a_marker_without_a_file_list_is_taken_as_it_is(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path, 1)
    marker = json.loads((checkpoint / MARKER).read_text())
    del marker["files"]
    (checkpoint / MARKER).write_text(json.dumps(marker))
    flip_one_bit(checkpoint / "learner" / "state.pkl")
    verify_checkpoint(checkpoint)  # written before markers listed files: loading is its only check


def test_a_run_falls_back_past_damaged_checkpoints_and_a_named_one_is_refused(tmp_path: Path) -> None:
    first, second, third = (make_checkpoint(tmp_path, i) for i in (1, 2, 3))
    flip_one_bit(third / "learner" / "state.pkl")
    (second / "loop_state.pkl").unlink()
    chosen, damaged = newest_sound_checkpoint(tmp_path)
    assert chosen == first
    assert [(path, why.split(" ")[0]) for path, why in damaged] == [
        (third, "learner/state.pkl"),
        (second, "loop_state.pkl"),
    ]
    heard: list[str] = []
    assert resolve_checkpoint(tmp_path, heard.append) == first
    assert len(heard) == 1 and heard[0].startswith("iter_000003 is damaged (learner/state.pkl")
    assert heard[0].endswith("using iter_000001, the newest whose files are as written")
    with pytest.raises(CheckpointError, match="iter_000003' is damaged"):
        resolve_checkpoint(third)


def test_set_aside_renames_and_never_overwrites(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path, 2)
    contents = (checkpoint / "learner" / "state.pkl").read_bytes()
    first = set_aside(checkpoint)
    again = set_aside(make_checkpoint(tmp_path, 2))
    assert (first.name, again.name) == ("iter_000002.damaged", "iter_000002.damaged-2")
    assert (first / "learner" / "state.pkl").read_bytes() == contents
    assert list_checkpoints(tmp_path) == []  # set-aside folders are never taken for checkpoints


def test_a_malformed_file_list_is_damage_not_a_traceback(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path, 1)
    marker = json.loads((checkpoint / MARKER).read_text())
    marker["files"]["loop_state.pkl"] = "four bytes"
    (checkpoint / MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match=r"lists loop_state\.pkl as 'four bytes'"):
        verify_checkpoint(checkpoint)


def test_a_checkpoint_pruned_while_it_is_checked_is_not_called_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from rl_app.runs import checkpoints

    first, second = make_checkpoint(tmp_path, 1), make_checkpoint(tmp_path, 2)
    real_verify = checkpoints.verify_checkpoint

    def pruned_meanwhile(checkpoint: Path) -> None:
        if checkpoint == second:  # the run writing it prunes it between listing and checking
            shutil.rmtree(second)
        real_verify(checkpoint)

    monkeypatch.setattr(checkpoints, "verify_checkpoint", pruned_meanwhile)
    assert newest_sound_checkpoint(tmp_path) == (first, [])


def test_a_sweep_trial_gives_its_best_sound_checkpoint(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    best, other = trial / "checkpoint_000002", trial / "checkpoint_000001"
    for folder, score in ((best, 9.0), (other, 5.0)):
        (folder / "learner").mkdir(parents=True)
        (folder / "learner" / "state.pkl").write_bytes(b"weights" * 100)
        write_marker(folder, CheckpointInfo(1, 100, score, score, "PPO", "CartPole-v1", "x", False))
    assert resolve_checkpoint(trial) == best
    flip_one_bit(best / "learner" / "state.pkl")
    heard: list[str] = []
    assert resolve_checkpoint(trial, heard.append) == other
    assert heard[0].endswith("using checkpoint_000001, the best whose files are as written")


def test_pruning_keeps_a_checkpoint_whose_marker_is_unreadable(tmp_path: Path) -> None:
    from rl_app.runs.checkpoints import save_checkpoint

    broken = make_checkpoint(tmp_path, 1)
    (broken / MARKER).write_text("{")

    def write(folder: Path) -> None:
        folder.mkdir(parents=True)
        info = CheckpointInfo(2, 200, math.nan, math.nan, "PPO", "CartPole-v1", "x", False)
        write_marker(folder, info)

    final, pruned = save_checkpoint(tmp_path, 2, keep=1, write=write)
    assert final.name == "iter_000002" and pruned == [] and broken.is_dir()
