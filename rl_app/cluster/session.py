"""Start (or join) Ray for one command, and always shut down what we started."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rl_app.errors import UserError, first_line
from rl_app.library_logs import capture_library_logs


@dataclass(frozen=True)
class Cluster:
    num_cpus: int
    num_gpus: int
    address: str | None  # None: a local Ray started by us (or by the caller)


@contextmanager
def this_machine() -> Iterator[Cluster]:
    """This machine's cores, without Ray: for what runs in this process alone (the tabular baseline)."""
    from rl_app.cluster.resources import local_cpu_count

    yield Cluster(num_cpus=local_cpu_count(), num_gpus=0, address=None)


# What a local ``ray.init`` imports that torch imports too (stdlib modules): imported here first,
# so that while Ray starts, the two threads never import the same module (tests/test_cluster.py
# checks the two sets are otherwise disjoint).
SHARED_WITH_RAY_INIT = ("argparse", "ctypes.util", "gettext", "gzip", "pkgutil", "timeit")


def _import_in_background(modules: Sequence[str]) -> threading.Thread:
    """Import ``modules`` on a thread while a local Ray starts: starting Ray is mostly waiting for
    its processes, importing torch is mostly Python, so the two overlap.

    Only for modules outside everything ``ray.init`` imports: Python 3.11 does not make importing
    one package from two threads at once safe (a "partially initialized module" error), so RLlib,
    which shares modules with Ray's start-up, is imported after Ray is up, on the main thread.
    An import that fails here fails again, with its real error, where it is used."""
    for name in SHARED_WITH_RAY_INIT:
        importlib.import_module(name)

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # reported by the real import, where it is used
                return

    thread = threading.Thread(target=load, name="rl_app-preload", daemon=True)
    thread.start()
    return thread


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while torch, RLlib and Ray import, and what they
    made frozen after: millions of objects that live until the process exits, which every
    collection would walk again (a large part of a start, and the first collection after).
    Unfreeze with ``gc.unfreeze()`` when the session ends, so a long-lived caller (a notebook)
    collects what was garbage by then."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()


# Ray pre-starts one idle worker per core, which on a small machine competes with our own
# start-up for the CPU; env runner actors start their own.
LOCAL_SYSTEM_CONFIG = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
# Ray's GCS keeps the events of the last 100,000 tasks for the dashboard: ~+240 MB per hour of
# a run with small iterations before that cap is reached (docs/reliability.md, the soak). A
# training run needs the recent ones only; RAY_task_events_max_num_task_in_gcs still wins.
TASK_EVENTS_KEPT = 10_000


def _task_events_cap() -> dict[str, int]:
    if "RAY_task_events_max_num_task_in_gcs" in os.environ:
        return {}
    return {"task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT}


@contextmanager
def ray_session(
    address: str | None = None,
    verbose: bool = False,
    preload: Sequence[str] = (),
    token_file: str | None = None,
) -> Iterator[Cluster]:
    """Connect to ``address`` (or $RAY_ADDRESS) with the cluster's token (``token_file``, else
    found as :func:`rl_app.cluster.nodes.find_token` finds it), else start a local Ray sized to
    this machine.

    A Ray already initialised by the caller (a test fixture, a notebook) is reused
    and left running; one started here is shut down on exit, Ctrl-C included.
    ``preload`` names modules to import: torch's while a local Ray starts, the rest after.
    """
    import ray

    if not verbose:
        capture_library_logs()

    from rl_app.cluster.resources import local_gpu_count

    with _collector_paused():
        address = address or os.environ.get("RAY_ADDRESS") or None
        owned = not ray.is_initialized()
        background = [name for name in ("torch", *preload) if name.split(".")[0] == "torch"]
        preloading = _import_in_background(background) if owned and not address else None
        if owned:
            _start_or_connect(address, verbose, token_file)
        if preloading is not None:
            preloading.join()
        for name in preload:
            importlib.import_module(name)
    if not verbose:
        capture_library_logs()  # again: RLlib, imported meanwhile, brought its own console handler
    try:
        resources = ray.cluster_resources()
        num_gpus = int(resources.get("GPU", 0))
        if not address:
            num_gpus = min(num_gpus, local_gpu_count())
        yield Cluster(num_cpus=int(resources.get("CPU", 0)), num_gpus=num_gpus, address=address)
    finally:
        if owned:
            shutdown_ray(local=not address)
        gc.unfreeze()


def _start_or_connect(address: str | None, verbose: bool, token_file: str | None = None) -> None:
    import ray

    from rl_app.cluster.resources import local_cpu_count

    logging_level = logging.WARNING if verbose else logging.ERROR
    if address:
        if "://" not in address and address != "auto":
            from rl_app.cluster.nodes import check_gcs, find_token
            from rl_app.ray_adapter import enable_token_auth

            token = find_token(address, token_file)
            check_gcs(address, token)
            if token.value is not None:
                enable_token_auth(token.value)  # this process's Ray sends it from now on
        try:
            ray.init(address=address, log_to_driver=verbose, logging_level=logging_level)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"cannot connect to Ray at {address}: {first_line(exc, default='')}") from None
        return
    # GPUs are left to Ray's own detection (torch is still importing); the count ray_session
    # reports is capped at what torch can use.
    from rl_app.ray_adapter import init_local_ray

    init_local_ray(
        LOCAL_SYSTEM_CONFIG | _task_events_cap(),
        num_cpus=local_cpu_count(),
        include_dashboard=False,
        log_to_driver=verbose,
        logging_level=logging_level,
    )


def shutdown_ray(local: bool) -> None:
    """``ray.shutdown()``; for a ``local`` Ray that this process started, its autoscaler
    monitor is killed first.

    On SIGTERM the monitor reports its exit to the GCS, which ``ray.shutdown`` stops before
    it, so it hangs until Ray kills it a second later: most of every shutdown. A
    local Ray never autoscales; killing the monitor first is what Ray does after the wait.
    """
    import ray

    with _signals_held("Ray's shutdown"):
        if local:
            for process in _autoscaler_monitors():
                process.kill()
        ray.shutdown()


_STOPPING = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_held(during: str) -> Iterator[None]:
    """SIGINT and SIGTERM wait for the block to end, then raise KeyboardInterrupt: a Ctrl-C inside
    ``ray.shutdown()`` would leave Ray's processes half stopped and the driver exiting with 1."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _: received.append(signum)) for sig in _STOPPING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt(f"{signal.Signals(received[0]).name} during {during}")


def _autoscaler_monitors() -> list[Any]:
    """The autoscaler monitor(s) among this process's children: Ray starts it as
    ``python -u <ray>/autoscaler/_private/monitor.py ...``."""
    import psutil

    from rl_app.ray_adapter import autoscaler_monitor_script

    script = autoscaler_monitor_script()
    found = []
    for child in psutil.Process().children():
        try:
            if script in child.cmdline():
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
