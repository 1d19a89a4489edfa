"""What the benchmarks share: an experiment's algorithm built the way ``rl_app train`` builds it,
and where results are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]


def build_experiment_algo(experiment: str, overrides: list[str], cpus: int, gpus: int) -> Any:
    """The RLlib Algorithm for ``experiment`` with ``overrides``, resources planned for cpus/gpus."""
    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.rllib.algorithm import build_experiment

    loaded = load_experiment(experiment, overrides)
    plan = plan_resources(loaded.config, cpus, gpus)
    return build_experiment(loaded.config, plan, loaded.source)


def write_results(name: str, results: dict[str, Any], markdown: str) -> None:
    """``bench/results/NAME.json`` and ``.md``, the markdown printed too."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / name
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"wrote {out}.json and .md")


def run_worker(script: str, *arguments: str, core: int | None = None) -> dict[str, Any]:
    """``script --worker ARGUMENTS`` in a fresh process on this tree's experiments, pinned to
    ``core`` from its start when given: the JSON object its last line of output prints."""
    env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
    command = [sys.executable, script, "--worker", *arguments]
    if core is not None:  # taskset pins before Python starts, so even import-time threads stay on it
        command = ["taskset", "--cpu-list", str(core), *command]
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, env=env)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))
