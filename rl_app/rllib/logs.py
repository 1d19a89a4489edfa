"""Keep Ray's, Tune's and RLlib's own messages out of our output (``--verbose`` shows them)."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_libraries() -> None:
    """RLlib and Gymnasium log deprecation notices on every start; they are not for our users."""
    for name in ("ray", "ray.rllib", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Ray Tune's own trial tables and banners; rl_app prints its own.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", module="gymnasium")
