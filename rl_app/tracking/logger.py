"""Logging to MLflow from a thread of its own: a slow or stopped server delays the log, never training.

Everything to log is queued in order and sent by one thread. When the server does not answer, the
thread keeps the queue, says so once, and retries with a growing pause; when it answers again the
backlog goes out. At the end a run waits a bounded time and then says what was not logged.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_app.errors import first_line
from rl_app.tracking.target import TrackingTarget

# MLflow's HTTP client retries a refused connection 7 times with a doubling pause (minutes); our
# thread retries itself, so each request fails fast. Its "View run" lines would cut through the live
# table: the run's link is printed once, by us. The user's own settings win.
MLFLOW_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
RETRY_PAUSES_S = (1.0, 2.0, 5.0, 10.0, 30.0)
# MLflow's limits (mlflow.utils.validation): values per request and characters per name and value.
METRICS_PER_REQUEST, PARAMS_PER_REQUEST, KEY_LENGTH, PARAM_LENGTH = 1000, 100, 250, 6000
_UNSAFE_KEY = re.compile(r"[^\w\-. /]")
FINAL_STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


def metric_key(name: str) -> str:
    """``name`` as MLflow takes a metric, param or tag key (other characters made ``_``)."""
    return _UNSAFE_KEY.sub("_", name)[:KEY_LENGTH]


def finite_numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``values`` (NaN is what a metric without a value this iteration is)."""
    return {
        metric_key(k): float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def flat_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested experiment data as dotted params (``training.lr``); lists as their YAML-like text."""
    params: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            params.update(flat_params(value, f"{name}."))
        else:
            params[metric_key(name)] = str(value)[:PARAM_LENGTH]
    return params


@dataclass
class RunOpening:
    """How a run is found or made: an earlier run id to continue, or tags that find one (a resumed
    sweep's trial), else a new run."""

    run_name: str
    tags: dict[str, str]
    params: dict[str, str]
    parent: str | None = None  # the key of the parent run (a sweep)
    run_id: str | None = None
    find_by_tags: dict[str, str] | None = None
    # progress rows (step, metrics) written before this process: those past the run's last logged
    # step are sent once it is open
    backfill: list[tuple[int, dict[str, float]]] = field(default_factory=list)


@dataclass
class _Item:
    key: str
    kind: str  # open | metrics | artifacts | close
    payload: Any


class MlflowLog:
    """The queue and thread that log runs (by our key) to one MLflow target."""

    def __init__(
        self,
        target: TrackingTarget,
        warn: Callable[[str], None],
        on_open: Callable[[str, str, str], None] | None = None,
    ) -> None:
        for name, value in MLFLOW_SETTINGS.items():
            os.environ.setdefault(name, value)
        self.target, self._warn, self._on_open = target, warn, on_open
        self.run_ids: dict[str, str] = {}
        self.experiment_id: str | None = None
        self.failure: str | None = None  # why the server does not answer, while it does not
        self._items: deque[_Item] = deque()
        self._wake = threading.Condition()
        self._closing = self._abandoned = False
        self._thread = threading.Thread(target=self._work, name="mlflow-log", daemon=True)
        self._thread.start()

    def open_run(self, key: str, opening: RunOpening) -> None:
        self._put(_Item(key, "open", opening))

    def log_metrics(self, key: str, step: int, values: dict[str, float]) -> None:
        if values:
            self._put(_Item(key, "metrics", (step, values)))

    def log_artifacts(self, key: str, paths: Iterable[Path]) -> None:
        present = [p for p in paths if p.exists()]
        if present:
            self._put(_Item(key, "artifacts", present))

    def close_run(self, key: str, status: str) -> None:
        self._put(_Item(key, "close", FINAL_STATUS.get(status, status)))

    def close(self, wait_s: float = 30.0) -> list[str]:
        """Send what is queued, waiting at most ``wait_s`` (a few seconds when the server is down);
        what was not logged, one line each."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()  # a pause before the next retry ends now
        self._thread.join(wait_s if self.failure is None else min(wait_s, 5.0))
        with self._wake:
            self._abandoned = True
            left = list(self._items)
        if not left:
            return []
        return [self._unsent(left)]

    def _unsent(self, left: list[_Item]) -> str:
        rows = sum(item.kind == "metrics" for item in left)
        rows += sum(len(item.payload.backfill) for item in left if item.kind == "open")
        files = sum(len(item.payload) for item in left if item.kind == "artifacts")
        parts = [f"{rows} iteration(s) of metrics"] if rows else []
        parts += [f"{files} artifact(s)"] if files else []
        parts += ["the run's end"] if any(item.kind == "close" for item in left) else []
        why = f" ({self.failure})" if self.failure else ""
        return f"not logged to {self.target.describe()}{why}: {', '.join(parts) or 'the run'}"

    def _put(self, item: _Item) -> None:
        with self._wake:
            self._items.append(item)
            self._wake.notify_all()

    def _work(self) -> None:
        client: Any = None
        failures = 0
        while True:
            with self._wake:
                while not self._items and not self._closing:
                    self._wake.wait()
                if not self._items or self._abandoned:
                    return
                item = self._items[0]
            try:
                if client is None:
                    client = self._client()
                self._send(client, item)
            except Exception as exc:
                if _refused(exc):  # the server answered no: retrying would not change it
                    self._warn(f"MLflow refused to log {item.kind} ({first_line(exc)}); skipped")
                else:
                    if self.failure is None:
                        self.failure = first_line(exc)[:300]
                        self._warn(
                            f"{self.target.describe()} does not answer ({self.failure}); training goes "
                            "on and what it logs is kept and sent when the server is back"
                        )
                    pause = RETRY_PAUSES_S[min(failures, len(RETRY_PAUSES_S) - 1)]
                    failures += 1
                    with self._wake:
                        if not self._closing:
                            self._wake.wait(pause)
                        elif failures > 1:  # closing: one more try, then what is left is reported
                            return
                    continue
            with self._wake:
                self._items.popleft()
            if self.failure is not None:
                self._warn(f"{self.target.describe()} answers again; what was kept is being logged")
                self.failure, failures = None, 0

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.target.uri)
        experiment = client.get_experiment_by_name(self.target.experiment_name)
        if experiment is not None:
            self.experiment_id = experiment.experiment_id
        else:
            if self.target.artifact_root is not None:
                Path(self.target.artifact_root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
            location = (
                f"{self.target.artifact_root}/{self.target.experiment_name}"
                if self.target.artifact_root
                else None
            )
            self.experiment_id = client.create_experiment(
                self.target.experiment_name, artifact_location=location
            )
        return client

    def _send(self, client: Any, item: _Item) -> None:
        from mlflow.entities import Metric

        if item.kind == "open":
            self._open(client, item.key, item.payload)
            return
        run_id = self.run_ids.get(item.key)
        if run_id is None:  # its opening was refused: nothing to log into
            return
        if item.kind == "metrics":
            step, values = item.payload
            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, step) for k, v in values.items()]
            for start in range(0, len(metrics), METRICS_PER_REQUEST):
                client.log_batch(run_id, metrics=metrics[start : start + METRICS_PER_REQUEST])
        elif item.kind == "artifacts":
            for path in item.payload:
                if path.is_dir():
                    client.log_artifacts(run_id, str(path), artifact_path=path.name)
                else:
                    client.log_artifact(run_id, str(path))
        elif item.kind == "close":
            client.set_terminated(run_id, item.payload)

    def _open(self, client: Any, key: str, opening: RunOpening) -> None:
        from mlflow.entities import Metric, Param

        if key in self.run_ids:
            return

        run_id = opening.run_id if opening.run_id and _exists(client, opening.run_id) else None
        if run_id is None and opening.find_by_tags:
            query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in opening.find_by_tags.items())
            found = client.search_runs([self.experiment_id], filter_string=query, max_results=1)
            run_id = found[0].info.run_id if found else None
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
        else:
            tags = dict(opening.tags)
            if opening.parent is not None and opening.parent in self.run_ids:
                tags["mlflow.parentRunId"] = self.run_ids[opening.parent]
            run_id = client.create_run(self.experiment_id, run_name=opening.run_name, tags=tags).info.run_id
            params = [Param(k, v) for k, v in opening.params.items()]
            for start in range(0, len(params), PARAMS_PER_REQUEST):
                client.log_batch(run_id, params=params[start : start + PARAMS_PER_REQUEST])
        if opening.backfill:
            logged = client.get_metric_history(run_id, "timesteps")
            last = max((m.step for m in logged), default=-1)
            now = int(time.time() * 1000)
            metrics = [
                Metric(k, v, now, step)
                for step, values in opening.backfill
                if step > last
                for k, v in values.items()
            ]
            for start in range(0, len(metrics), METRICS_PER_REQUEST):
                client.log_batch(run_id, metrics=metrics[start : start + METRICS_PER_REQUEST])
            opening.backfill = []
        self.run_ids[key] = run_id
        if self._on_open is not None:
            self._on_open(key, run_id, str(self.experiment_id))


def _exists(client: Any, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException as exc:
        if exc.get_http_status_code() == 404:
            return False
        raise
    return True


def _refused(exc: Exception) -> bool:
    """A 4xx answer from MLflow: the request itself is wrong (a too long value, a deleted run)."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and 400 <= exc.get_http_status_code() < 500
