"""``rl_app serve``: load a policy, check the address and token, and run the app on uvicorn."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import itertools
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from rl_app.errors import UserError, error_detail
from rl_app.serve.app import PolicyGroup, PolicyService, ServeMetrics, ServeSettings, build_app
from rl_app.serve.connections import (
    BoundedShutdownServer,
    ConnectionLimits,
    ShutdownReport,
    connection_book,
    limited_protocol,
)
from rl_app.serve.policy import POLICIES_FILE, SPEC, ServedPolicy, load_served_policies


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: Path | None, host: str) -> str | None:
    """The API token from ``token_file``; required when ``host`` is not a loopback address."""
    if token_file is None:
        if not is_loopback(host):
            raise UserError(
                f"--host {host} is reachable from other machines: give --token-file with an API token "
                "(clients send it as 'Authorization: Bearer <token>')"
            )
        return None
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise UserError(f"--token-file {token_file}: cannot read it ({error_detail(exc)})") from None
    if len(token) < 16:
        raise UserError(f"--token-file {token_file}: the token must be at least 16 characters")
    return token


@contextmanager
def policy_source(
    location: str, fmt: str | None, runs_root: Path, allow_version_mismatch: bool = False
) -> Iterator[Callable[[], ServedPolicy | dict[str, ServedPolicy]]]:
    """A function loading the policy at ``location`` now, again at each reload.

    An export folder (``policy.json``) is read as it is, with numpy and onnxruntime alone. A run
    folder, checkpoint or storage URI is exported first (its newest checkpoint each time) into a
    scratch folder removed on exit; that needs the training environment.
    """
    folder = Path(location)
    if (folder / SPEC).is_file() or (folder / POLICIES_FILE).is_file():
        yield lambda: load_served_policies(folder, fmt)
        return
    scratch = Path(tempfile.mkdtemp(prefix="rl_app-serve-"))
    exports = itertools.count()

    def export_and_load() -> ServedPolicy | dict[str, ServedPolicy]:
        import io

        from rich.console import Console

        from rl_app.policy.export import export_policy

        target = scratch / f"export-{next(exports)}"
        export_policy(
            location,
            fmt or "onnx",
            target,
            runs_root=runs_root,
            allow_version_mismatch=allow_version_mismatch,
            console=Console(file=io.StringIO()),
            warn=lambda text: print(f"warning: {text}", flush=True),  # a damaged checkpoint passed over
        )
        return load_served_policies(target, fmt)

    try:
        yield export_and_load
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _log(line: str) -> None:
    print(line, flush=True)


def _service(
    source: Callable[[], ServedPolicy | dict[str, ServedPolicy]], settings: ServeSettings
) -> PolicyService | PolicyGroup:
    """One policy's service, or, for several agents' policies, a group of them whose reload loads
    the source once for all."""
    loaded = source()
    if isinstance(loaded, ServedPolicy):
        return PolicyService(loaded, settings, reload_policy=lambda: _one(source()), log=_log)
    metrics = ServeMetrics()  # one registry for every policy's requests
    services = {
        name: PolicyService(policy, settings, log=_log, metrics=metrics) for name, policy in loaded.items()
    }
    return PolicyGroup(services, reload_policies=lambda: _several(source()))


def _one(loaded: ServedPolicy | dict[str, ServedPolicy]) -> ServedPolicy:
    if isinstance(loaded, dict):
        raise UserError("the reloaded source holds several agents' policies now; restart the server")
    return loaded


def _several(loaded: ServedPolicy | dict[str, ServedPolicy]) -> dict[str, ServedPolicy]:
    if not isinstance(loaded, dict):
        raise UserError("the reloaded source holds one policy now; restart the server")
    return loaded


def _served(service: PolicyService | PolicyGroup) -> str:
    """What the start line says is served."""
    if isinstance(service, PolicyGroup):
        return f"the policies {', '.join(service.services)} (a request names its 'policy')"
    policy = service.policy
    return f"{policy.name} (iteration {policy.spec.get('iteration')}, {policy.file})"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), or a one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({error_detail(exc)})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    location: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token_file: Path | None = None,
    fmt: str | None = None,
    settings: ServeSettings | None = None,
    runs_root: Path = Path("runs"),
    allow_version_mismatch: bool = False,
    limits: ConnectionLimits | None = None,
) -> ShutdownReport | None:
    """Serve the policy at ``location`` over HTTP until Ctrl-C or SIGTERM; SIGHUP reloads it.

    Returns how the shutdown went: how many requests it cut, and how long it took.
    """
    import uvicorn

    limits = limits or ConnectionLimits()
    book = connection_book(limits.max_connections)  # checked before the policy is loaded
    token = read_token(token_file, host)
    settings = ServeSettings(**{**asdict(settings or ServeSettings()), "token": token})
    with policy_source(location, fmt, runs_root, allow_version_mismatch) as source:
        service = _service(source, settings)
        app = build_app(service)
        sock = bind(host, port)
        address = sock.getsockname()
        config = uvicorn.Config(
            app,
            http=limited_protocol(limits, book, service.metrics, app),
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_keep_alive=limits.keep_alive_timeout_s,
            lifespan="on",
        )
        server = BoundedShutdownServer(config, book, limits.shutdown_timeout_s)

        async def run() -> None:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(service.reload()))
            batching = f"max batch {settings.max_batch_size}, max wait {settings.max_wait_ms:g} ms"
            connections = (
                f"at most {book.max_connections} connections, read timeout {limits.read_timeout_s:g} s, "
                f"shutdown timeout {limits.shutdown_timeout_s:g} s"
            )
            print(
                f"Serving {_served(service)} "
                f"on http://{address[0]}:{address[1]} ({batching}; {connections}"
                f"{'; bearer token required' if token else ''}); SIGHUP or POST /v1/reload reloads",
                flush=True,
            )
            # Everything loaded so far (onnxruntime, numpy, the app) lives as long as the server:
            # out of the collector's generations, a full collection no longer walks it, and the
            # pauses that made the slowest 1 % of requests at c=64 (bench/README.md) shrink.
            gc.collect()
            gc.freeze()
            await server.serve(sockets=[sock])

        # uvicorn raises the signal again once it has stopped, to end the process the signal's
        # default way; these handlers take it instead, so that the shutdown's report is printed and
        # becomes the exit code.
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # uvloop when installed
                runner.run(run())
        finally:
            sock.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if server.report is not None:
            print(server.report.line(limits.shutdown_timeout_s), flush=True)
        return server.report
