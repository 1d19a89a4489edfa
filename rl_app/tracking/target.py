"""Which MLflow server and experiment a run logs to, decided before anything starts (no MLflow import)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rl_app.config import ExperimentConfig
from rl_app.errors import UserError

LOCAL_FOLDER = "mlruns"  # beside runs/: the store when no server is named
# The schemes of MLflow's tracking stores. A bare path would be its file store, which MLflow 3 refuses.
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")


@dataclass(frozen=True)
class TrackingTarget:
    """An MLflow tracking URI and experiment; ``artifact_root`` only for the local store (a server
    keeps its own)."""

    uri: str
    experiment_name: str
    artifact_root: str | None = None

    def describe(self) -> str:
        return f"MLflow {self.uri}, experiment {self.experiment_name!r}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def local_store(runs_root: Path) -> tuple[str, str]:
    """The SQLite store and artifact folder of ``mlruns/`` next to ``runs_root``."""
    root = runs_root.resolve().parent / LOCAL_FOLDER
    return f"sqlite:///{root / 'mlflow.db'}", (root / "artifacts").as_uri()


def check_tracking_uri(uri: str, source: str) -> str:
    """``uri`` when MLflow can track there; else one line saying what it takes."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme not in TRACKING_SCHEMES:
        raise UserError(
            f"{source}: {uri!r} is not an MLflow tracking URI (http(s)://HOST:PORT of a tracking "
            f"server, sqlite:///path/mlflow.db or another database; schemes: {', '.join(TRACKING_SCHEMES)})"
        )
    return uri


def tracking_target(
    experiment: ExperimentConfig,
    name: str,
    *,
    track: bool,
    uri: str | None,
    runs_root: Path,
    recorded: dict[str, Any] | None = None,
) -> TrackingTarget | None:
    """Where the run logs: ``recorded`` (a resumed run's, from its metadata) continues where it was,
    at ``uri`` if given; else, when ``track`` or the experiment asks, ``uri``, $MLFLOW_TRACKING_URI
    or the local store."""
    if uri is not None:
        check_tracking_uri(uri, "--tracking-uri")
    if recorded:
        return TrackingTarget(
            uri or recorded["uri"], recorded["experiment_name"], recorded.get("artifact_root")
        )
    if not (track or experiment.tracking.mlflow):
        return None
    experiment_name = experiment.tracking.experiment_name or name
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    if uri:
        return TrackingTarget(check_tracking_uri(uri, "$MLFLOW_TRACKING_URI"), experiment_name)
    store, artifacts = local_store(runs_root)
    return TrackingTarget(store, experiment_name, artifacts)
