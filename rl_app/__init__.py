"""rl_app: named reinforcement-learning experiments on Ray RLlib."""

__version__ = "0.1.0"

import os as _os

# Read by Ray when it is first imported, so set before any rl_app module imports it:
# no usage reporting, and a local Ray on 127.0.0.1 instead of the host's interface address.
_os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
_os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
