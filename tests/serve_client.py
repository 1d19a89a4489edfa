"""A client for `rl_app serve` running as a real process: a free loopback port, requests over
http.client, and a server started and stopped around a test."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_app.cluster.nodes import free_port


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    text: str


def request(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        sent = {"content-type": "application/json", **(headers or {})} if data is not None else headers or {}
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        text = response.read().decode()
    finally:
        connection.close()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = {}
    return Answer(response.status, parsed if isinstance(parsed, dict) else {}, text)


def act(port: int, observations: Any, **headers: str) -> Answer:
    return request(port, "POST", "/v1/act", {"observations": observations}, headers)


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log: Path  # its stdout and stderr

    def output(self) -> str:
        return self.log.read_text()


@contextmanager
def serving(*args: str, timeout: float = 120) -> Iterator[Server]:
    """``rl_app serve ARGS`` on a free port, answering /v1/health; stopped with SIGTERM after."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rl_app-serve-test-") as scratch:
        log = Path(scratch) / "serve.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "rl_app", "serve", *args, "--port", str(port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        server = Server(port, process, log)
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert process.poll() is None, server.output()
                try:
                    if request(port, "GET", "/v1/health").status == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the server never answered /v1/health"
                time.sleep(0.1)
            yield server
        finally:
            process.terminate()
            process.wait(timeout=30)
