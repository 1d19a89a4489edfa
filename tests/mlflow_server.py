"""A real MLflow tracking server for the tests: SQLite store, proxied artifacts, loopback only,
stopped by the process group it was started in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rl_app.cluster.nodes import free_port


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with its store and artifacts in ``folder``; start, kill, start again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [
            str(mlflow), "server",
            "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
            "--artifacts-destination", str(self.folder / "artifacts"),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        log = (self.folder / "server.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"mlflow server did not answer in {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL to the server and its workers (their own process group)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None
