"""Shared fixtures: a small Ray session per module, isolated experiment folders."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import local_ray

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

REPO = Path(__file__).resolve().parents[1]
SHIPPED_EXPERIMENTS = REPO / "experiments"


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """One small local Ray for the whole test module, always shut down."""
    with local_ray():
        yield


@pytest.fixture
def experiments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty experiments folder that rl_app reads instead of the shipped one."""
    folder = tmp_path / "experiments"
    folder.mkdir()
    monkeypatch.setenv("RL_APP_EXPERIMENTS_DIR", str(folder))
    return folder


@pytest.fixture
def shipped(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Read the shipped experiments, whatever the working directory."""
    monkeypatch.setenv("RL_APP_EXPERIMENTS_DIR", str(SHIPPED_EXPERIMENTS))
    return SHIPPED_EXPERIMENTS
