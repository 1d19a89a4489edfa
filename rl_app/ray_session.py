"""Start (or join) Ray for one command, and always shut down what we started."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rl_app.errors import UserError, first_line


@dataclass(frozen=True)
class Cluster:
    num_cpus: int
    num_gpus: int
    address: str | None  # None: a local Ray started by us (or by the caller)


def quiet_libraries() -> None:
    # RLlib and Gymnasium log deprecation notices on every start; they are not for our users.
    for name in ("ray", "ray.rllib", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Ray Tune's own trial tables and banners; rl_app prints its own.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", module="gymnasium")


@contextmanager
def ray_session(address: str | None = None, verbose: bool = False) -> Iterator[Cluster]:
    """Connect to ``address`` (or $RAY_ADDRESS), else start a local Ray sized to this machine.

    A Ray already initialised by the caller (a test fixture, a notebook) is reused
    and left running; one started here is shut down on exit, Ctrl-C included.
    """
    if not verbose:
        quiet_libraries()
    import ray

    from rl_app.resources import local_cpu_count, local_gpu_count

    address = address or os.environ.get("RAY_ADDRESS") or None
    owned = not ray.is_initialized()
    if owned:
        if address:
            try:
                ray.init(
                    address=address,
                    log_to_driver=verbose,
                    logging_level=logging.WARNING if verbose else logging.ERROR,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(
                    f"cannot connect to Ray at {address}: {first_line(exc, default='')}"
                ) from None
        else:
            ray.init(
                num_cpus=local_cpu_count(),
                num_gpus=local_gpu_count(),
                include_dashboard=False,
                log_to_driver=verbose,
                logging_level=logging.WARNING if verbose else logging.ERROR,
            )
    try:
        resources = ray.cluster_resources()
        yield Cluster(
            num_cpus=int(resources.get("CPU", 0)),
            num_gpus=int(resources.get("GPU", 0)),
            address=address,
        )
    finally:
        if owned:
            ray.shutdown()
