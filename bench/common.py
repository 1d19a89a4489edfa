"""What the benchmarks share: an experiment's algorithm built the way ``rl_app train`` builds it,
and where results are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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
