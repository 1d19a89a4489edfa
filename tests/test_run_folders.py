"""Run and sweep folders: never shared, even by runs started in the same second."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, tzinfo
from pathlib import Path

import pytest


class _SameSecond(datetime):
    @classmethod
    def now(cls, tz: tzinfo | None = None) -> _SameSecond:
        return cls(2026, 12, 4, 12, 0, 0)


def test_runs_started_in_the_same_second_get_their_own_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_app.runs.layout import new_run_dir  # rl_app train and rl_app sweep both take theirs here

    monkeypatch.setattr("rl_app.runs.layout.datetime", _SameSecond)
    with ThreadPoolExecutor(8) as pool:
        folders = list(pool.map(lambda _: new_run_dir(tmp_path, "ppo_cartpole"), range(16)))
    assert len(set(folders)) == 16 and all(folder.is_dir() for folder in folders)
    assert sorted(f.name for f in folders)[:2] == ["20261204-120000", "20261204-120000-1"]
