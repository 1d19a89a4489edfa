"""One Ray session per command: what it imports on which thread while Ray starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Run in a fresh interpreter: which modules an import brings in depends on what is loaded already.
CLOSURE = r"""
import json, sys
mode = sys.argv[1]
import ray
from rl_app.cluster.session import SHARED_WITH_RAY_INIT, LOCAL_SYSTEM_CONFIG
from rl_app.config import load_experiment
from rl_app.rllib.config import algorithm_build_modules
# What `rl_app train` has imported by the time it starts Ray: the experiment is loaded.
modules = algorithm_build_modules(load_experiment("ppo_cartpole").config)
for name in SHARED_WITH_RAY_INIT:
    __import__(name)
before = set(sys.modules)
if mode == "ray.init":
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _system_config=LOCAL_SYSTEM_CONFIG)
    ray.shutdown()
else:
    for name in ["torch", *modules]:
        if name.split(".")[0] == "torch":
            __import__(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def new_modules(mode: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", CLOSURE, mode], check=True, capture_output=True, text=True, timeout=300
    )
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.usefixtures("shipped")
def test_what_is_imported_while_ray_starts_shares_no_module_with_ray_init() -> None:
    """The preload thread imports torch while the main thread starts a local Ray: Python 3.11 makes
    importing one module from two threads at once unsafe (a job once failed on a "partially
    initialized module 'torch'"), so the two must import disjoint sets of modules. RLlib shares
    modules with ray.init (pydantic, ray.dashboard, ...) and is imported after Ray is up."""
    ray_init, preloaded = new_modules("ray.init"), new_modules("preload")
    assert "torch" in preloaded and len(ray_init) > 100  # both sides really imported something
    assert ray_init & preloaded == set()
