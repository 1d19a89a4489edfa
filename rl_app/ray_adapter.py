"""Every private name of Ray's core and Tune that rl_app uses, in one file (RLlib's are in
rl_app/rllib/accel/adapter.py): an upgrade of Ray means reading these two.

Each name is looked up when first asked for; a name this Ray lacks makes its caller fall back to
Ray's public path (said where it matters), never a crash. This module imports no RLlib.
"""

from __future__ import annotations

import os
from typing import Any


def enable_token_auth(token: str) -> None:
    """Token authentication on for this process and its children, with ``token``: Ray reads
    ``RAY_AUTH_MODE`` and the token from the environment into its C++ config, which it caches, so
    that config is read again (``ray._raylet.Config.initialize``, as Ray's own
    ``_enable_token_auth`` does)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)  # RAY_AUTH_TOKEN is read first; one source only
    try:
        from ray._raylet import Config  # type: ignore[attr-defined]
    except ImportError:  # another Ray: its first use reads the environment itself
        return
    Config.initialize("")


# Run in a child process: the client retries a silent address for 40 s and its C++ side writes
# every refusal to stderr, neither of which may reach the command's console.
_PROBE = """
import sys
try:
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError
except ImportError:
    print("unknown")
    raise SystemExit
try:
    GcsClient(address=sys.argv[1])
    print("ok")
except AuthenticationError:
    print("refused")
"""


def probe_gcs(address: str, token: str | None, timeout_s: float) -> str:
    """Ask the GCS at ``address`` for its cluster id, sending ``token`` (none: no token mode)
    (``ray._raylet.GcsClient``, which ``ray start`` uses): "ok"; "refused" (the token, or its
    absence); "silent" (no answer within ``timeout_s``: something else listens there); "unknown"
    (this Ray has no such client: ``ray.init`` finds out). A refusal comes back in a second, where
    ``ray.init`` retries it for 20 s with a warning a second."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    try:
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, address],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return "silent"
    lines = result.stdout.split()
    return lines[-1] if lines and lines[-1] in ("ok", "refused", "unknown") else "silent"


def init_local_ray(system_config: dict[str, Any], **kwargs: Any) -> None:
    """``ray.init(**kwargs)`` of a local Ray with RayConfig entries (``_system_config``, which Ray
    keeps for tests; rl_app sets worker prestarting and the kept task events through it)."""
    import ray

    ray.init(_system_config=system_config, **kwargs)


def autoscaler_monitor_script() -> str:
    """The script of the autoscaler monitor a local ``ray.init`` starts as its child."""
    import ray

    return os.path.join(os.path.dirname(ray.__file__), "autoscaler", "_private", "monitor.py")


def training_result(like: Any, checkpoint: Any, metrics: dict[str, Any]) -> Any:
    """A restore target of Tune's own type (``ray.train._internal.session._TrainingResult``, which
    Tune hands ``Trainable.restore``) for another checkpoint and metrics."""
    return type(like)(checkpoint=checkpoint, metrics=metrics)
